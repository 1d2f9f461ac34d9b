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

`RestClient` is a `TranslationEngine` (`export/engine.py`): it also asks
for n-best lists (`translate_nbest`), samples (`translate_sample`) and
explanations (`translate_explain`), and an option left None means the
model's default, as with the other engines. Only `serving_default` (and
`translate_xla`) applies the model's defaults on the server; TF Serving
takes no default for an input of the other signatures, so the client sends
every option they take, the ones left None from the model's defaults as the
client was given them (`RestClient(defaults=...)`, e.g. the export's
`read_metadata`). Without them, a request that needs one is refused
(`ValueError`) rather than sent with values that may not be the model's.
"""

import base64

from keras_transformer.export.engine import (
    SERVING_DEFAULT,
    TRANSLATE_EXPLAIN,
    TRANSLATE_NBEST,
    TRANSLATE_SAMPLE,
    TRANSLATE_WITH_OPTIONS,
    TRANSLATE_XLA,
    ExplainingEngine,
)

DEFAULT_URL = "http://localhost:8501"
DEFAULT_SIGNATURE = SERVING_DEFAULT
XLA_SIGNATURE = TRANSLATE_XLA
# The keys of the model's decoding defaults in `assets.extra/translator.json`.
DECODING_DEFAULTS = ("beam_size", "alpha", "extra_length")


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


class RestClient(ExplainingEngine):
    """Translates through TF Serving's REST API.

    Args:
        url: the server's REST address (`--rest_api_port`, 8501 by default).
        model: the model name (the `<name>` of `saved_models/<name>/`).
        version: pin a version; None: the newest the server has loaded.
        timeout: seconds per request.
        session: a `requests.Session` (default: a new one).
        xla: ask for the `translate_xla` signature for requests without
            options (see the module docstring).
        defaults: the model's decoding defaults, a mapping with
            `beam_size`, `alpha` and `extra_length` (more keys are
            ignored): the export's `assets.extra/translator.json`
            (`export.saved_model.read_metadata`), or kt-serve's
            `/playground/info`. They fill the options left None where the
            signature needs them. None: unknown; such a request must give
            every option it needs.
    """

    def __init__(self, url=DEFAULT_URL, model="transformer", version=None, timeout=60.0,
                 session=None, xla=False, defaults=None):
        self.url = url.rstrip("/")
        self.model = model
        self.version = version
        self.timeout = timeout
        self._session = session
        self.signature = XLA_SIGNATURE if xla else DEFAULT_SIGNATURE
        if defaults is not None:
            missing = [k for k in DECODING_DEFAULTS if defaults.get(k) is None]
            if missing:
                raise ValueError(f"`defaults` lacks {missing}: give the model's "
                                 f"{', '.join(DECODING_DEFAULTS)}.")
            defaults = {k: defaults[k] for k in DECODING_DEFAULTS}
        self.defaults = defaults

    @property
    def session(self):
        if self._session is None:
            try:
                import requests
            except ImportError as error:  # pragma: no cover - depends on the env
                raise ImportError(
                    "RestClient needs `requests`: "
                    "pip install 'attention-transformer-keras[serving]'"
                ) from error
            self._session = requests.Session()
        return self._session

    @property
    def predict_url(self):
        version = f"/versions/{int(self.version)}" if self.version is not None else ""
        return f"{self.url}/v1/models/{self.model}{version}:predict"

    def request_body(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """The JSON body for `sentences` (list of str/bytes). Without
        options, the client's signature (`serving_default` or
        `translate_xla`: the server applies the model's defaults); with
        any, the `translate_with_options` signature (XLA-free) with all
        three, those left None from `defaults`."""
        if isinstance(sentences, (str, bytes)):
            raise TypeError("`sentences` must be a list of sentences, not one string.")
        inputs = {"text": [_json_string(s) for s in sentences]}
        if beam_size is None and alpha is None and extra_length is None:
            return {"signature_name": self.signature, "inputs": inputs}
        inputs.update(self._options(TRANSLATE_WITH_OPTIONS, beam_size=beam_size, alpha=alpha,
                                    extra_length=extra_length))
        return {"signature_name": TRANSLATE_WITH_OPTIONS, "inputs": inputs}

    def _options(self, signature, **options):
        """`options` as `signature` takes them (`beam_size`, `extra_length`
        int; `alpha` float), those None from `defaults`; `ValueError` naming
        the ones left None when the defaults are unknown."""
        missing = [k for k, v in options.items() if v is None]
        if missing and self.defaults is None:
            raise ValueError(
                f"The {signature} signature takes {', '.join(options)}, and TF Serving "
                f"applies no default to a signature input: give {', '.join(missing)}, or "
                "the model's defaults as RestClient(defaults=...) (the export's "
                "assets.extra/translator.json, `read_metadata`).")
        cast = {"beam_size": int, "alpha": float, "extra_length": int}
        return {k: cast[k](self.defaults[k] if v is None else v) for k, v in options.items()}

    @staticmethod
    def parse_response(status_code, body):
        """`(translations, scores)` from a response, or `ServingError`."""
        outputs = RestClient._checked(status_code, body)["outputs"]
        return list(outputs["translation"]), [float(s) for s in outputs["score"]]

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """`(translations: list of str, scores: list of float)`; see
        `request_body` for the signature asked for."""
        if not sentences:
            return [], []
        status, body = self._post(self.request_body(sentences, beam_size, alpha, extra_length))
        return self.parse_response(status, body)

    def predict(self, signature_name, inputs):
        """One predict request in the columnar format: `inputs` a dict of
        JSON-able values (sentences as str, or bytes sent as b64). Returns
        the response's `outputs` dict; `ServingError` on an error answer."""
        inputs = dict(inputs)
        if "text" in inputs:
            if isinstance(inputs["text"], (str, bytes)):
                raise TypeError("`text` must be a list of sentences, not one string.")
            inputs["text"] = [_json_string(s) for s in inputs["text"]]
        return self._checked(*self._post({"signature_name": signature_name,
                                          "inputs": inputs}))["outputs"]

    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None):
        """The `n` best translations of each sentence (`translate_nbest`):
        a list per sentence of `n` `(str, float)` pairs, best first.
        `beam_size` None: `max(n, the default beam size)`; None options
        from `defaults`."""
        if not sentences:
            return []
        if beam_size is None and self.defaults is not None:
            beam_size = max(n, self.defaults["beam_size"])
        options = self._options(TRANSLATE_NBEST, beam_size=beam_size, alpha=alpha,
                                extra_length=extra_length)
        outputs = self.predict(TRANSLATE_NBEST, {"text": sentences, "n": int(n), **options})
        return [[(t, float(s)) for t, s in zip(texts, scores)]
                for texts, scores in zip(outputs["translations"], outputs["scores"])]

    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None):
        """One sampled translation per sentence (`translate_sample`; the
        same seed and sentence, the same sample): `(translations,
        scores)`. `extra_length` None: from `defaults`."""
        if not sentences:
            return [], []
        outputs = self.predict(TRANSLATE_SAMPLE, {
            "text": sentences, "temperature": float(temperature), "top_k": int(top_k),
            "top_p": float(top_p), "seed": int(seed),
            **self._options(TRANSLATE_SAMPLE, extra_length=extra_length)})
        return list(outputs["translation"]), [float(s) for s in outputs["score"]]

    def explain(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """Each sentence's translation explained (`translate_explain`): a
        dict per sentence with `translation`, `score`, `source_pieces`,
        `target_pieces`, `token_log_probs` and `alignment` (target pieces
        x source pieces), trimmed to the sentence's own lengths. None
        options from `defaults`."""
        if not sentences:
            return []
        out = self.predict(TRANSLATE_EXPLAIN, {
            "text": sentences, **self._options(TRANSLATE_EXPLAIN, beam_size=beam_size,
                                               alpha=alpha, extra_length=extra_length)})
        explained = []
        for b, translation in enumerate(out["translation"]):
            s, t = int(out["source_length"][b]), int(out["target_length"][b])
            explained.append({
                "translation": translation,
                "score": float(out["score"][b]),
                "source_pieces": list(out["source_pieces"][b][:s]),
                "target_pieces": list(out["target_pieces"][b][:t]),
                "token_log_probs": [float(x) for x in out["token_log_probs"][b][:t]],
                "alignment": [[float(x) for x in row[:s]] for row in out["alignment"][b][:t]],
            })
        return explained

    def status(self):
        """The model's version status (`GET /v1/models/<name>[/versions/<v>]`)
        as the server's JSON: `{"model_version_status": [...]}`."""
        version = f"/versions/{int(self.version)}" if self.version is not None else ""
        response = self.session.get(f"{self.url}/v1/models/{self.model}{version}",
                                    timeout=self.timeout)
        return self._checked(response.status_code, self._json(response))

    @staticmethod
    def _checked(status_code, body):
        """`body`, or `ServingError` with the server's message when the
        response is an error."""
        if status_code != 200 or "error" in body:
            raise ServingError(f"TF Serving answered {status_code}: {body.get('error', body)}")
        return body

    def _post(self, body):
        response = self.session.post(self.predict_url, json=body, timeout=self.timeout)
        return response.status_code, self._json(response)

    @staticmethod
    def _json(response):
        try:
            return response.json()
        except ValueError:
            return {"error": response.text[:500]}


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
