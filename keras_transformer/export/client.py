"""Clients for a TF Serving model server running an exported translator.

REST needs `requests` (the `serving` extra); gRPC needs
`tensorflow-serving-api` (the `grpc` extra). Both are imported lazily.

REST request (`POST /v1/models/<name>[/versions/<v>]:predict`)::

    {"signature_name": "serving_default", "inputs": {"text": ["Ein Hund."]}}

response::

    {"outputs": {"translation": ["A dog."], "score": [-0.41]}}

With `xla=True` the clients ask for the `translate_xla` signature (same
answers, several times faster on CPU), which the server runs only when
started with `--xla_cpu_compilation_enabled=true`.
"""

import base64

DEFAULT_URL = "http://localhost:8501"
DEFAULT_SIGNATURE = "serving_default"
XLA_SIGNATURE = "translate_xla"


class ServingError(RuntimeError):
    """The model server refused or failed a request."""


def _json_string(text):
    """A sentence as TF Serving's JSON takes it: a string if it is valid
    UTF-8, else `{"b64": ...}` (decoded back to bytes by the server)."""
    if isinstance(text, str):
        return text
    try:
        return bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(bytes(text)).decode("ascii")}


class RestClient:
    """Translates through TF Serving's REST API.

    Args:
        url: the server's REST address (`--rest_api_port`, 8501 by default).
        model: the model name (the `<name>` of `saved_models/<name>/`).
        version: pin a version; None: the newest the server has loaded.
        timeout: seconds per request.
        session: a `requests.Session` (default: a new one).
        xla: ask for the `translate_xla` signature for requests without
            options (see the module docstring).
    """

    def __init__(self, url=DEFAULT_URL, model="transformer", version=None, timeout=60.0,
                 session=None, xla=False):
        self.url = url.rstrip("/")
        self.model = model
        self.version = version
        self.timeout = timeout
        self._session = session
        self.signature = XLA_SIGNATURE if xla else DEFAULT_SIGNATURE

    @property
    def session(self):
        if self._session is None:
            try:
                import requests
            except ImportError as error:  # pragma: no cover - depends on the env
                raise ImportError(
                    "RestClient needs `requests`: pip install 'attention-transformer-keras[serving]'"
                ) from error
            self._session = requests.Session()
        return self._session

    @property
    def predict_url(self):
        version = f"/versions/{int(self.version)}" if self.version is not None else ""
        return f"{self.url}/v1/models/{self.model}{version}:predict"

    def request_body(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """The JSON body for `sentences` (list of str/bytes). With any option
        given, the `translate_with_options` signature (XLA-free) with all
        three."""
        if isinstance(sentences, (str, bytes)):
            raise TypeError("`sentences` must be a list of sentences, not one string.")
        inputs = {"text": [_json_string(s) for s in sentences]}
        options = {"beam_size": beam_size, "alpha": alpha, "extra_length": extra_length}
        if all(v is None for v in options.values()):
            return {"signature_name": self.signature, "inputs": inputs}
        missing = [k for k, v in options.items() if v is None]
        if missing:
            raise ValueError(
                f"Give beam_size, alpha and extra_length together (missing {missing}): "
                "the translate_with_options signature has no defaults."
            )
        inputs.update(beam_size=int(beam_size), alpha=float(alpha),
                      extra_length=int(extra_length))
        return {"signature_name": "translate_with_options", "inputs": inputs}

    @staticmethod
    def parse_response(status_code, body):
        """`(translations, scores)` from a response, or `ServingError`."""
        if status_code != 200 or "error" in body:
            raise ServingError(
                f"TF Serving answered {status_code}: {body.get('error', body)}"
            )
        outputs = body["outputs"]
        return list(outputs["translation"]), [float(s) for s in outputs["score"]]

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """`(translations: list of str, scores: list of float)`."""
        if not sentences:
            return [], []
        response = self.session.post(
            self.predict_url, json=self.request_body(sentences, beam_size, alpha, extra_length),
            timeout=self.timeout,
        )
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:500]}
        return self.parse_response(response.status_code, body)


class GrpcClient:
    """Translates through TF Serving's gRPC API (port 8500 by default).
    Needs `tensorflow-serving-api` and `grpcio`. `xla`: as `RestClient`."""

    def __init__(self, target="localhost:8500", model="transformer", version=None,
                 timeout=60.0, xla=False):
        try:
            import grpc
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
        except ImportError as error:
            raise ImportError(
                "GrpcClient needs tensorflow-serving-api: "
                "pip install 'attention-transformer-keras[grpc]'"
            ) from error
        self._predict_pb2 = predict_pb2
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(
            grpc.insecure_channel(target)
        )
        self.model = model
        self.version = version
        self.timeout = timeout
        self.signature = XLA_SIGNATURE if xla else DEFAULT_SIGNATURE

    def translate(self, sentences):
        import tensorflow as tf

        request = self._predict_pb2.PredictRequest()
        request.model_spec.name = self.model
        request.model_spec.signature_name = self.signature
        if self.version is not None:
            request.model_spec.version.value = int(self.version)
        request.inputs["text"].CopyFrom(tf.make_tensor_proto(
            [s.encode("utf-8") if isinstance(s, str) else s for s in sentences], tf.string
        ))
        result = self.stub.Predict(request, self.timeout)
        translations = tf.make_ndarray(result.outputs["translation"])
        scores = tf.make_ndarray(result.outputs["score"])
        return [t.decode("utf-8") for t in translations], [float(s) for s in scores]
