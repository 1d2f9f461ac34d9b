"""kt-serve on a CTranslate2 export: the SavedModel's signatures, inputs,
outputs and refusals, with CTranslate2 answering. Both engines serve the
same tiny weights from one config file. "Match" here: the same greedy
translation of every test sentence, scores within `SCORE_RTOL` (float32
sums of log probabilities computed by two engines). The tiny random model
runs every hypothesis to the length limit, where the two beam searches
differ by design (export/ctranslate2.py); the beam comparison on the
trained demo model is `python -m benchmarks serve-engines`."""

import os

import numpy as np
import pytest
import requests

from support.serving_model import export_tiny_model, start_server, stop_server

pytest.importorskip("ctranslate2")

from support.serving_model import export_tiny_ctranslate2  # noqa: E402
from keras_transformer.serving.ctranslate2_servable import (  # noqa: E402
    SPECS,
    CTranslate2Servable,
    is_ctranslate2_version,
)

SENTENCES = ["the dog sees a cat", "a red house", "Ein Mann fährt mit dem Fahrrad.",
             "", "two women walk on the beach with their dogs"]
SCORE_RTOL = 1e-4
# The preset's depth, not the serving tests' one layer: SCORE_RTOL was set
# on this model, and how far two engines' float32 sums drift apart depends
# on the weights.
NUM_LAYERS = 2


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    base = tmp_path_factory.mktemp("engines")
    saved_model = export_tiny_model(base / "sm", name="tiny", version=1, num_layers=NUM_LAYERS)
    ct2 = export_tiny_ctranslate2(base / "ct2", name="tiny", version=1,
                                  examples=["the dog sees a cat"], num_layers=NUM_LAYERS)
    return {"base": base, "saved_model": saved_model, "ct2": ct2}


@pytest.fixture(scope="module")
def server(exports):
    pytest.importorskip("tensorflow_serving")
    config = exports["base"] / "models.config"
    config.write_text(
        'model_config_list {\n'
        f'  config {{ name: "sm" base_path: "{os.path.dirname(exports["saved_model"])}" }}\n'
        f'  config {{ name: "ct2" base_path: "{os.path.dirname(exports["ct2"])}" }}\n'
        '}\n')
    # The model's own limit answers, not kt-serve's --max-beam-size.
    process, url = start_server(["--model-config-file", str(config),
                                 "--max-beam-size", str(2**31 - 1)])
    try:
        yield url
    finally:
        stop_server(process)


def test_the_signatures_are_the_saved_model_s(exports):
    from keras_transformer.serving.model_versions import Servable

    saved = Servable(exports["saved_model"], 1).specs
    for name, spec in SPECS.items():
        assert spec == saved[name], name
    assert is_ctranslate2_version(exports["ct2"])
    assert not is_ctranslate2_version(exports["saved_model"])


def _predict(url, model, signature, **inputs):
    return requests.post(f"{url}/v1/models/{model}:predict", timeout=60,
                         json={"signature_name": signature,
                               "inputs": {"text": SENTENCES, **inputs}})


def test_both_engines_give_the_same_greedy_translations(server):
    options = {"beam_size": 1, "alpha": 0.0, "extra_length": 4}
    sm = _predict(server, "sm", "translate_with_options", **options).json()["outputs"]
    ct2 = _predict(server, "ct2", "translate_with_options", **options).json()["outputs"]
    assert ct2["translation"] == sm["translation"]
    np.testing.assert_allclose(ct2["score"], sm["score"], rtol=SCORE_RTOL, atol=1e-5)


def test_nbest_and_sampling_have_the_saved_model_s_shapes(server):
    nbest = _predict(server, "ct2", "translate_nbest", n=2, beam_size=3, alpha=0.6,
                     extra_length=4).json()["outputs"]
    assert np.shape(nbest["translations"]) == (len(SENTENCES), 2)
    assert np.shape(nbest["scores"]) == (len(SENTENCES), 2)
    assert nbest["translations"][3] == ["", ""]
    sample = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 3, "extra_length": 4}
    sampled = _predict(server, "ct2", "translate_sample", **sample).json()["outputs"]
    greedy = _predict(server, "ct2", "translate_with_options", beam_size=1, alpha=0.0,
                      extra_length=4).json()["outputs"]
    assert sampled["translation"] == greedy["translation"]


def test_the_same_refusals_as_the_saved_model(server):
    for options, message in [
            ({"beam_size": 2**30 + 1, "alpha": 0.6, "extra_length": 4},
             "beam_size must be between 1 and"),
            ({"beam_size": 2, "alpha": float("nan"), "extra_length": 4},
             "alpha must be a finite number"),
            ({"beam_size": 2, "alpha": 0.6, "extra_length": 2**31 - 1},
             "extra_length must be between 0 and")]:
        answers = [requests.post(f"{server}/v1/models/{model}:predict", timeout=60,
                                 data=_json({"signature_name": "translate_with_options",
                                             "inputs": {"text": ["a"], **options}}),
                                 headers={"Content-Type": "application/json"})
                   for model in ("sm", "ct2")]
        for answer in answers:
            assert answer.status_code == 400 and message in answer.json()["error"], answer.text
    refused = _predict(server, "ct2", "translate_nbest", n=4, beam_size=3, alpha=0.6,
                       extra_length=4)
    assert refused.status_code == 400 and "n must be between 1 and 3, received" in refused.text


def _json(document):
    import json

    return json.dumps(document)


def test_status_metadata_and_the_playground(server):
    status = requests.get(f"{server}/v1/models/ct2", timeout=30).json()
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    metadata = requests.get(f"{server}/v1/models/ct2/metadata", timeout=30).json()
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == set(SPECS)
    info = requests.get(f"{server}/playground/info", timeout=30).json()
    assert info["model_name"] == "sm" and info["engine"] == "savedmodel"


def test_the_servable_runs_without_a_server(exports):
    servable = CTranslate2Servable(exports["ct2"], 1)
    assert servable.examples == ["the dog sees a cat"]
    assert servable.metadata["engine"] == "ctranslate2"
    out = servable.predict("serving_default",
                           {"text": np.array([s.encode() for s in SENTENCES], object)})
    assert out["translation"].dtype == object and out["score"].dtype == np.float32
    assert out["translation"][3] == b"" and out["score"][3] == 0.0


def test_sixteen_clients_and_a_new_version_on_ctranslate2(tmp_path):
    """The load test's checks on the CTranslate2 engine: 16 clients send
    valid requests (1-4 sentences) and faulty ones while version 2 is
    published; every valid answer is version 1's or 2's own (computed in
    this process with the same engine), only version 2's once the status
    shows it, faulty ones get their 4xx, nothing gets a 5xx."""
    import concurrent.futures
    import itertools
    import random
    import shutil
    import time

    base = tmp_path / "served" / "tiny"
    one = export_tiny_ctranslate2(tmp_path / "v", name="a", version=1, seed=1)
    two = export_tiny_ctranslate2(tmp_path / "v", name="b", version=2, seed=2)
    os.makedirs(base)
    shutil.copytree(one, base / "1")
    staged = tmp_path / "staged-2"
    shutil.copytree(two, staged)
    sentences = ["the dog sees a cat", "a red house", "two men", "", "a girl runs",
                 "the small boy eats an apple", "Ein Hund.", "many birds fly"]
    expected = {}
    for version, path in ((1, one), (2, two)):
        servable = CTranslate2Servable(path, version)
        out = servable.predict("serving_default",
                               {"text": np.array([s.encode() for s in sentences], object)})
        expected[version] = {s: (t.decode("utf-8", "replace"), float(score))
                             for s, t, score in zip(sentences, out["translation"],
                                                    out["score"])}
    process, url = start_server(["--model-name", "tiny", "--model-base-path", str(base),
                                 "--enable-batching", "--file-system-poll-wait-seconds", "0.2"])
    rng = random.Random(0)
    work = []
    for i in range(400):
        if i % 10 == 9:
            work.append(("bad", b'{"inputs": {"text": [1]}}', 400))
        elif i % 10 == 8:
            work.append(("unknown", b'{"inputs": {"text": ["a"]}}', 404))
        else:
            work.append(("ok", rng.sample(sentences, rng.randint(1, 4)), 200))
    seen_two = []
    failures = []
    answered = []  # the version of each answer that tells them apart

    def client(items):
        # Until a second after version 2 showed AVAILABLE (at most a minute).
        deadline = time.monotonic() + 60
        with requests.Session() as session:
            for kind, payload, status in itertools.cycle(items):
                sent = time.monotonic()
                if sent > deadline or (seen_two and sent > seen_two[0] + 1.0):
                    return
                path = "nope" if kind == "unknown" else "tiny"
                if kind == "ok":
                    answer = session.post(f"{url}/v1/models/{path}:predict", timeout=60,
                                          json={"inputs": {"text": payload}})
                else:
                    answer = session.post(f"{url}/v1/models/{path}:predict", timeout=60,
                                          data=payload,
                                          headers={"Content-Type": "application/json"})
                if answer.status_code != status:
                    failures.append((kind, answer.status_code, answer.text[:200]))
                    continue
                if kind != "ok":
                    continue
                outputs = answer.json()["outputs"]
                allowed = (2,) if seen_two and sent > seen_two[0] else (1, 2)
                matches = [v for v in allowed
                           if outputs["translation"] == [expected[v][s][0] for s in payload]
                           and np.allclose(outputs["score"],
                                           [expected[v][s][1] for s in payload],
                                           rtol=SCORE_RTOL, atol=1e-5)]
                if not matches:
                    failures.append(("wrong answer", payload, outputs, allowed))
                elif all(expected[1][s] != expected[2][s] for s in payload if s):
                    answered.append(matches[0])

    try:
        with concurrent.futures.ThreadPoolExecutor(17) as pool:
            futures = [pool.submit(client, work[k::16]) for k in range(16)]
            time.sleep(1.0)
            os.rename(staged, base / "2")  # published mid-run, as kt-export does
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = requests.get(f"{url}/v1/models/tiny", timeout=30).json()
                states = {int(v["version"]): v["state"]
                          for v in status["model_version_status"]}
                if states.get(2) == "AVAILABLE":
                    seen_two.append(time.monotonic())
                    break
                time.sleep(0.05)
            for future in futures:
                future.result()
    finally:
        stop_server(process)
    assert seen_two, "version 2 never became AVAILABLE"
    assert failures == [], failures[:5]
    # The swap happened under load: both versions answered.
    assert answered.count(1) > 0 and answered.count(2) > 0, answered
    assert "Traceback" not in process.stderr_text
