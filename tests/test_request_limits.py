"""Bad search options are refused by the SavedModel itself (so TF Serving
answers them with a 400 too), kt-serve answers them with a readable 400,
a request that exhausts memory gets a 503 and a huge version number a 404,
and the server stays up."""

import json
import os

import numpy as np
import pytest
import requests
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SentencePiece ops of the export)

from keras_transformer.decoding.search_options import MAX_EXTRA_LENGTH
from keras_transformer.serving import model_versions
from keras_transformer.serving.rest_api import SignatureSpec, TensorSpec
from support.serving_model import MAX_LENGTH, export_tiny_model, start_server, stop_server

NAME = "tiny"
TEXT = tf.constant(["the dog sees a cat", "a red house"])


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("limits"), name=NAME)


@pytest.fixture(scope="module")
def loaded(export):
    return tf.saved_model.load(export).signatures


@pytest.mark.parametrize("beam_size", [0, 2**30 + 1, 2**31 - 1, 4096])
def test_the_savedmodel_refuses_beam_sizes_out_of_range(loaded, beam_size):
    for name, extra in (("translate_with_options", {}), ("translate_nbest", {"n": 1}),
                        ("translate_explain", {})):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"beam_size must be between 1 and \d+, received"):
            loaded[name](text=TEXT, beam_size=tf.constant(beam_size), alpha=tf.constant(0.6),
                         extra_length=tf.constant(4), **{k: tf.constant(v)
                                                         for k, v in extra.items()})


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -0.5])
def test_the_savedmodel_refuses_alphas_that_are_not_finite_and_positive(loaded, alpha):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"alpha must be a finite number"):
        loaded["translate_with_options"](text=TEXT, beam_size=tf.constant(2),
                                         alpha=tf.constant(alpha), extra_length=tf.constant(4))


@pytest.mark.parametrize("extra_length", [-1, MAX_EXTRA_LENGTH + 1, 2**31 - 1])
def test_the_savedmodel_refuses_extra_lengths_out_of_range(loaded, extra_length):
    for name, extra in (("translate_with_options", {}), ("translate_nbest", {"n": 1})):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"extra_length must be between 0 and {MAX_EXTRA_LENGTH}"):
            loaded[name](text=TEXT, beam_size=tf.constant(2), alpha=tf.constant(0.6),
                         extra_length=tf.constant(extra_length),
                         **{k: tf.constant(v) for k, v in extra.items()})


def test_a_large_extra_length_is_the_model_s_maximum_not_a_wrap(loaded):
    def translate(extra_length):
        out = loaded["translate_with_options"](
            text=TEXT, beam_size=tf.constant(2), alpha=tf.constant(0.6),
            extra_length=tf.constant(extra_length))
        return out["translation"].numpy().tolist(), out["score"].numpy()

    large, longest = translate(MAX_EXTRA_LENGTH), translate(MAX_LENGTH)
    assert large[0] == longest[0]
    np.testing.assert_array_equal(large[1], longest[1])
    assert all(score > -1e8 for score in large[1])  # a real search, not an empty one


def test_kt_serve_answers_bad_options_with_a_readable_400_and_a_huge_version_with_404(export):
    # kt-serve's own beam limit lifted: the model's check answers.
    process, url = start_server(["--model-name", NAME, "--model-base-path",
                                 os.path.dirname(export), "--max-beam-size", str(2**31 - 1),
                                 "--max-request-work", "0"])
    try:
        body = {"signature_name": "translate_with_options",
                "inputs": {"text": ["the dog"], "beam_size": 2**30 + 1, "alpha": 0.6,
                           "extra_length": 4}}
        answer = requests.post(f"{url}/v1/models/{NAME}:predict", json=body, timeout=60)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert "beam_size must be between 1 and" in error
        assert "[[" not in error and "Detected at node" not in error
        body["inputs"].update(beam_size=2, alpha=float("nan"))
        answer = requests.post(f"{url}/v1/models/{NAME}:predict", data=json.dumps(body),
                               timeout=60, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400, answer.text
        answer = requests.post(f"{url}/v1/models/{NAME}/versions/{'9' * 5000}:predict",
                               json={"inputs": {"text": ["a"]}}, timeout=60)
        assert answer.status_code == 404 and "Malformed request" in answer.json()["error"]
        alive = requests.post(f"{url}/v1/models/{NAME}:predict",
                              json={"inputs": {"text": ["the dog"]}}, timeout=60)
        assert alive.status_code == 200
    finally:
        stop_server(process)


def test_kt_serve_limits_the_work_of_one_request(export):
    process, url = start_server(["--model-name", NAME, "--model-base-path",
                                 os.path.dirname(export), "--max-request-sentences", "6",
                                 "--max-beam-size", "3", "--enable-batching",
                                 "--max-batch-size", "4"])
    try:
        def post(body):
            return requests.post(f"{url}/v1/models/{NAME}:predict", json=body, timeout=60)

        answer = post({"inputs": {"text": ["a dog"] * 7}})
        assert answer.status_code == 400
        assert "holds 7 sentences, more than --max-request-sentences (6)" in answer.json()["error"]
        answer = post({"inputs": {"text": ["a dog"] * 5}})  # batched: TF Serving's refusal
        assert answer.status_code == 400
        assert answer.json()["error"] == ("Task size 5 is larger than maximum input batch "
                                          "size 4")
        answer = post({"signature_name": "translate_with_options",
                       "inputs": {"text": ["a dog"], "beam_size": 4, "alpha": 0.6,
                                  "extra_length": 4}})
        assert answer.status_code == 400
        assert answer.json()["error"] == "beam_size 4 is larger than --max-beam-size (3)."
        assert post({"inputs": {"text": ["a dog"] * 4}}).status_code == 200
    finally:
        stop_server(process)


def test_resource_exhausted_is_a_503_error_not_a_crash():
    servable = model_versions.Servable.__new__(model_versions.Servable)

    def exhausted(**inputs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    spec = SignatureSpec({"text": TensorSpec("string", (None,))}, {})
    servable._tf = tf
    servable._signatures = {"serving_default": exhausted}
    servable.specs = {"serving_default": spec}
    with pytest.raises(model_versions.ModelOverloaded, match="more memory than the server has"):
        servable.predict("serving_default", {"text": np.array([b"a"], object)})


def test_client_messages_drop_tensorflow_s_node_lines():
    message = ("assertion failed: [beam_size must be between 1 and 200, received] [5000]\n"
               "\t [[{{node Assert/AssertGuard/Assert}}]]\n\nDetected at node Assert/Foo")
    assert model_versions._client_message(message) == (
        "assertion failed: [beam_size must be between 1 and 200, received] [5000]")
