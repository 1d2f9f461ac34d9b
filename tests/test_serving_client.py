"""The REST client against a stub server on 127.0.0.1 that answers like TF
Serving's predict API."""

import base64
import http.server
import json
import threading

import pytest

from keras_transformer.serving.client import RestClient, ServingError

pytest.importorskip("requests")

# A model exported with other defaults than the paper's, as its
# assets.extra/translator.json records them.
MODEL_DEFAULTS = {"beam_size": 3, "alpha": 1.0, "extra_length": 7, "max_source_tokens": 99}


class _StubServing(http.server.BaseHTTPRequestHandler):
    requests = []

    def do_GET(self):
        self._answer(200, {"model_version_status": [
            {"version": "3", "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _StubServing.requests.append((self.path, body))
        texts = body["inputs"]["text"]
        signature = body["signature_name"]
        if any(t == "FAIL" for t in texts):
            status, answer = 400, {"error": "beam_size must be between 1 and 166"}
        elif signature == "translate_nbest":
            n = body["inputs"]["n"]
            status, answer = 200, {"outputs": {
                "translations": [[f"{t}#{k}" for k in range(n)] for t in texts],
                "scores": [[-1.0 - k for k in range(n)] for _ in texts]}}
        elif signature == "translate_explain":
            # Padded to the batch's widest, as the signature returns them.
            status, answer = 200, {"outputs": {
                "translation": [t.upper() for t in texts], "score": [-2.0 for _ in texts],
                "source_pieces": [["a", "</s>", ""], ["b", "c", "</s>"]][:len(texts)],
                "target_pieces": [["A", "</s>"], ["", ""]][:len(texts)],
                "token_log_probs": [[-0.5, -0.25], [0.0, 0.0]][:len(texts)],
                "alignment": [[[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]],
                              [[0.0] * 3, [0.0] * 3]][:len(texts)],
                "source_length": [2, 3][:len(texts)], "target_length": [2, 0][:len(texts)]}}
        else:
            decoded = [base64.b64decode(t["b64"]).decode("utf-8", "replace")
                       if isinstance(t, dict) else t for t in texts]
            status = 200
            answer = {"outputs": {"translation": [t.upper() for t in decoded],
                                  "score": [-float(len(t)) for t in decoded]}}
        self._answer(status, answer)

    def _answer(self, status, answer):
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _StubServing.requests = []
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _StubServing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_translates_through_the_predict_api(server):
    client = RestClient(server, model="de_en", version=3)
    translations, scores = client.translate(["ein hund", "", b"caf\xc3"])
    assert translations == ["EIN HUND", "", "CAF\ufffd"]
    assert scores == [-8.0, -0.0, -4.0]
    path, body = _StubServing.requests[0]
    assert path == "/v1/models/de_en/versions/3:predict"
    assert body == {"signature_name": "serving_default",
                    "inputs": {"text": ["ein hund", "", {"b64": "Y2Fmww=="}]}}


def test_xla_clients_ask_for_the_xla_signature(server):
    client = RestClient(server, model="de_en", xla=True)
    assert client.translate(["ein hund"]) == (["EIN HUND"], [-8.0])
    client.translate(["x"], beam_size=2, alpha=0.0, extra_length=10)
    assert [body["signature_name"] for _, body in _StubServing.requests] == [
        "translate_xla", "translate_with_options"]


def test_options_use_their_signature(server):
    client = RestClient(server, model="de_en")
    client.translate(["x"], beam_size=2, alpha=0.0, extra_length=10)
    path, body = _StubServing.requests[0]
    assert path == "/v1/models/de_en:predict"
    assert body == {"signature_name": "translate_with_options",
                    "inputs": {"text": ["x"], "beam_size": 2, "alpha": 0.0, "extra_length": 10}}
    # The options left None need the model's defaults, which only a client
    # given them knows: none is made up.
    with pytest.raises(ValueError, match="give alpha, extra_length, or the model's defaults"):
        client.request_body(["x"], beam_size=2)
    told = RestClient(server, model="de_en", defaults=MODEL_DEFAULTS)
    assert told.request_body(["x"], beam_size=2)["inputs"] == {
        "text": ["x"], "beam_size": 2, "alpha": 1.0, "extra_length": 7}
    assert told.request_body(["x"]) == {"signature_name": "serving_default",
                                        "inputs": {"text": ["x"]}}


def test_server_errors_are_raised_with_their_message(server):
    with pytest.raises(ServingError, match="400.*beam_size must be between"):
        RestClient(server).translate(["FAIL"])
    with pytest.raises(TypeError, match="list"):
        RestClient(server).translate("one string")


def test_n_best_samples_and_explanations_send_every_input(server):
    client = RestClient(server, model="de_en", defaults=MODEL_DEFAULTS)
    assert client.translate_nbest(["x", "y"], 2) == [[("x#0", -1.0), ("x#1", -2.0)],
                                                   [("y#0", -1.0), ("y#1", -2.0)]]
    assert client.sample(["ein hund"], temperature=0.5, seed=7) == (["EIN HUND"], [-8.0])
    explained = client.explain(["a", "bc"], beam_size=2)
    # Trimmed to each sentence's own lengths.
    assert explained[0] == {"translation": "A", "score": -2.0, "source_pieces": ["a", "</s>"],
                            "target_pieces": ["A", "</s>"], "token_log_probs": [-0.5, -0.25],
                            "alignment": [[0.5, 0.5], [0.25, 0.75]]}
    assert explained[1]["target_pieces"] == [] and explained[1]["alignment"] == []
    assert explained[1]["source_pieces"] == ["b", "c", "</s>"]
    bodies = [body for _, body in _StubServing.requests]
    # Options left None are the model's defaults (not the paper's 4, 0.6, 50).
    assert bodies[0] == {"signature_name": "translate_nbest", "inputs": {
        "text": ["x", "y"], "n": 2, "beam_size": 3, "alpha": 1.0, "extra_length": 7}}
    assert bodies[1] == {"signature_name": "translate_sample", "inputs": {
        "text": ["ein hund"], "temperature": 0.5, "top_k": 0, "top_p": 1.0, "seed": 7,
        "extra_length": 7}}
    assert bodies[2] == {"signature_name": "translate_explain", "inputs": {
        "text": ["a", "bc"], "beam_size": 2, "alpha": 1.0, "extra_length": 7}}
    assert client.status()["model_version_status"][0]["state"] == "AVAILABLE"
    with pytest.raises(ServingError, match="400.*beam_size must be between"):
        client.explain(["FAIL"])


def test_without_the_models_defaults_a_request_needing_them_is_refused(server):
    client = RestClient(server, model="de_en")
    for call, missing in [
            (lambda: client.translate_nbest(["x"], 2), "beam_size, alpha, extra_length"),
            (lambda: client.translate_nbest(["x"], 2, beam_size=2, alpha=0.6),
             "give extra_length,"),
            (lambda: client.sample(["x"], seed=1), "give extra_length,"),
            (lambda: client.explain(["x"], beam_size=2), "give alpha, extra_length,")]:
        with pytest.raises(ValueError, match=missing):
            call()
    assert _StubServing.requests == []  # refused before sending
    # Every option given: sent as given.
    client.translate_nbest(["x"], 2, beam_size=2, alpha=0.0, extra_length=3)
    assert _StubServing.requests[0][1]["inputs"] == {
        "text": ["x"], "n": 2, "beam_size": 2, "alpha": 0.0, "extra_length": 3}
    with pytest.raises(ValueError, match=r"`defaults` lacks \['extra_length'\]"):
        RestClient(server, defaults={"beam_size": 4, "alpha": 0.6})
