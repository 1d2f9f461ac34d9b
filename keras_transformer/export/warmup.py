"""TF Serving's warm-up file of an export, written and read with TF
Serving's protos (`tensorflow-serving-api`).

`<version>/assets.extra/tf_serving_warmup_requests` (`WARMUP_FILE`) is a
TFRecord file of serialized `tensorflow.serving.PredictionLog` messages,
each a `predict_log.request`: a `PredictRequest` naming a signature
(`model_spec.signature_name`) and its inputs (a map of input name to
`TensorProto`). TF Serving runs every record once when it loads the version
(`--enable_model_warmup`, on by default), before the version takes requests,
and refuses a file of more than `MAX_RECORDS` records or one with a record
that fails; kt-serve replays it too.

The records are `tensorflow_serving.apis.prediction_log_pb2` messages in
protobuf's deterministic serialization (map entries by key), framed by
TensorFlow's TFRecord writer and reader; the tensors are TensorFlow's own
`TensorProto`s. The module imports TensorFlow and the protos only inside its
functions.

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

    records = _encode_records(requests, model_name)
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

    prediction_log_pb2 = _prediction_log_pb2()
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
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        except Exception as e:  # protobuf's DecodeError, or another of its parsers'
            raise ValueError(f"{path}: record {index} is not a PredictionLog: {e}") from None
        if log.WhichOneof("log_type") == "predict_log":
            requests.append(_request(log.predict_log.request, f"{path}: record {index}"))
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


# The protos ----------------------------------------------------------------

def _prediction_log_pb2():
    """`tensorflow_serving.apis.prediction_log_pb2`, or an ImportError
    naming the package that has it."""
    try:
        from tensorflow_serving.apis import prediction_log_pb2
    except ImportError:
        raise ImportError("TF Serving's warm-up file needs TF Serving's protos: pip install "
                          "tensorflow-serving-api (a dependency of "
                          "attention-transformer-keras)") from None
    return prediction_log_pb2


def _encode_records(requests, model_name):
    """The serialized `PredictionLog` of each request, deterministic (map
    entries by key), so an export's file is the same bytes each time."""
    import tensorflow as tf

    prediction_log_pb2 = _prediction_log_pb2()
    requests = list(requests)
    if len(requests) > MAX_RECORDS:
        raise ValueError(f"{len(requests)} warm-up requests: TF Serving reads at most "
                         f"{MAX_RECORDS}.")
    records = []
    for signature_name, inputs in requests:
        if not isinstance(signature_name, str) or not signature_name:
            raise ValueError(f"A signature name must be a non-empty str, received "
                             f"{signature_name!r}.")
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature_name
        for name, value in inputs.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"An input name must be a non-empty str, received "
                                 f"{name!r} ({signature_name}).")
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        records.append(log.SerializeToString(deterministic=True))
    return records


def _request(request, where):
    """A `PredictRequest` -> `(signature_name, inputs)`; `where` names the
    record in the ValueError of a tensor that is not a valid TensorProto."""
    import tensorflow as tf

    inputs = {}
    for key in sorted(request.inputs):
        try:
            inputs[key] = tf.make_ndarray(request.inputs[key])
        except Exception as e:  # numpy's and TensorFlow's errors alike
            raise ValueError(f"{where} holds input {key!r}, which is not a valid "
                             f"TensorProto ({e}).") from None
    return request.model_spec.signature_name or SERVING_DEFAULT, inputs
