"""TF Serving's REST predict format: JSON request bodies to arrays, arrays to
JSON responses, and the status and metadata bodies. No TensorFlow here:
signatures are described by `TensorSpec`s of dtype names and shapes.

Request (`POST /v1/models/<name>[/versions/<v>]:predict`)::

    {"signature_name": "serving_default",          # optional
     "instances": [...]}                            # row format, or
     "inputs": <value> | {"<input>": <value>, ...}} # columnar format

- Row format: `instances` lists one instance per batch row; with one input,
  an instance is that input's value (or an object naming it); with several,
  an object with every input. Instances are stacked along a new first axis,
  so every input must have a batch axis (a scalar input such as `beam_size`
  needs the columnar format).
- Columnar format: each input's whole value (a JSON scalar for a scalar
  input).
- A string is UTF-8 text, or `{"b64": "<base64>"}` for arbitrary bytes.
  Integers must be JSON integers; floats accept any JSON number.

Response: row format -> `{"predictions": [...]}` (one output: its rows;
several: one object per row); columnar -> `{"outputs": <value>}` (one
output) or `{"outputs": {"<output>": <value>, ...}}`. Strings come back as
UTF-8 text (bytes that are not UTF-8 as U+FFFD), except outputs whose name
ends in `_bytes`, which come back as `{"b64": ...}` (TF Serving's rule).
float32 values are written with the fewest digits that read back as the
same float32; NaN and infinities as `NaN`, `Infinity`, `-Infinity` (as TF
Serving writes them).

Every problem with a request raises `RestError` with an HTTP status and a
message for TF Serving's error body `{"error": "<message>"}`.
"""

import base64
import binascii
import collections
import json
import math

import numpy as np

from keras_transformer.export.engine import SERVING_DEFAULT

DEFAULT_SIGNATURE = SERVING_DEFAULT
PREDICT_METHOD = "tensorflow/serving/predict"

# A tensor's description: `dtype` a NumPy dtype name ("string" for
# tf.string), `shape` a tuple of ints and None (unknown length).
TensorSpec = collections.namedtuple("TensorSpec", ["dtype", "shape"])
# A signature's inputs and outputs: `{name: TensorSpec}` each.
SignatureSpec = collections.namedtuple("SignatureSpec", ["inputs", "outputs"])

_INTEGER_RANGES = {name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
                   for name in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                "uint32", "uint64")}
_FLOATS = ("float16", "float32", "float64")
# TF Serving's DataType names, for errors and metadata.
_TF_NAMES = {"string": "DT_STRING", "bool": "DT_BOOL", "float16": "DT_HALF",
             "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "bfloat16": "DT_BFLOAT16",
             **{name: "DT_" + name.upper() for name in _INTEGER_RANGES}}


def tf_type_name(dtype):
    """TF Serving's DataType name ("DT_STRING") of a `TensorSpec` dtype."""
    return _TF_NAMES.get(dtype, dtype)


class RestError(Exception):
    """A request the server refuses: `status` (an HTTP status code) and
    `message` (the `error` of the JSON body)."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.message = message
        self.status = status


PredictRequest = collections.namedtuple(
    "PredictRequest", ["signature_name", "row_format", "inputs"])
PredictRequest.__doc__ = """A parsed predict request: `signature_name`
(str), `row_format` (True for "instances", False for "inputs"), `inputs`
(`{name: np.ndarray}`; strings as object arrays of `bytes`)."""


def decode_body(body):
    """The JSON object of a request body (`bytes`).

    Raises: `RestError` (400) for bytes that are not UTF-8, text that is
    not JSON, or JSON that is not an object.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RestError(f"The request body is not valid UTF-8: byte 0x{body[e.start]:02x} at "
                        f"offset {e.start} ({e.reason}).") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise RestError(f"JSON Parse error: {e.msg} at line {e.lineno} column {e.colno} "
                        f"(offset {e.pos}).") from None
    except RecursionError:
        raise RestError("JSON Parse error: the document is nested too deeply.") from None
    except ValueError as e:  # e.g. an integer of more digits than Python reads
        raise RestError(f"JSON Parse error: {e}") from None
    if not isinstance(document, dict):
        raise RestError(f"The request body must be a JSON object, received "
                        f"{_json_type(document)} {_snippet(document)}.")
    return document


def parse_predict_request(document, signatures, max_rows=None):
    """The `PredictRequest` a decoded JSON body asks for.

    Args:
        document: the body's JSON object (`decode_body`).
        signatures: `{signature name: SignatureSpec}` of the servable.
        max_rows: the most rows (sentences) a request may hold, checked
            from the JSON lists' lengths before any array is built (None:
            no limit).

    Raises: `RestError` (400) naming what is wrong and where: an unknown
    signature, both or neither of "instances" and "inputs", missing or
    extra input names, a value of the wrong JSON type, shape or range,
    instances of different shapes, a scalar input in the row format, more
    than `max_rows` rows.
    """
    name = document.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise RestError(f"'signature_name' must be a string, received {_snippet(name)}.")
    if name == "":
        name = DEFAULT_SIGNATURE
    if name not in signatures:
        raise RestError(f"Serving signature name: \"{name}\" not found in signature def "
                        f"(signatures: {', '.join(sorted(signatures))}).")
    specs = signatures[name].inputs
    has_instances, has_inputs = "instances" in document, "inputs" in document
    if has_instances and has_inputs:
        raise RestError("The request has both 'instances' (row format) and 'inputs' "
                        "(columnar format): send exactly one of them.")
    if not (has_instances or has_inputs):
        raise RestError("Missing 'inputs' or 'instances' key: send the inputs as "
                        "{\"instances\": [...]} (row format) or {\"inputs\": {...}} "
                        "(columnar format).")
    if has_instances:
        inputs = _row_inputs(document["instances"], specs, name, max_rows)
    else:
        inputs = _columnar_inputs(document["inputs"], specs, name, max_rows)
    return PredictRequest(name, has_instances, inputs)


def _check_names(given, specs, signature, where):
    missing = sorted(set(specs) - set(given))
    extra = sorted(set(given) - set(specs))
    if missing or extra:
        raise RestError(
            f"{where} does not match the inputs of signature '{signature}' "
            f"({', '.join(sorted(specs))}): "
            + "; ".join(part for part in (
                f"missing but required: {', '.join(missing)}" if missing else "",
                f"sent extra: {', '.join(extra)}" if extra else "") if part) + ".")


def check_rows(rows, max_rows):
    """Refuses (400) `rows` sentences over `max_rows` (None: no limit)."""
    if max_rows is not None and rows > max_rows:
        raise RestError(f"The request holds {rows} sentences, more than "
                        f"--max-request-sentences ({max_rows}); send them in several "
                        "requests.")


def _columnar_inputs(value, specs, signature, max_rows):
    if isinstance(value, dict) and not _is_b64(value):
        _check_names(value, specs, signature, "'inputs'")
        for name, spec in specs.items():
            if spec.shape and isinstance(value[name], list):
                check_rows(len(value[name]), max_rows)
        return {name: to_array(value[name], specs[name], f"input '{name}'")
                for name in specs}
    if len(specs) != 1:
        raise RestError(
            f"'inputs' must be an object naming the inputs of signature '{signature}' "
            f"({', '.join(sorted(specs))}), received {_json_type(value)} {_snippet(value)}.")
    (name, spec), = specs.items()
    if spec.shape and isinstance(value, list):
        check_rows(len(value), max_rows)
    return {name: to_array(value, spec, f"input '{name}'")}


def _row_inputs(instances, specs, signature, max_rows):
    scalars = sorted(name for name, spec in specs.items() if len(spec.shape) == 0)
    if scalars:
        raise RestError(
            f"Signature '{signature}' has scalar inputs ({', '.join(scalars)}), which the row "
            "format ('instances') cannot carry: every instance is one batch row. Send the "
            "request in the columnar format: {\"inputs\": {"
            + ", ".join(f"\"{n}\": ..." for n in sorted(specs)) + "}}.")
    if not isinstance(instances, list):
        raise RestError(f"'instances' must be a list (one item per batch row), received "
                        f"{_json_type(instances)} {_snippet(instances)}.")
    check_rows(len(instances), max_rows)
    rows = {name: [] for name in specs}
    for i, instance in enumerate(instances):
        if isinstance(instance, dict) and not _is_b64(instance):
            _check_names(instance, specs, signature, f"instance {i}")
            named = instance
        elif len(specs) == 1:
            named = {next(iter(specs)): instance}
        else:
            raise RestError(
                f"instance {i} must be an object naming the inputs of signature "
                f"'{signature}' ({', '.join(sorted(specs))}), received "
                f"{_json_type(instance)} {_snippet(instance)}.")
        for name, spec in specs.items():
            rows[name].append(to_array(named[name], TensorSpec(spec.dtype, spec.shape[1:]),
                                       f"instance {i}, input '{name}'"))
    inputs = {}
    for name, spec in specs.items():
        arrays = rows[name]
        if not arrays:
            inner = tuple(0 if d is None else d for d in spec.shape[1:])
            inputs[name] = np.empty((0,) + inner, _numpy_dtype(spec.dtype))
            continue
        first = arrays[0].shape
        for i, array in enumerate(arrays):
            if array.shape != first:
                raise RestError(
                    f"All instances must have the same shape: input '{name}' has shape "
                    f"{list(first)} in instance 0 and {list(array.shape)} in instance {i}.")
        inputs[name] = np.stack(arrays)
    return inputs


def to_array(value, spec, where):
    """`value` (JSON) as an array of `spec`'s dtype and a shape `spec` allows.

    Args:
        value: a JSON scalar or (nested) list; strings may be b64 objects.
        spec: a `TensorSpec`.
        where: names the value in errors, e.g. "input 'text'".

    Returns: an `np.ndarray` (strings: an object array of `bytes`).
    """
    shape = []
    node = value
    while isinstance(node, list):
        shape.append(len(node))
        if not node:
            break
        node = node[0]
    if len(shape) != len(spec.shape):
        raise RestError(
            f"{where}: expected a value of rank {len(spec.shape)} (shape "
            f"{_shape_text(spec.shape)}), received one of rank {len(shape)} "
            f"({_json_type(value)} {_snippet(value)}).")
    for axis, (got, want) in enumerate(zip(shape, spec.shape)):
        if want is not None and got != want:
            raise RestError(f"{where}: expected {want} values along axis {axis} (shape "
                            f"{_shape_text(spec.shape)}), received {got}.")
    flat = []
    _flatten(value, 0, shape, flat, where)
    convert = _converter(spec.dtype, where)
    values = [convert(v) for v in flat]
    if spec.dtype == "string":
        array = np.empty(len(values), object)
        array[:] = values
        return array.reshape(shape)
    return np.array(values, _numpy_dtype(spec.dtype)).reshape(shape)


def _flatten(value, level, shape, out, where):
    if level == len(shape):
        if isinstance(value, list):
            raise RestError(f"{where}: a list found where a value was expected, nested "
                            f"deeper than the other values (shape {list(shape)}).")
        out.append(value)
        return
    if not isinstance(value, list):
        raise RestError(f"{where}: {_json_type(value)} {_snippet(value)} found at nesting "
                        f"level {level} where a list was expected (shape {list(shape)}); "
                        "the lists must be rectangular.")
    if len(value) != shape[level]:
        raise RestError(f"{where}: a list of {len(value)} values at nesting level {level} "
                        f"where the first had {shape[level]}; the lists must be rectangular.")
    for item in value:
        _flatten(item, level + 1, shape, out, where)


def _converter(dtype, where):
    """A function from one JSON scalar to a Python value of `dtype` that
    raises `RestError` for the wrong JSON type or an out-of-range value."""
    def wrong(v):
        raise RestError(f"{where}: JSON value {_snippet(v)} ({_json_type(v)}) is not of the "
                        f"expected type {dtype} ({tf_type_name(dtype)}).")

    if dtype == "string":
        def convert(v):
            if isinstance(v, str):
                try:
                    return v.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise RestError(
                        f"{where}: {_snippet(v)} holds a lone surrogate ({e.object[e.start]!a}"
                        "), which is not Unicode text; send bytes as {\"b64\": ...}.") from None
            if _is_b64(v):
                try:
                    return base64.b64decode(v["b64"], validate=True)
                except (binascii.Error, ValueError):
                    raise RestError(f"{where}: {_snippet(v)} is not valid base64.") from None
            if isinstance(v, dict):
                raise RestError(f"{where}: JSON object {_snippet(v)} is not formatted "
                                "correctly for base64 data: expected {\"b64\": \"<base64>\"}.")
            return wrong(v)
    elif dtype == "bool":
        def convert(v):
            return v if isinstance(v, bool) else wrong(v)
    elif dtype in _INTEGER_RANGES:
        low, high = _INTEGER_RANGES[dtype]

        def convert(v):
            if not isinstance(v, int) or isinstance(v, bool):
                return wrong(v)
            if not low <= v <= high:
                raise RestError(f"{where}: {v} is out of the range of {dtype} "
                                f"[{low}, {high}].")
            return v
    elif dtype in _FLOATS:
        largest = float(np.finfo(dtype).max)

        def convert(v):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return wrong(v)
            if isinstance(v, float) and not math.isfinite(v):
                return v  # NaN and infinities, as sent
            try:
                value = float(v)
            except OverflowError:  # an integer past any float
                value = math.inf
            if abs(value) <= largest:
                return value
            raise RestError(f"{where}: {_snippet(v)} cannot be converted to {dtype} without "
                            "loss of precision (it is out of its range).")
    else:
        def convert(v):
            raise RestError(f"{where}: kt-serve cannot convert JSON to {dtype}.")
    return convert


def _numpy_dtype(dtype):
    return object if dtype == "string" else np.dtype(dtype)


def _is_b64(value):
    return (isinstance(value, dict) and len(value) == 1
            and isinstance(value.get("b64"), str))


def predict_response(outputs, row_format):
    """The JSON object answering a predict request.

    Args:
        outputs: `{name: np.ndarray}` of the signature's outputs.
        row_format: True for "instances" requests.

    Returns: `{"predictions": [...]}` or `{"outputs": ...}`.

    Raises: `RestError` (400) in the row format if an output has no batch
    axis or the outputs' batch sizes differ.
    """
    names = sorted(outputs)
    values = {name: _to_json(outputs[name], name.endswith("_bytes")) for name in names}
    if not row_format:
        return {"outputs": values[names[0]] if len(names) == 1 else values}
    sizes = {name: np.shape(outputs[name])[0] if np.ndim(outputs[name]) else None
             for name in names}
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise RestError(
            "The signature's outputs cannot be written in the row format ('predictions'): "
            "they need one batch size, they have "
            + ", ".join(f"{n}: {'scalar' if s is None else s}" for n, s in sizes.items())
            + ". Send the request with 'inputs' (columnar format).")
    if len(names) == 1:
        return {"predictions": values[names[0]]}
    size = sizes[names[0]]
    return {"predictions": [{name: values[name][i] for name in names} for i in range(size)]}


def _to_json(array, as_b64=False):
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "SU":
        def text(v):
            if isinstance(v, str):
                v = v.encode("utf-8")
            if as_b64:
                return {"b64": base64.b64encode(v).decode("ascii")}
            return v.decode("utf-8", "replace")
        nested = np.empty(array.size, object)
        nested[:] = [text(v) for v in array.ravel().tolist()]
        return nested.reshape(array.shape).tolist()
    if array.dtype in (np.float32, np.float16):
        # The shortest decimal that reads back as the same float32.
        shortest = [float(str(v)) for v in array.ravel()]
        return np.array(shortest, np.float64).reshape(array.shape).tolist()
    return array.tolist()


def dumps(document):
    """A JSON body as bytes: UTF-8, NaN and infinities as TF Serving writes
    them."""
    # A lone surrogate (echoed from a request in an error) becomes the JSON
    # escape \\udXXX, which is valid JSON, instead of failing to encode.
    return json.dumps(document, ensure_ascii=False, allow_nan=True).encode(
        "utf-8", "backslashreplace")


def model_status(entries):
    """TF Serving's model status body.

    Args:
        entries: `(version, state, error_message)` tuples; `state` one of
            "START", "LOADING", "AVAILABLE", "UNLOADING", "END";
            `error_message` "" when the version is fine.
    """
    return {"model_version_status": [
        {"version": str(version), "state": state,
         "status": {"error_code": "UNKNOWN" if error else "OK", "error_message": error}}
        for version, state, error in entries]}


def model_metadata(name, version, signatures):
    """TF Serving's metadata body for `version` of model `name`, describing
    `signatures` (`{name: SignatureSpec}`): each input's and output's
    dtype (DT_STRING, DT_FLOAT, ...), shape (-1 for an unknown length) and
    name, as TF Serving nests them (`metadata.signature_def.signature_def`).
    """
    def tensor(tensor_name, spec):
        return {"dtype": tf_type_name(spec.dtype),
                "tensor_shape": {"dim": [{"size": str(-1 if d is None else d), "name": ""}
                                         for d in spec.shape],
                                 "unknown_rank": False},
                "name": tensor_name}

    definitions = {
        signature: {"inputs": {n: tensor(n, s) for n, s in sorted(spec.inputs.items())},
                    "outputs": {n: tensor(n, s) for n, s in sorted(spec.outputs.items())},
                    "method_name": PREDICT_METHOD}
        for signature, spec in sorted(signatures.items())}
    return {"model_spec": {"name": name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": {"signature_def": definitions}}}


def _shape_text(shape):
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number" if not isinstance(value, float) or math.isfinite(value) else "NaN"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _snippet(value, limit=80):
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError):
        return "(a value nested too deeply to show)"
    return text if len(text) <= limit else text[:limit - 3] + "..."
