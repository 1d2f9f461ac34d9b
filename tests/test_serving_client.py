"""The REST client against a stub server on 127.0.0.1 that answers like TF
Serving's predict API."""

import base64
import http.server
import json
import threading

import pytest

from keras_transformer.export.client import RestClient, ServingError

pytest.importorskip("requests")


class _StubServing(http.server.BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _StubServing.requests.append((self.path, body))
        texts = body["inputs"]["text"]
        if any(t == "FAIL" for t in texts):
            status, answer = 400, {"error": "beam_size must be between 1 and 166"}
        else:
            decoded = [base64.b64decode(t["b64"]).decode("utf-8", "replace")
                       if isinstance(t, dict) else t for t in texts]
            status = 200
            answer = {"outputs": {"translation": [t.upper() for t in decoded],
                                  "score": [-float(len(t)) for t in decoded]}}
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
    with pytest.raises(ValueError, match="together"):
        client.request_body(["x"], beam_size=2)


def test_server_errors_are_raised_with_their_message(server):
    with pytest.raises(ServingError, match="400.*beam_size must be between"):
        RestClient(server).translate(["FAIL"])
    with pytest.raises(TypeError, match="list"):
        RestClient(server).translate("one string")
