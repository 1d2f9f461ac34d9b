"""kt-serve: TF Serving's REST API over an exported translator, through real
HTTP on loopback to one `kt-serve` subprocess (batching on), compared with
the SavedModel's answers in this process; its error bodies; batching; a new
version swapped in while requests run. Then the parts without a server:
request parsing, the batch scheduler, the version manager with a fake
loader, and the application with a fake model."""

import asyncio
import base64
import concurrent.futures
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
import requests
from support.processes import ROOT
from support.serving_model import export_tiny_versions, start_server, stop_server

from keras_transformer.serving.client import RestClient, ServingError
from keras_transformer.serving import rest_api
from keras_transformer.serving.batching import (
    BatchScheduler,
    QueueFull,
    TaskTooLarge,
    batch_key,
    batchable,
)
from keras_transformer.serving.model_versions import VersionManager, servable_versions
from keras_transformer.serving.rest_api import RestError, SignatureSpec, TensorSpec

NAME = "tiny"
SENTENCES = ["A man rides his bike across the bridge.", "Two dogs", "Die Mädchen."]
INVALID_UTF8 = b"caf\xc3 \xff ok"
# Distinct sentences for the concurrent requests of the batching test.
BATCH_SENTENCES = [
    "Zwei Hunde spielen im Schnee, während es schneit!", "Die Mädchen überqueren die Straße.",
    "Two dogs are playing in the snow while it snows?", "A man", "Ein Mann fährt.",
    "The girls cross the street.", "dogs", "Schnee",
]
EXAMPLES = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt mit dem Fahrrad."]
OPTIONS = {"beam_size": 2, "alpha": 0.0, "extra_length": 3}
NBEST = {"n": 2, "beam_size": 3, "alpha": 0.6, "extra_length": 4}
EXPLAIN = {"beam_size": 3, "alpha": 0.6, "extra_length": 4}
SAMPLE = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 5, "extra_length": 4}
IDS = [[17, 25, 9, 3], [40, 3, 0, 0]]
MAX_REQUEST_BYTES = 20000
TYPES = {"beam_size": "int32", "extra_length": "int32", "n": "int32", "top_k": "int32",
         "alpha": "float32", "temperature": "float32", "top_p": "float32", "seed": "int64"}


def _in_process(path):
    """The SavedModel's own answers, loaded in this process."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    signatures = tf.saved_model.load(path).signatures

    def run(name, text, **options):
        inputs = {k: tf.constant(v, TYPES[k]) for k, v in options.items()}
        if text is not None:
            inputs["text"] = tf.constant([as_bytes(t) for t in text], tf.string)
        return {k: v.numpy() for k, v in signatures[name](**inputs).items()}

    # One call per signature; a sentence's answer does not depend on its batch.
    default = run("serving_default", SENTENCES + [INVALID_UTF8] + BATCH_SENTENCES)
    options = run("translate_with_options", SENTENCES + BATCH_SENTENCES, **OPTIONS)
    return {
        "signatures": sorted(signatures),
        "default": {k: v[:4] for k, v in default.items()},
        "batch": {k: v[4:] for k, v in default.items()},
        "options": {k: v[:3] for k, v in options.items()},
        "batch_options": {k: v[3:] for k, v in options.items()},
        "nbest": run("translate_nbest", SENTENCES, **NBEST),
        "explain": run("translate_explain", SENTENCES, **EXPLAIN),
        "sample": run("translate_sample", SENTENCES, **SAMPLE),
        "ids": {k: v.numpy() for k, v in signatures["translate_ids"](
            source_ids=tf.constant(IDS, tf.int32)).items()},
    }


def as_bytes(text):
    return text.encode("utf-8") if isinstance(text, str) else text


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Version 1 (with examples) in a watched directory beside ignored
    entries (`3/` without saved_model.pb, `.tmp-tiny-9/`, `latest/`), a
    kt-serve subprocess serving it with batching, the in-process answers,
    and version 2 (another seed) exported elsewhere for the hot-swap test."""
    root = tmp_path_factory.mktemp("serve")
    v1, v2 = export_tiny_versions(root / "staging", [20261126, 7], NAME, examples=EXAMPLES)
    base = str(root / "saved_models" / NAME)
    os.makedirs(base)
    path = os.path.join(base, "1")
    os.rename(v1, path)
    os.makedirs(os.path.join(base, "3"))
    for ignored in (".tmp-tiny-9", "latest"):
        os.makedirs(os.path.join(base, ignored))
        shutil.copy(os.path.join(path, "saved_model.pb"), os.path.join(base, ignored))
    # The server starts on a thread while this process loads the model.
    starting = concurrent.futures.ThreadPoolExecutor(1).submit(start_server, [
        "--model-name", NAME, "--model-base-path", base, "--enable-batching",
        "--max-batch-size", "8", "--batch-timeout-micros", "50000",
        "--file-system-poll-wait-seconds", "0.3",
        "--max-request-bytes", str(MAX_REQUEST_BYTES)])
    try:
        expected = _in_process(path)
    except BaseException:
        stop_server(starting.result()[0])
        raise
    process, url = starting.result()
    try:
        yield {"url": url, "base": base, "path": path, "v2": v2, "expected": expected}
    finally:
        stop_server(process)


def predict(url, body, version=None, **kwargs):
    pinned = f"/versions/{version}" if version is not None else ""
    response = requests.post(f"{url}/v1/models/{NAME}{pinned}:predict", json=body,
                             timeout=120, **kwargs)
    return response.status_code, response.json()


def assert_translations(translations, scores, expected, rows=slice(None)):
    want = [t.decode("utf-8") for t in expected["translation"][rows]]
    assert translations == want
    np.testing.assert_allclose(scores, expected["score"][rows], rtol=1e-5, atol=1e-6)


# Through HTTP ----------------------------------------------------------------


def test_columnar_predict_gives_the_saved_models_answers(served):
    expected = served["expected"]
    b64 = {"b64": base64.b64encode(INVALID_UTF8).decode()}
    status, body = predict(served["url"], {"inputs": {"text": SENTENCES + [b64]}})
    assert status == 200, body
    assert sorted(body) == ["outputs"]
    assert_translations(body["outputs"]["translation"], body["outputs"]["score"],
                        expected["default"])
    status, single = predict(served["url"], {"inputs": [SENTENCES[1]]})  # one input, bare
    assert status == 200 and single["outputs"]["translation"] == [
        expected["default"]["translation"][1].decode()]


def test_row_predict_gives_one_object_per_sentence(served):
    expected = served["expected"]["default"]
    b64 = {"b64": base64.b64encode(INVALID_UTF8).decode()}
    instances = [SENTENCES[0], {"text": SENTENCES[1]}, SENTENCES[2], b64]
    status, body = predict(served["url"], {"signature_name": "serving_default",
                                           "instances": instances})
    assert status == 200, body
    rows = body["predictions"]
    assert [sorted(r) for r in rows] == [["score", "translation"]] * 4
    assert_translations([r["translation"] for r in rows], [r["score"] for r in rows], expected)


def test_signatures_with_scalar_options_take_json_scalars(served):
    expected, url = served["expected"], served["url"]
    status, body = predict(url, {"signature_name": "translate_with_options",
                                 "inputs": dict(text=SENTENCES, **OPTIONS)})
    assert status == 200, body
    assert_translations(body["outputs"]["translation"], body["outputs"]["score"],
                        expected["options"])
    status, body = predict(url, {"signature_name": "translate_nbest",
                                 "inputs": dict(text=SENTENCES, **NBEST)})
    assert status == 200, body
    assert body["outputs"]["translations"] == [[t.decode() for t in row] for row in
                                               expected["nbest"]["translations"]]
    np.testing.assert_allclose(body["outputs"]["scores"], expected["nbest"]["scores"],
                               rtol=1e-5, atol=1e-6)
    status, body = predict(url, {"signature_name": "translate_sample",
                                 "inputs": dict(text=SENTENCES, **SAMPLE)})
    assert status == 200, body
    assert_translations(body["outputs"]["translation"], body["outputs"]["score"],
                        expected["sample"])
    status, body = predict(url, {"signature_name": "translate_explain",
                                 "inputs": dict(text=SENTENCES, **EXPLAIN)})
    assert status == 200, body
    explain = expected["explain"]
    assert sorted(body["outputs"]) == sorted(explain)
    for name, value in explain.items():
        if value.dtype == object:
            assert body["outputs"][name] == np.vectorize(bytes.decode)(value).tolist(), name
        else:
            np.testing.assert_allclose(body["outputs"][name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=name)


def test_integer_inputs_in_rows(served):
    expected = served["expected"]["ids"]
    status, body = predict(served["url"], {"signature_name": "translate_ids",
                                           "instances": IDS})
    assert status == 200, body
    assert [r["translation_ids"] for r in body["predictions"]] == \
        expected["translation_ids"].tolist()
    np.testing.assert_allclose([r["score"] for r in body["predictions"]], expected["score"],
                               rtol=1e-5, atol=1e-6)


def test_the_projects_rest_client_works_unchanged(served):
    expected = served["expected"]
    client = RestClient(served["url"], model=NAME)
    assert_translations(*client.translate(SENTENCES), expected["default"], slice(0, 3))
    assert_translations(*client.translate(SENTENCES, **OPTIONS), expected["options"])
    pinned = RestClient(served["url"], model=NAME, version=1)
    assert_translations(*pinned.translate(SENTENCES), expected["default"], slice(0, 3))
    with pytest.raises(ServingError, match=r"404.*Specific\(tiny, 5\)"):
        RestClient(served["url"], model=NAME, version=5).translate(SENTENCES)
    nbest = client.translate_nbest(SENTENCES, NBEST["n"], NBEST["beam_size"], NBEST["alpha"],
                                   NBEST["extra_length"])
    assert [[t for t, _ in row] for row in nbest] == [
        [t.decode() for t in row] for row in expected["nbest"]["translations"]]
    np.testing.assert_allclose([[s for _, s in row] for row in nbest],
                               expected["nbest"]["scores"], rtol=1e-5, atol=1e-6)
    assert pinned.status()["model_version_status"][0]["state"] == "AVAILABLE"


def test_model_status_and_metadata(served):
    url = served["url"]
    for path in (f"/v1/models/{NAME}", f"/v1/models/{NAME}/versions/1"):
        response = requests.get(url + path, timeout=30)
        assert response.status_code == 200
        assert response.json() == {"model_version_status": [{
            "version": "1", "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]}
    response = requests.get(f"{url}/v1/models/{NAME}/versions/1/metadata", timeout=30)
    assert response.status_code == 200
    body = response.json()
    assert body["model_spec"] == {"name": NAME, "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == served["expected"]["signatures"]
    default = signatures["serving_default"]
    assert default["inputs"]["text"]["dtype"] == "DT_STRING"
    assert default["inputs"]["text"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    assert default["outputs"]["score"]["dtype"] == "DT_FLOAT"
    options = signatures["translate_with_options"]["inputs"]
    assert options["beam_size"]["dtype"] == "DT_INT32"
    assert options["beam_size"]["tensor_shape"]["dim"] == []
    assert requests.get(f"{url}/v1/models/{NAME}/metadata", timeout=30).json() == body


def test_playground_info_and_files(served):
    url = served["url"]
    info = requests.get(url + "/playground/info", timeout=30).json()
    assert info == {"model_name": NAME, "version": 1, "beam_size": 3, "alpha": 0.6,
                    "extra_length": 4, "examples": EXAMPLES, "engine": "savedmodel"}
    index = os.path.join(ROOT, "keras_transformer", "serving", "playground", "index.html")
    response = requests.get(url + "/", timeout=30)
    if os.path.exists(index):
        assert response.status_code == 200
        with open(index, "rb") as f:
            assert response.content == f.read()
        assert response.headers["content-type"].startswith("text/html")
    else:
        assert response.status_code == 404 and "error" in response.json()
    assert requests.get(url + "/playground/no-such.js", timeout=30).status_code == 404


def _chunks(size):
    yield b'{"inputs": {"text": ["'
    yield b"x" * size
    yield b'"]}}'


ERRORS = [
    # (name, method, path, body or raw bytes, status, words the message holds)
    ("json", "POST", ":predict", b'{"inputs": {"text": [', 400, "JSON Parse error"),
    ("not an object", "POST", ":predict", b'["Two dogs"]', 400, "JSON object"),
    ("utf-8", "POST", ":predict", b'{"inputs": {"text": ["caf\xc3 "]}}', 400, "UTF-8"),
    ("both", "POST", ":predict", {"inputs": {"text": ["a"]}, "instances": ["a"]}, 400,
     "exactly one"),
    ("neither", "POST", ":predict", {"signature_name": "serving_default"}, 400,
     "Missing 'inputs' or 'instances'"),
    ("signature", "POST", ":predict", {"signature_name": "nope", "inputs": ["a"]}, 400,
     "\"nope\" not found"),
    ("missing", "POST", ":predict", {"signature_name": "translate_with_options",
                                     "inputs": {"text": ["a"], "alpha": 0.6}}, 400,
     "missing but required: beam_size, extra_length"),
    ("extra", "POST", ":predict", {"inputs": {"text": ["a"], "beam": 2}}, 400,
     "sent extra: beam"),
    ("type", "POST", ":predict", {"inputs": {"text": [1, 2]}}, 400, "expected type string"),
    ("int type", "POST", ":predict", {"signature_name": "translate_with_options",
                                      "inputs": dict(text=["a"], **dict(OPTIONS,
                                                                        beam_size=2.5))},
     400, "'beam_size'"),
    ("range", "POST", ":predict", {"signature_name": "translate_with_options",
                                   "inputs": dict(text=["a"], **dict(OPTIONS,
                                                                     beam_size=2 ** 40))},
     400, "out of the range of int32"),
    ("rank", "POST", ":predict", {"inputs": {"text": "Two dogs"}}, 400, "rank 1"),
    ("scalar rank", "POST", ":predict", {"signature_name": "translate_with_options",
                                         "inputs": dict(text=["a"], **dict(OPTIONS,
                                                                           alpha=[0.6]))},
     400, "input 'alpha': expected a value of rank 0"),
    ("ragged", "POST", ":predict", {"signature_name": "translate_ids",
                                    "inputs": [[1, 2, 3], [4]]}, 400, "rectangular"),
    ("instance shapes", "POST", ":predict", {"signature_name": "translate_ids",
                                             "instances": [[1, 2, 3], [4]]}, 400,
     "same shape"),
    ("b64", "POST", ":predict", {"inputs": {"text": [{"b64": "not base64!"}]}}, 400,
     "base64"),
    ("rows with scalars", "POST", ":predict", {"signature_name": "translate_with_options",
                                               "instances": [{"text": "a"}]}, 400,
     "columnar format: {\"inputs\""),
    ("model", "POST", ":predict", {"signature_name": "translate_with_options",
                                   "inputs": dict(text=["a"], **dict(OPTIONS,
                                                                     beam_size=0))},
     400, "beam_size must be between 1 and"),
    ("model name", "POST", "/v1/models/nope:predict", {"inputs": ["a"]}, 404,
     "Servable not found for request: Latest(nope)"),
    ("version", "POST", "/versions/7:predict", {"inputs": ["a"]}, 404,
     "Servable not found for request: Specific(tiny, 7)"),
    ("status version", "GET", "/versions/7", None, 404, "Could not find version 7"),
    ("metadata version", "GET", "/versions/7/metadata", None, 404, "Specific(tiny, 7)"),
    ("status model", "GET", "/v1/models/nope", None, 404, "model nope"),
    ("too big", "POST", ":predict", {"inputs": ["x" * MAX_REQUEST_BYTES]}, 413,
     "--max-request-bytes"),
    ("too big, chunked", "POST", ":predict", _chunks, 413, "--max-request-bytes"),
    ("method", "GET", ":predict", None, 405, "use POST"),
    ("method on status", "POST", "", {"inputs": ["a"]}, 405, "use GET"),
    ("classify", "POST", ":classify", {"examples": []}, 404, "Malformed request"),
    ("path", "GET", "/labels/x/y", None, 404, "Malformed request"),
]


@pytest.mark.parametrize("name, method, path, body, status, words", ERRORS,
                         ids=[e[0] for e in ERRORS])
def test_every_problem_is_a_4xx_with_an_error_body(served, name, method, path, body,
                                                   status, words):
    url = served["url"] + (path if path.startswith("/v1/") else f"/v1/models/{NAME}{path}")
    if callable(body):
        kwargs = {"data": body(MAX_REQUEST_BYTES)}  # a generator: chunked, no length
    elif isinstance(body, bytes):
        kwargs = {"data": body, "headers": {"Content-Type": "application/json"}}
    else:
        kwargs = {} if body is None else {"json": body}
    response = requests.request(method, url, timeout=60, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert list(document) == ["error"] and isinstance(document["error"], str)
    assert words in document["error"]


def test_concurrent_requests_are_merged_and_each_gets_its_own_rows(served):
    url, expected = served["url"], served["expected"]
    before = requests.get(f"{url}/v1/models/{NAME}/batching", timeout=30).json()
    # Each request: one or two sentences, with or without the shared options.
    jobs = [([i], i % 3 == 0) for i in range(len(BATCH_SENTENCES))] + [([0, 5], False),
                                                                       ([2, 7], True)]
    barrier = threading.Barrier(len(jobs))
    answers = [None] * len(jobs)

    def send(j):
        rows, with_options = jobs[j]
        inputs = {"text": [BATCH_SENTENCES[i] for i in rows]}
        body = {"inputs": dict(inputs, **OPTIONS), "signature_name": "translate_with_options"} \
            if with_options else {"inputs": inputs}
        barrier.wait()
        answers[j] = predict(url, body)

    threads = [threading.Thread(target=send, args=(j,)) for j in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for (rows, with_options), (status, body) in zip(jobs, answers):
        assert status == 200, body
        reference = expected["batch_options" if with_options else "batch"]
        assert_translations(body["outputs"]["translation"], body["outputs"]["score"],
                            reference, rows)
    after = requests.get(f"{url}/v1/models/{NAME}/batching", timeout=30).json()
    assert after["enabled"] and after["max_batch_size"] == 8
    requests_run = after["requests"] - before["requests"]
    batches_run = after["batches"] - before["batches"]
    assert requests_run == len(jobs)
    assert after["rows"] - before["rows"] == sum(len(rows) for rows, _ in jobs)
    assert batches_run < requests_run and after["merged_batches"] > before["merged_batches"]
    assert 1 < after["largest_batch"]["requests"] and after["largest_batch"]["rows"] <= 8


def test_a_new_version_is_swapped_in_while_requests_run(served):
    """Runs last in this file: it changes what the server serves."""
    url, base = served["url"], served["base"]
    default = served["expected"]["default"]
    v1 = {"translation": [t.decode() for t in default["translation"][:3]],
          "score": default["score"][:3]}
    body = {"inputs": {"text": SENTENCES}}
    stop, swapped = threading.Event(), threading.Event()
    results, failures = [], []  # (started after the swap was seen, outputs)

    def keep_asking():
        session = requests.Session()
        while not stop.wait(0.05):  # a pause: the load of version 2 needs the CPU too
            after = swapped.is_set()
            response = session.post(f"{url}/v1/models/{NAME}:predict", json=body, timeout=120)
            if response.status_code == 200:
                results.append((after, response.json()["outputs"]))
            else:
                failures.append(response.text)

    threads = [threading.Thread(target=keep_asking) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        while len(results) < 2 and not failures:
            time.sleep(0.05)
        # kt-export's last step: a finished version directory renamed into place.
        os.rename(served["v2"], os.path.join(base, "2"))
        deadline, status = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            status = requests.get(f"{url}/v1/models/{NAME}/versions/2", timeout=30).json()
            if status.get("model_version_status", [{}])[0].get("state") == "AVAILABLE":
                swapped.set()
                break
            time.sleep(0.2)
        while sum(after for after, _ in results) < 3 and not failures and swapped.is_set():
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert swapped.is_set(), status
    code, pinned = predict(url, body, version=2)
    assert code == 200, pinned
    v2 = pinned["outputs"]

    def same(outputs, reference):
        return (outputs["translation"] == reference["translation"] and np.allclose(
            outputs["score"], reference["score"], rtol=1e-5, atol=1e-6))

    assert not same(v2, v1)  # another seed: another model
    assert all(same(outputs, v1) or same(outputs, v2) for _, outputs in results)
    later = [outputs for after, outputs in results if after]
    assert len(later) >= 3 and all(same(outputs, v2) for outputs in later)
    assert same(predict(url, body)[1]["outputs"], v2)
    assert predict(url, body, version=1) == (
        404, {"error": "Servable not found for request: Specific(tiny, 1)"})
    statuses = requests.get(f"{url}/v1/models/{NAME}", timeout=30).json()
    assert [(s["version"], s["state"], s["status"]["error_code"])
            for s in statuses["model_version_status"]] == [("2", "AVAILABLE", "OK"),
                                                           ("1", "END", "OK")]
    assert requests.get(url + "/playground/info", timeout=30).json()["version"] == 2


# Without a server ------------------------------------------------------------


def test_no_loadable_version_is_an_error_naming_the_path(tmp_path, capsys):
    from keras_transformer.cli import serve

    base = tmp_path / "demo"
    (base / "3").mkdir(parents=True)  # no saved_model.pb
    (base / ".tmp-demo-4").mkdir()
    for path in (base, tmp_path / "absent"):
        assert serve.main(["--model-name", "demo", "--model-base-path", str(path),
                           "--rest-api-port", "0"]) == 2
        assert str(path) in capsys.readouterr().err
    assert servable_versions(str(base)) == []


TEXT = TensorSpec("string", (None,))
SPECS = {
    "serving_default": SignatureSpec({"text": TEXT}, {"translation": TEXT, "score": TEXT}),
    "opts": SignatureSpec({"text": TEXT, "k": TensorSpec("int32", ()),
                           "p": TensorSpec("float32", ())},
                          {"translation": TEXT}),
    "ids": SignatureSpec({"ids": TensorSpec("int32", (None, 3)),
                          "flag": TensorSpec("bool", (None,))},
                         {"out": TensorSpec("int32", (None, None))}),
}


def test_requests_are_parsed_by_the_signatures_specs():
    parse = rest_api.parse_predict_request
    request = parse({"instances": ["a", {"b64": base64.b64encode(b"\xff").decode()},
                                   {"text": "c"}]}, SPECS)
    assert request.signature_name == "serving_default" and request.row_format
    assert request.inputs["text"].tolist() == [b"a", b"\xff", b"c"]
    request = parse({"signature_name": "opts", "inputs": {"text": [], "k": 3, "p": 1}}, SPECS)
    assert not request.row_format and request.inputs["text"].shape == (0,)
    assert request.inputs["k"].dtype == np.int32 and request.inputs["k"].shape == ()
    assert request.inputs["p"].dtype == np.float32 and request.inputs["p"] == 1.0
    request = parse({"signature_name": "ids", "instances": [
        {"ids": [1, 2, 3], "flag": True}, {"ids": [4, 5, 6], "flag": False}]}, SPECS)
    assert request.inputs["ids"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert request.inputs["flag"].tolist() == [True, False]
    assert parse({"signature_name": "ids", "instances": []}, SPECS).inputs["ids"].shape == \
        (0, 3)
    for document, words in [
            ({"signature_name": "ids", "inputs": {"ids": [[1, 2]], "flag": [True]}},
             "expected 3 values along axis 1"),
            ({"signature_name": "ids", "instances": [[1, 2, 3]]}, "must be an object"),
            ({"signature_name": "ids", "inputs": {"ids": [[1, 2, True]], "flag": [True]}},
             "JSON value true"),
            ({"signature_name": "ids", "inputs": {"ids": [[1, 2, 3]], "flag": [1]}},
             "expected type bool"),
            ({"signature_name": "opts", "inputs": {"text": [], "k": 3, "p": "1"}},
             "input 'p'"),
            ({"signature_name": 3, "inputs": []}, "'signature_name' must be a string"),
            ({"inputs": {"text": [{"b64": "YQ==", "x": 1}]}}, "base64"),
            ({"inputs": {"text": [["a"]]}}, "rank 1"),
            ({"instances": "a"}, "'instances' must be a list")]:
        with pytest.raises(RestError, match=None) as caught:
            parse(document, SPECS)
        assert caught.value.status == 400 and words in caught.value.message, caught.value
    deep = b"[" * 100000 + b"]" * 100000
    for body, words in [(b"\xef\xbb\xbf{}", "JSON Parse error"), (b"[1]", "JSON object"),
                        (b"{\"a\": \xc3}", "UTF-8"), (deep, "nested too deeply"),
                        (b"{\"a\": 1" + b"0" * 5000 + b"}", "JSON Parse error")]:
        with pytest.raises(RestError) as caught:
            rest_api.decode_body(body)
        assert words in caught.value.message
    options = {"signature_name": "opts", "inputs": {"text": ["\ud800"], "k": 1, "p": 1}}
    with pytest.raises(RestError, match="lone surrogate") as caught:
        parse(options, SPECS)
    # The error echoes the surrogate; its body is still valid JSON.
    assert json.loads(rest_api.dumps({"error": caught.value.message}))["error"] == \
        caught.value.message
    for p in (1e300, 10 ** 400):
        options["inputs"].update(text=[], p=p)
        with pytest.raises(RestError, match="out of its range"):
            parse(options, SPECS)


def test_responses_are_written_as_tf_serving_writes_them():
    scores = np.array([-0.1, 1 / 3], np.float32)
    words = np.array([b"a", b"caf\xc3"], object)
    assert rest_api.predict_response({"w": words}, row_format=True) == {
        "predictions": ["a", "caf\ufffd"]}
    assert rest_api.predict_response({"w": words}, row_format=False) == {
        "outputs": ["a", "caf\ufffd"]}
    assert rest_api.predict_response({"w": words, "s": scores}, row_format=True) == {
        "predictions": [{"s": -0.1, "w": "a"}, {"s": 0.33333334, "w": "caf\ufffd"}]}
    assert np.float32(rest_api.predict_response({"s": scores}, False)["outputs"][1]) == \
        scores[1]
    assert rest_api.predict_response({"w_bytes": words[1:]}, False) == {
        "outputs": [{"b64": base64.b64encode(b"caf\xc3").decode()}]}
    nested = rest_api.predict_response({"x": np.zeros((2, 0), np.int32)}, False)
    assert nested == {"outputs": [[], []]}
    with pytest.raises(RestError, match="one batch size"):
        rest_api.predict_response({"w": words, "k": np.int32(3)}, row_format=True)
    assert rest_api.dumps({"x": float("nan")}) == b'{"x": NaN}'


def _run(coroutine):
    return asyncio.run(coroutine)


def test_the_batch_scheduler_merges_splits_and_refuses_when_full():
    calls = []

    def run(inputs):
        calls.append(inputs["text"].tolist())
        time.sleep(0.05)
        return {"echo": np.char.upper(inputs["text"].astype(str)).astype(object),
                "n": np.full(len(inputs["text"]), inputs["k"], np.int32)}

    def request(words, k=1):
        inputs = {"text": np.array(words, object), "k": np.int32(k)}
        return ("v1", batch_key(inputs)), inputs

    async def scenario():
        scheduler = BatchScheduler(max_batch_size=4, batch_timeout_micros=20000,
                                   max_enqueued_batches=3)
        tasks = [scheduler.submit(*request(w), run) for w in (["a"], ["b", "c"], ["d"])]
        tasks.append(scheduler.submit(*request(["e"], k=2), run))  # other options
        with pytest.raises(TaskTooLarge,  # TF Serving's answer to a request over the maximum
                           match=r"^Task size 6 is larger than maximum input batch size 4$"):
            await scheduler.submit(*request(list("fghijk")), run)
        results = await asyncio.gather(*tasks)
        stats = scheduler.statistics()
        # Fill the queue: three batches of other keys wait for their timeout.
        blocked = [scheduler.submit(*request(["x"], k=k), run) for k in range(10, 13)]
        futures = [asyncio.ensure_future(b) for b in blocked]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="batch scheduling queue .* is full"):
            await scheduler.submit(*request(["y"], k=99), run)
        await asyncio.gather(*futures)
        scheduler.shutdown()
        return results, stats, scheduler.statistics()

    results, stats, final = _run(scenario())
    assert [r["echo"].tolist() for r in results] == [["A"], ["B", "C"], ["D"], ["E"]]
    assert [r["n"].tolist() for r in results] == [[1], [1, 1], [1], [2]]
    assert sorted(calls[:2], key=len) == [["e"], ["a", "b", "c", "d"]]
    assert stats["batches"] == 2 and stats["requests"] == 4 and stats["merged_batches"] == 1
    assert stats["largest_batch"] == {"requests": 3, "rows": 4}
    assert final["queue_full"] == 1 and final["waiting"] == 0


def test_a_batch_error_goes_to_each_of_its_requests():
    def run(inputs):
        raise ValueError("rejected")

    async def scenario():
        scheduler = BatchScheduler(max_batch_size=8, batch_timeout_micros=10000)
        key = ("v", ())
        outcome = await asyncio.gather(
            *[scheduler.submit(key, {"text": np.array([w], object)}, run) for w in "ab"],
            return_exceptions=True)
        scheduler.shutdown()
        return outcome, scheduler.statistics()

    outcome, stats = _run(scenario())
    assert [str(e) for e in outcome] == ["rejected", "rejected"] and stats["batches"] == 1


def test_which_signatures_batch():
    scalar, vector = TensorSpec("int32", ()), TensorSpec("float32", (None,))
    assert batchable(SignatureSpec({"text": TEXT, "k": scalar}, {"a": TEXT, "b": vector}))
    assert not batchable(SignatureSpec({"text": TEXT}, {"a": TensorSpec("string", (None, 2))}))
    assert not batchable(SignatureSpec({"ids": TensorSpec("int32", (None, None))}, {"a": TEXT}))
    assert not batchable(SignatureSpec({"text": TEXT, "w": vector}, {"a": TEXT}))


class _FakeServable:
    def __init__(self, path, version):
        if os.path.exists(os.path.join(path, "broken")):
            raise OSError("cannot read this one")
        self.version, self.path = version, path
        self.specs = SPECS
        self.metadata, self.examples = {"beam_size": 4}, ["x"]

    def predict(self, signature, inputs):
        if inputs["text"].tolist() == [b"crash"]:
            raise RuntimeError("unexpected")
        return {"translation": inputs["text"], "score": np.zeros(len(inputs["text"]),
                                                                  np.float32)}


def _version(base, version, broken=False):
    os.makedirs(base / str(version))
    if broken:
        (base / str(version) / "broken").write_text("")
    (base / str(version) / "saved_model.pb").write_bytes(b"")


def test_versions_are_polled_swapped_and_failures_reported(tmp_path):
    _version(tmp_path, 1)
    os.makedirs(tmp_path / "5")  # no saved_model.pb: ignored
    manager = VersionManager(str(tmp_path), poll_wait_seconds=0.05, load=_FakeServable,
                             max_num_load_retries=0)
    assert manager.start() == 1
    try:
        first = manager.get()
        _version(tmp_path, 3, broken=True)

        def wait_for(condition):
            deadline = time.monotonic() + 10
            while not condition() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert condition()

        wait_for(lambda: manager.status(3) and manager.status(3)[0][1] == "END")
        assert manager.get() is first and manager.get(1) is first
        assert "OSError: cannot read this one" in manager.status(3)[0][2]
        body = rest_api.model_status(manager.status())
        assert body["model_version_status"][0]["status"]["error_code"] == "UNKNOWN"
        _version(tmp_path, 4)
        wait_for(lambda: manager.get(4) is not None)
        _version(tmp_path, 2)  # older than the served 4: never loaded
        time.sleep(0.3)
        assert manager.get(1) is None and manager.get().version == 4
        failed = (3, "END", "OSError: cannot read this one")
        assert manager.status() == [(4, "AVAILABLE", ""), failed, (1, "END", "")]
    finally:
        manager.stop()


def test_the_application_with_a_fake_model(tmp_path, caplog):
    import httpx

    from keras_transformer.serving.app import create_app

    _version(tmp_path / "m", 1)
    manager = VersionManager(str(tmp_path / "m"), poll_wait_seconds=0, load=_FakeServable)
    manager.start()
    playground = tmp_path / "playground"
    playground.mkdir()
    (playground / "index.html").write_text("<p>hi</p>")
    (playground / "app.js").write_text("1;")
    (tmp_path / "secret.txt").write_text("no")
    app = create_app("m", manager, playground_dir=str(playground))

    async def ask(calls):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://kt") as client:
            return [await client.request(method, path, **kwargs)
                    for method, path, kwargs in calls]

    with caplog.at_level("ERROR", logger="kt-serve"):
        (index, script, traversal, missing, nowhere, post_index, info, prediction, crash,
         batching) = _run(ask([
             ("GET", "/", {}), ("GET", "/playground/app.js", {}),
             ("GET", "/playground/..%2Fsecret.txt", {}), ("GET", "/playground/missing.css", {}),
             ("GET", "/nowhere", {}), ("POST", "/", {}), ("GET", "/playground/info", {}),
             ("POST", "/v1/models/m:predict", {"json": {"instances": ["a"]}}),
             ("POST", "/v1/models/m:predict", {"json": {"inputs": ["crash"]}}),
             ("GET", "/v1/models/m/batching", {})]))
    assert index.text == "<p>hi</p>" and index.headers["content-type"].startswith("text/html")
    assert script.text == "1;" and "javascript" in script.headers["content-type"]
    for response in (traversal, missing, nowhere):
        assert response.status_code == 404 and "error" in response.json(), response.url
    assert post_index.status_code == 405 and "error" in post_index.json()
    assert info.json() == {"model_name": "m", "version": 1, "beam_size": 4, "alpha": None,
                           "extra_length": None, "examples": ["x"], "engine": "savedmodel"}
    assert prediction.json() == {"predictions": [{"score": 0.0, "translation": "a"}]}
    assert crash.status_code == 500
    assert crash.json() == {"error": "Internal error: RuntimeError: unexpected"}
    assert "Traceback" in caplog.text and "RuntimeError: unexpected" in caplog.text
    assert batching.json() == {"enabled": False}
