"""TF Serving's warm-up file of an export (`export/warmup.py`): kt-export
writes it, TF Serving's own protos read it as written, the package's
reader reads what those protos write, every record runs on the
SavedModel, and a malformed file is refused naming the file and record."""

import os
import re
import stat

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SentencePiece ops of the export)

from keras_transformer.export import warmup
from keras_transformer.export.engine import SIGNATURES, TRANSLATE_XLA
from keras_transformer.export.saved_model import read_metadata
from support.serving_model import export_tiny_model

NAME = "tiny"
EXAMPLES = ["the dog sees a cat near the house", "a red house", "   "]
DATA = os.path.join(os.path.dirname(__file__), "support", "data")
# The requests of the files `warmup_requests_{named,unnamed}.tfrecord` in
# DATA, written by the package's earlier hand-made protobuf encoder with
# model_name NAME and "": the warm-up files of exports stay the same bytes.
FROZEN_REQUESTS = [
    ("serving_default", {"text": np.array([b"a red house"], object)}),
    ("translate_ids", {"source_ids": np.array([[5, 6, 7]], np.int32)}),
    ("translate_sample", {"text": np.array(["ein Hund".encode(), "caf\u00e9".encode()], object),
                          "temperature": np.array(0.5, np.float32),
                          "top_k": np.array(3, np.int32),
                          "seed": np.array(2**40, np.int64),
                          "n": np.array(1, np.int32)}),
]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("warmup"), name=NAME, examples=EXAMPLES)


@pytest.fixture(scope="module")
def loaded(export):
    return tf.saved_model.load(export)


def input_specs(function):
    """A loaded signature's `{input name: TensorSpec}`."""
    args, kwargs = function.structured_input_signature
    assert args == ()
    return kwargs


def proto_logs(path):
    from tensorflow_serving.apis import prediction_log_pb2

    return [prediction_log_pb2.PredictionLog.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(path)]


def proto_requests(path):
    """`(signature_name, inputs)` of each predict log, read with TF
    Serving's protos."""
    return [(log.predict_log.request.model_spec.signature_name or "serving_default",
             {name: tf.make_ndarray(tensor)
              for name, tensor in log.predict_log.request.inputs.items()})
            for log in proto_logs(path) if log.WhichOneof("log_type") == "predict_log"]


def assert_same_requests(got, expected):
    assert [name for name, _ in got] == [name for name, _ in expected]
    for (_, inputs), (_, reference) in zip(got, expected):
        assert sorted(inputs) == sorted(reference)
        for key, value in reference.items():
            assert inputs[key].dtype == value.dtype, key
            assert inputs[key].shape == value.shape, key
            np.testing.assert_array_equal(inputs[key], value)


def test_tf_serving_reads_the_export_s_warmup_file(export, loaded):
    logs = proto_logs(os.path.join(export, warmup.WARMUP_PATH))
    assert [log.predict_log.request.model_spec.signature_name for log in logs] == list(
        warmup.WARMUP_SIGNATURES)
    for log in logs:
        request = log.predict_log.request
        assert request.model_spec.name == NAME
        specs = input_specs(loaded.signatures[request.model_spec.signature_name])
        assert sorted(request.inputs) == sorted(specs)
        for name, tensor in request.inputs.items():
            value = tf.make_ndarray(tensor)
            assert tf.as_dtype(tensor.dtype) == specs[name].dtype, name
            assert specs[name].shape.is_compatible_with(value.shape), name
    # The warm-up sentence: the shortest non-blank example.
    text = tf.make_ndarray(logs[0].predict_log.request.inputs["text"])
    assert text.tolist() == [b"a red house"]


def test_the_reader_reads_what_tf_serving_s_protos_write(tmp_path):
    from google.protobuf import wrappers_pb2
    from tensorflow_serving.apis import (
        classification_pb2,
        model_pb2,
        predict_pb2,
        prediction_log_pb2,
    )

    def predict_log(signature_name, inputs, **spec):
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=NAME, signature_name=signature_name, **spec))
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        return prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request))

    logs = [
        predict_log("translate_sample", {
            "text": np.array(["ein Hund".encode(), "caf\u00e9".encode()], object),
            "temperature": np.array(0.5, np.float32), "top_k": np.array(3, np.int32),
            "seed": np.array(2**40, np.int64)}, version=wrappers_pb2.Int64Value(value=7)),
        # Not a predict log: skipped.
        prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(
            request=classification_pb2.ClassificationRequest(
                model_spec=model_pb2.ModelSpec(name=NAME)))),
        # No signature name: serving_default, as TF Serving reads it.
        predict_log("", {"text": np.array([b"a"], object)}, version_label="stable"),
        predict_log("translate_ids", {"source_ids": np.array([[5, 6, 0], [7, 0, 0]],
                                                              np.int32)}),
    ]
    logs[-1].predict_log.request.output_filter.append("score")
    logs[-1].predict_log.response.outputs["score"].CopyFrom(
        tf.make_tensor_proto(np.zeros([2], np.float32)))
    path = str(tmp_path / warmup.WARMUP_FILE)
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    got = warmup.read_warmup_file(path)
    assert [name for name, _ in got] == ["translate_sample", "serving_default",
                                         "translate_ids"]
    assert_same_requests(got, proto_requests(path))
    assert got[0][1]["seed"].dtype == np.int64 and got[0][1]["seed"] == 2**40

    # The writer's bytes are the protos' deterministic serialization.
    ours = str(tmp_path / "ours")
    requests = [(name or "serving_default", inputs) for name, inputs in got]
    warmup.write_warmup_file(ours, requests, model_name=NAME)
    expected = [predict_log(name, inputs).SerializeToString(deterministic=True)
                for name, inputs in requests]
    assert [record.numpy() for record in tf.data.TFRecordDataset(ours)] == expected


@pytest.mark.parametrize("model_name, file", [(NAME, "warmup_requests_named.tfrecord"),
                                              ("", "warmup_requests_unnamed.tfrecord")])
def test_the_written_bytes_are_those_of_the_frozen_files(tmp_path, model_name, file):
    with open(os.path.join(DATA, file), "rb") as f:
        frozen = f.read()
    path = warmup.write_warmup_file(str(tmp_path / warmup.WARMUP_FILE), FROZEN_REQUESTS,
                                    model_name=model_name)
    with open(path, "rb") as f:
        assert f.read() == frozen
    assert_same_requests(warmup.read_warmup_file(os.path.join(DATA, file)), FROZEN_REQUESTS)


def test_every_record_of_the_export_replays_on_the_saved_model(export, loaded):
    requests = warmup.read_warmup_file(os.path.join(export, warmup.WARMUP_PATH))
    assert [name for name, _ in requests] == list(warmup.WARMUP_SIGNATURES)
    for name, inputs in requests:
        outputs = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        if name == "translate_ids":
            assert np.count_nonzero(outputs["translation_ids"].numpy()) > 0
        else:
            assert all(outputs["translation"].numpy()), outputs


def test_the_option_signatures_warm_up_with_the_export_s_defaults(export, loaded):
    # Not written by kt-export (see `WARMUP_SIGNATURES`), but each can be
    # asked for: the options in their inputs' dtypes, with the export's
    # defaults, and each runs.
    names = [name for name in SIGNATURES if name != TRANSLATE_XLA]
    metadata = read_metadata(export)
    requests = warmup.warmup_requests(loaded.signatures, metadata, examples=EXAMPLES,
                                      tokenize=lambda sentence: [5, 6, 7], names=names)
    assert [name for name, _ in requests] == names
    for name, inputs in requests:
        specs = input_specs(loaded.signatures[name])
        assert sorted(inputs) == sorted(specs)
        for key, value in inputs.items():
            assert tf.as_dtype(value.dtype) == specs[key].dtype, (name, key)
            assert specs[key].shape.is_compatible_with(value.shape), (name, key)
        for key in ("beam_size", "alpha", "extra_length"):
            if key in inputs:
                assert inputs[key] == pytest.approx(metadata[key])
        outputs = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        for key in ("translation", "translations"):
            if key in outputs:
                assert np.all(outputs[key].numpy() != b""), (name, outputs[key])
    # The round trip through the file keeps every dtype and shape.
    path = str(os.path.join(os.path.dirname(export), "options_warmup"))
    warmup.write_warmup_file(path, requests)
    assert_same_requests(warmup.read_warmup_file(path), requests)


def test_a_malformed_file_is_refused_naming_the_file_and_record(tmp_path):
    good = [("serving_default", {"text": np.array([b"a"], object)})]
    path = str(tmp_path / "bad_message")
    warmup.write_warmup_file(path, good * 2)
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
        for record in tf.data.TFRecordDataset(path):
            writer.write(record.numpy())
        writer.write(b"\x32\x05ab")  # a message field that runs past the end
    os.replace(path + ".tmp", path)
    with pytest.raises(ValueError, match=re.escape(path) + ": record 2 is not a PredictionLog"):
        warmup.read_warmup_file(path)

    # A tensor that is not a valid TensorProto: 3 bytes of content for two floats.
    from tensorflow_serving.apis import prediction_log_pb2

    log = prediction_log_pb2.PredictionLog()
    tensor = log.predict_log.request.inputs["text"]
    tensor.dtype = tf.float32.as_datatype_enum
    tensor.tensor_shape.dim.add().size = 2
    tensor.tensor_content = b"\0\0\0"
    path = str(tmp_path / "bad_tensor")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString())
    with pytest.raises(ValueError, match=re.escape(path) + ": record 0 .*input 'text'"):
        warmup.read_warmup_file(path)

    # Not TFRecord framing: the second record cut short.
    path = str(tmp_path / "truncated")
    warmup.write_warmup_file(path, good * 2)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-6])
    with pytest.raises(ValueError, match=re.escape(path) + ": record 1 is not a TFRecord"):
        warmup.read_warmup_file(path)
    with pytest.raises(FileNotFoundError):
        warmup.read_warmup_file(str(tmp_path / "absent"))


def test_at_most_tf_serving_s_record_limit():
    request = ("serving_default", {"text": np.array([b"a"], object)})
    with pytest.raises(ValueError, match="at most 1000"):
        warmup.write_warmup_file("unused", [request] * (warmup.MAX_RECORDS + 1))
    with pytest.raises(ValueError, match="non-empty"):
        warmup.write_warmup_file("unused", [("", request[1])])


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_the_warmup_file_takes_the_umask_s_mode(tmp_path, mask):
    previous = os.umask(mask)
    try:
        path = warmup.write_warmup_file(
            str(tmp_path / warmup.WARMUP_FILE),
            [("serving_default", {"text": np.array([b"a"], object)})])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~mask
    assert os.listdir(tmp_path) == [warmup.WARMUP_FILE]  # no temporary file left


def test_warm_up_requests_run_under_the_server_s_request_limits(tmp_path):
    from keras_transformer.serving.model_versions import Servable
    from keras_transformer.serving.rest_api import SignatureSpec, TensorSpec
    from keras_transformer.serving.work import RequestLimits

    class Version:
        """What `Servable.warm_up` reads of a loaded version."""

        path = str(tmp_path)
        specs = {"serving_default": SignatureSpec(
            {"text": TensorSpec("string", (None,))},
            {"translation": TensorSpec("string", (None,))})}
        metadata = {"max_length": 32, "beam_size": 4, "extra_length": 8}
        calls = 0

        def predict(self, signature, inputs):
            Version.calls += 1
            return {"translation": inputs["text"]}

    os.makedirs(tmp_path / "assets.extra")
    big = ("serving_default", {"text": np.array([b"a red house"] * 9, object)})
    warmup.write_warmup_file(str(tmp_path / "assets.extra" / warmup.WARMUP_FILE),
                             [FROZEN_REQUESTS[0], big])
    # Without limits (or within them) both requests run.
    assert Servable.warm_up(Version()) == 2 and Version.calls == 2
    assert Servable.warm_up(Version(), RequestLimits(max_request_sentences=9)) == 2
    # Over a limit the load fails before the request runs, naming it.
    Version.calls = 0
    with pytest.raises(ValueError, match="warm-up request 2 of 2 is refused: The request "
                                         "holds 9 sentences, more than --max-request-sent"):
        Servable.warm_up(Version(), RequestLimits(max_request_sentences=8))
    assert Version.calls == 1
    with pytest.raises(ValueError, match="asks for 1188 units of work, more than "
                                         "--max-request-work \\(1000\\)"):
        Servable.warm_up(Version(), RequestLimits(max_request_work=1000))
