"""TF Serving's warm-up file of an export, written and read without
`tensorflow_serving`.

`<version>/assets.extra/tf_serving_warmup_requests` (`WARMUP_FILE`) is a
TFRecord file of serialized `tensorflow.serving.PredictionLog` messages,
each a `predict_log.request`: a `PredictRequest` naming a signature
(`model_spec.signature_name`) and its inputs (a map of input name to
`TensorProto`). TF Serving runs every record once when it loads the version
(`--enable_model_warmup`, on by default), before the version takes requests,
and refuses a file of more than `MAX_RECORDS` records or one with a record
that fails; kt-serve replays it too.

The messages are encoded and decoded here by hand (protobuf's wire format:
varints and length-delimited fields), since `tensorflow-serving-api` is not a
dependency of the package; the field numbers are those of
tensorflow_serving/apis/{prediction_log,predict,model}.proto (a test checks
the bytes against the generated classes). The tensors are TensorFlow's own
`TensorProto`s. The module imports TensorFlow only inside its functions.

A warm-up request is `(signature_name, inputs)`: `signature_name` a str,
`inputs` a dict of input name -> `np.ndarray` (strings: an object array of
`bytes`; scalars: 0-d arrays), as `warmup_requests` builds them and
`read_warmup_file` returns them. Replaying one on a loaded SavedModel:

    loaded = tf.saved_model.load(version_dir)
    for name, inputs in read_warmup_file(os.path.join(version_dir, WARMUP_PATH)):
        loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
"""

import os
import re

import numpy as np

from keras_transformer.export.engine import SERVING_DEFAULT, TRANSLATE_IDS
from keras_transformer.files import atomic_path

__all__ = ["WARMUP_FILE", "WARMUP_PATH", "MAX_RECORDS", "WARMUP_SENTENCE",
           "WARMUP_SIGNATURES", "warmup_requests", "write_warmup_file", "read_warmup_file"]

# The name and place TF Serving looks for (saved_model_warmup_util.cc).
WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_PATH = os.path.join("assets.extra", WARMUP_FILE)
# TF Serving refuses a warm-up file of more records.
MAX_RECORDS = 1000
# The warm-up sentence of an export without example sentences.
WARMUP_SENTENCE = "Hello."
# The signatures an export warms up: those whose every input has a batch
# dimension, so they run under TF Serving's `--enable_batching` too, on a
# stock TF Serving binary. Left out: the signatures with scalar option
# inputs (translate_with_options, translate_nbest, translate_sample,
# translate_explain), whose record would fail under `--enable_batching`
# ("Batching Run() input tensors must have at least one dimension") and with
# it the whole version's load; and translate_xla, which fails on a server
# without `--xla_cpu_compilation_enabled=true` and compiles for seconds per
# shape bucket, of which one record would warm only one.
WARMUP_SIGNATURES = (SERVING_DEFAULT, TRANSLATE_IDS)

# The values of the scalar option inputs, by input name: the export's
# search defaults (from its metadata) and the engine's sampling defaults
# (`engine.TranslationEngine.sample`); `n` is the smallest valid.
_METADATA_OPTIONS = ("beam_size", "alpha", "extra_length")
_FIXED_OPTIONS = {"n": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}

# Field numbers of the messages written and read (tensorflow_serving/apis).
_PREDICTION_LOG_PREDICT_LOG = 6
_PREDICTION_LOG_TYPES = (2, 3, 4, 5, 6, 7)  # the `log_type` oneof's members
_PREDICT_LOG_REQUEST = 1
_REQUEST_MODEL_SPEC = 1
_REQUEST_INPUTS = 2
_MODEL_SPEC_NAME = 1
_MODEL_SPEC_SIGNATURE_NAME = 3
_MAP_KEY = 1
_MAP_VALUE = 2

_VARINT, _FIXED64, _LENGTH_DELIMITED, _START_GROUP, _END_GROUP, _FIXED32 = range(6)


def warmup_requests(signatures, metadata=None, examples=None, tokenize=None,
                    names=WARMUP_SIGNATURES):
    """The warm-up requests of an export: one per signature of `names` that
    `signatures` has, on one short sentence, with the export's options.

    Args:
        signatures: dict of signature name -> its function: a concrete
            function (a loaded SavedModel's `.signatures[name]`, or
            `get_concrete_function()`), whose `structured_input_signature`
            gives the inputs, or a `tf.function` with an `input_signature`
            (`Translator.signatures()`), read without tracing it.
        metadata: the export's `assets.extra/translator.json` dict; its
            `beam_size`, `alpha` and `extra_length` are the values of those
            scalar inputs. Needed only for a signature that has them.
        examples: the export's example sentences (list of str), or None. The
            warm-up sentence is the shortest one that is not blank; without
            one, `WARMUP_SENTENCE`.
        tokenize: a callable, sentence str -> its source token ids (ints, as
            the tokenizer gives them: no eos), for a `source_ids` input
            (`translate_ids`); None leaves out the signatures that have one.
        names: the signatures to warm up, in this order (default
            `WARMUP_SIGNATURES`; see there why the others are left out).
            A signature with scalar options gets the export's defaults, and
            `n` 1, `temperature` 1.0, `top_k` 0, `top_p` 1.0, `seed` 0, each
            in its input's dtype.

    Returns: a list of `(signature_name, inputs)`, `inputs` a dict of input
    name -> `np.ndarray` in the input's dtype: `text` `[1]` object (UTF-8
    `bytes`), `source_ids` `[1, len]`, each option a 0-d array.

    Raises: ValueError for a signature of `names` with an input it cannot
    fill (an unknown name, or an option that `metadata` lacks), or a
    function without an input signature.

    Example:

    ```python
    import tensorflow as tf

    from keras_transformer.export import warmup

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(text):
        return {"translation": text}

    (name, inputs), = warmup.warmup_requests({"serving_default": serve},
                                             examples=["A dog runs.", "Hi."])
    assert name == "serving_default" and inputs["text"].tolist() == [b"Hi."]
    ```
    """
    sentence = _warmup_sentence(examples)
    requests = []
    for name in names:
        if name not in signatures:
            continue
        specs = _input_specs(signatures[name], name)
        if any(input_name == "source_ids" for input_name in specs) and tokenize is None:
            continue
        inputs = {input_name: _input_value(name, input_name, spec, sentence, metadata,
                                           tokenize)
                  for input_name, spec in specs.items()}
        requests.append((name, inputs))
    return requests


def write_warmup_file(path, requests, model_name=""):
    """Writes `requests` to `path` as TF Serving's warm-up file: a TFRecord
    file, one serialized `PredictionLog` (`predict_log.request`) per request,
    in order. Written through a temporary name and renamed into place; the
    file gets the mode the umask gives a new file (0644 under umask 022).

    Args:
        path: the file to write (in an export: `<version>/WARMUP_PATH`).
        requests: a list of at most `MAX_RECORDS` `(signature_name, inputs)`:
            `signature_name` a non-empty str, `inputs` a dict of input name
            (non-empty str) -> array-like (`np.ndarray`; strings as `bytes`
            or `str`), each written as `tf.make_tensor_proto(value)`.
        model_name: `model_spec.name` of every request ("" leaves it out; TF
            Serving's warm-up does not read it).

    Returns: `path`.

    Raises: ValueError for more than `MAX_RECORDS` requests or an empty
    signature or input name.

    Example:

    ```python
    import os
    import tempfile

    import numpy as np

    from keras_transformer.export import warmup

    path = os.path.join(tempfile.mkdtemp(), warmup.WARMUP_FILE)
    warmup.write_warmup_file(path, [("serving_default",
                                     {"text": np.array([b"Hello."], object)})],
                             model_name="demo")
    (name, inputs), = warmup.read_warmup_file(path)
    assert name == "serving_default" and inputs["text"].tolist() == [b"Hello."]
    ```
    """
    import tensorflow as tf

    records = _encode_records(requests, model_name, tf.make_tensor_proto)
    path = os.fspath(path)
    with atomic_path(path) as tmp:
        with tf.io.TFRecordWriter(tmp) as writer:
            for record in records:
                writer.write(record)
    return path


def read_warmup_file(path):
    """The predict requests of a warm-up file, as TF Serving reads it.

    Records of another log type (classify, regress, ...) are skipped; so are
    fields a request may have beside its model spec and inputs
    (`output_filter`, a logged response). An empty `signature_name` is read
    as `serving_default`, as TF Serving reads it.

    Args:
        path: a TFRecord file of serialized `tensorflow.serving.PredictionLog`
            messages (`<version>/WARMUP_PATH`).

    Returns: a list of `(signature_name, inputs)` in file order:
    `signature_name` a str, `inputs` a dict of input name -> `np.ndarray`
    (`tf.make_ndarray` of its `TensorProto`: strings as an object array of
    `bytes`, scalars as 0-d arrays).

    Raises: FileNotFoundError if there is no file at `path`; ValueError
    naming `path` and the record (numbered from 0) for a record that is not
    TFRecord framing, not a `PredictionLog`, or holds a tensor that is not
    a valid `TensorProto`, and for a file of more than `MAX_RECORDS`
    records (TF Serving refuses it).

    Example:

    ```python
    import os
    import tempfile

    import numpy as np

    from keras_transformer.export import warmup

    path = os.path.join(tempfile.mkdtemp(), warmup.WARMUP_FILE)
    warmup.write_warmup_file(path, [
        ("translate_ids", {"source_ids": np.array([[7, 8, 9]], np.int32)}),
        ("translate_with_options", {"text": np.array([b"Hi."], object),
                                    "beam_size": np.array(4, np.int32)})])
    requests = warmup.read_warmup_file(path)
    assert [name for name, _ in requests] == ["translate_ids", "translate_with_options"]
    assert requests[0][1]["source_ids"].dtype == np.int32
    assert requests[1][1]["beam_size"].shape == ()
    ```
    """
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2

    path = os.fspath(path)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"No warm-up file at {path}.")
    records = iter(tf.data.TFRecordDataset(path))
    requests = []
    index = 0
    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except tf.errors.DataLossError as e:
            # TensorFlow's message without the op and function names around it.
            reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", e.message, flags=re.S)
            raise ValueError(f"{path}: record {index} is not a TFRecord record "
                             f"({reason}).") from None
        if index >= MAX_RECORDS:
            raise ValueError(f"{path}: more than {MAX_RECORDS} records; TF Serving "
                             "refuses such a warm-up file.")
        try:
            request = _decode_record(record.numpy(), tensor_pb2.TensorProto.FromString,
                                     tf.make_ndarray)
        except Exception as e:  # protobuf's and numpy's errors alike
            raise ValueError(f"{path}: record {index} is not a PredictionLog: {e}") from None
        if request is not None:
            requests.append(request)
        index += 1
    return requests


# Building the requests -----------------------------------------------------

def _warmup_sentence(examples):
    """The shortest non-blank example sentence, else `WARMUP_SENTENCE`."""
    candidates = [str(e).strip() for e in examples or () if str(e).strip()]
    return min(candidates, key=len) if candidates else WARMUP_SENTENCE


def _input_specs(function, name):
    """`{input name: tf.TensorSpec}` of a signature function (see
    `warmup_requests`)."""
    structured = getattr(function, "structured_input_signature", None)
    if structured is not None:
        args, kwargs = structured
        return {**{spec.name: spec for spec in args}, **kwargs}
    specs = getattr(function, "input_signature", None)
    if specs is None:
        raise ValueError(f"The {name} function has no input signature.")
    # A spec without a name takes its argument's, as in a saved signature.
    arguments = list(function.function_type.parameters)
    return {spec.name or argument: spec for argument, spec in zip(arguments, specs)}


def _input_value(signature, name, spec, sentence, metadata, tokenize):
    """The warm-up value of input `name` (`spec`) of `signature`."""
    dtype = spec.dtype.as_numpy_dtype
    if name == "text":
        return np.array([sentence.encode("utf-8")], object)
    if name == "source_ids":
        return np.array([list(tokenize(sentence))], dtype)
    if spec.shape.rank == 0 and name in _FIXED_OPTIONS:
        return np.array(_FIXED_OPTIONS[name], dtype)
    if spec.shape.rank == 0 and name in _METADATA_OPTIONS:
        if not metadata or name not in metadata:
            raise ValueError(f"The {signature} signature's {name} input takes the export's "
                             "default, which the metadata given lacks.")
        return np.array(metadata[name], dtype)
    raise ValueError(f"No warm-up value for the {signature} signature's input {name} "
                     f"({spec}).")


# The wire format -----------------------------------------------------------

def _varint(value):
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _field(number, payload):
    """A length-delimited field (a string, bytes or a message)."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _encode_records(requests, model_name, make_tensor_proto):
    """The serialized `PredictionLog` of each request (fields in number
    order, map entries by key, as protobuf's deterministic serialization)."""
    requests = list(requests)
    if len(requests) > MAX_RECORDS:
        raise ValueError(f"{len(requests)} warm-up requests: TF Serving reads at most "
                         f"{MAX_RECORDS}.")
    records = []
    for signature_name, inputs in requests:
        if not isinstance(signature_name, str) or not signature_name:
            raise ValueError(f"A signature name must be a non-empty str, received "
                             f"{signature_name!r}.")
        spec = b""
        if model_name:
            spec += _field(_MODEL_SPEC_NAME, model_name.encode("utf-8"))
        spec += _field(_MODEL_SPEC_SIGNATURE_NAME, signature_name.encode("utf-8"))
        request = _field(_REQUEST_MODEL_SPEC, spec)
        for name in sorted(inputs):
            if not isinstance(name, str) or not name:
                raise ValueError(f"An input name must be a non-empty str, received "
                                 f"{name!r} ({signature_name}).")
            tensor = make_tensor_proto(inputs[name]).SerializeToString()
            entry = _field(_MAP_KEY, name.encode("utf-8")) + _field(_MAP_VALUE, tensor)
            request += _field(_REQUEST_INPUTS, entry)
        log = _field(_PREDICT_LOG_REQUEST, request)
        records.append(_field(_PREDICTION_LOG_PREDICT_LOG, log))
    return records


def _read_varint(data, position):
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise ValueError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")


def _fields(data):
    """`(field number, wire type, value)` of each field of a message, in
    order: a varint's value an int, a length-delimited field's its bytes,
    fixed-width fields and groups None (skipped)."""
    position = 0
    while position < len(data):
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == _VARINT:
            value, position = _read_varint(data, position)
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(data, position)
            if position + length > len(data):
                raise ValueError(f"field {number} runs past the end of its message")
            value, position = data[position:position + length], position + length
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
            if position > len(data):
                raise ValueError(f"field {number} runs past the end of its message")
            value = None
        elif wire_type == _START_GROUP:
            position = _skip_group(data, position, number)
            value = None
        else:
            raise ValueError(f"field {number} has wire type {wire_type}")
        yield number, wire_type, value


def _skip_group(data, position, number):
    """The position after the end of group `number` that starts at
    `position` (a deprecated encoding, skipped as an unknown field)."""
    while True:
        if position >= len(data):
            raise ValueError(f"group {number} has no end")
        key, position = _read_varint(data, position)
        inner, wire_type = key >> 3, key & 7
        if wire_type == _END_GROUP:
            if inner != number:
                raise ValueError(f"group {number} ends as group {inner}")
            return position
        if wire_type == _VARINT:
            _, position = _read_varint(data, position)
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(data, position)
            position += length
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
        elif wire_type == _START_GROUP:
            position = _skip_group(data, position, inner)
        else:
            raise ValueError(f"field {inner} has wire type {wire_type}")
        if position > len(data):
            raise ValueError(f"group {number} runs past the end of its message")


def _message(data, number):
    """The bytes of embedded message `number` of `data`: its occurrences
    concatenated, which protobuf parses as their merge (b"" if absent)."""
    parts = []
    for field, wire_type, value in _fields(data):
        if field == number:
            if wire_type != _LENGTH_DELIMITED:
                raise ValueError(f"field {number} is not a message")
            parts.append(value)
    return b"".join(parts)


def _decode_record(record, parse_tensor, make_ndarray):
    """One serialized `PredictionLog` -> `(signature_name, inputs)`, or None
    if its log is not a predict log."""
    log_type, predict_log = None, []
    for number, wire_type, value in _fields(record):
        if number not in _PREDICTION_LOG_TYPES:
            continue
        if wire_type != _LENGTH_DELIMITED:
            raise ValueError(f"PredictionLog field {number} is not a message")
        if number != log_type:
            predict_log = []  # another member of the oneof replaces the log
        log_type = number
        if number == _PREDICTION_LOG_PREDICT_LOG:
            predict_log.append(value)
    if log_type != _PREDICTION_LOG_PREDICT_LOG:
        return None
    request = _message(b"".join(predict_log), _PREDICT_LOG_REQUEST)
    signature_name = ""
    for number, wire_type, value in _fields(_message(request, _REQUEST_MODEL_SPEC)):
        if number == _MODEL_SPEC_SIGNATURE_NAME:
            if wire_type != _LENGTH_DELIMITED:
                raise ValueError("ModelSpec.signature_name is not a string")
            signature_name = value.decode("utf-8")
    tensors = {}
    for number, wire_type, value in _fields(request):
        if number != _REQUEST_INPUTS:
            continue
        if wire_type != _LENGTH_DELIMITED:
            raise ValueError("PredictRequest.inputs is not a map entry")
        key, tensor = "", []
        for field, field_type, part in _fields(value):
            if field_type != _LENGTH_DELIMITED and field in (_MAP_KEY, _MAP_VALUE):
                raise ValueError("a PredictRequest.inputs entry has a field of the wrong type")
            if field == _MAP_KEY:
                key = part.decode("utf-8")
            elif field == _MAP_VALUE:
                tensor.append(part)
        tensors[key] = b"".join(tensor)  # a later entry of one key replaces it
    inputs = {}
    for key, tensor in tensors.items():
        try:
            inputs[key] = make_ndarray(parse_tensor(tensor))
        except Exception as e:  # protobuf's and numpy's errors alike
            raise ValueError(f"input {key!r} is not a valid TensorProto ({e})") from None
    return signature_name or SERVING_DEFAULT, inputs
