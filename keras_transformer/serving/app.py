"""kt-serve's HTTP application (Starlette) and its uvicorn server.

Routes (TF Serving's REST API for one model, plus a playground):

- `POST /v1/models/<name>[/versions/<v>]:predict`: predict (`rest_api`).
- `GET /v1/models/<name>[/versions/<v>]`: model status.
- `GET /v1/models/<name>[/versions/<v>]/metadata`: signatures' inputs and
  outputs.
- `GET /v1/models/<name>/batching`: batching counters (kt-serve's own:
  `{"enabled": false}` without --enable-batching).
- `GET /`: `playground/index.html`; `GET /playground/<file>`: the files of
  `playground/`; `GET /playground/info`: the served version's name,
  decoding defaults and example sentences.

Every error is TF Serving's JSON body `{"error": "<message>"}`: 400 for a
bad request (including the model rejecting its inputs), 404 for an unknown
model, version or path, 405 for a wrong method, 413 for a body over the
size limit, 503 when the batch queue is full; an unexpected exception is a
500 with its traceback logged. Model calls and JSON conversion run on
worker threads, so the event loop keeps answering while models run.
"""

import asyncio
import concurrent.futures
import logging
import mimetypes
import os
import re
import socket
import sys

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from keras_transformer.serving import rest_api
from keras_transformer.serving.batching import QueueFull, TaskTooLarge, batch_key, batchable
from keras_transformer.serving.limits import DEFAULT_MAX_BEAM_SIZE, DEFAULT_MAX_REQUEST_SENTENCES
from keras_transformer.serving.model_versions import ModelError, ModelOverloaded
from keras_transformer.serving.rest_api import RestError

LOGGER = logging.getLogger("kt-serve")
PLAYGROUND_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "playground")

_MODEL_PATH = re.compile(
    # At most 18 digits: an int64, and no huge number reaches int().
    r"(?P<name>[^/:]+)(?:/versions/(?P<version>[0-9]{1,18}))?"
    r"(?:(?P<predict>:predict)|(?P<metadata>/metadata)|(?P<other>:[A-Za-z]+))?")
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_BATCHING_PATH = re.compile(r"(?P<name>[^/:]+)/batching")


def json_response(document, status=200, headers=None):
    return Response(rest_api.dumps(document), status, headers=headers,
                    media_type="application/json")


def error_response(message, status, headers=None):
    return json_response({"error": message}, status, headers)


class ServingApp:
    """The application's state and endpoints.

    Args:
        model_name: the served model's name (the `<name>` of the URLs).
        versions: a `model_versions.VersionManager` (started).
        batcher: a `batching.BatchScheduler`, or None (no batching).
        max_request_bytes: the largest request body accepted (413 beyond).
        max_request_sentences: the most sentences (rows) one request may
            hold (400 beyond), batching or not.
        max_beam_size: the largest `beam_size` a request may ask for (400
            beyond); the model's own limit, half its vocabulary, still holds.
        playground_dir: where `/` and `/playground/<file>` read from.
        executor: runs model calls and JSON conversion (default: a thread
            pool of its own).
    """

    def __init__(self, model_name, versions, batcher=None, max_request_bytes=1 << 20,
                 playground_dir=PLAYGROUND_DIR, executor=None,
                 max_request_sentences=DEFAULT_MAX_REQUEST_SENTENCES,
                 max_beam_size=DEFAULT_MAX_BEAM_SIZE):
        self.model_name = model_name
        self.versions = versions
        self.batcher = batcher
        self.max_request_bytes = max_request_bytes
        self.max_request_sentences = max_request_sentences
        self.max_beam_size = max_beam_size
        self.playground_dir = playground_dir
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(
            thread_name_prefix="kt-serve-predict")
        self.app = Starlette(
            routes=[
                Route("/", self.index, methods=["GET"]),
                Route("/playground/info", self.playground_info, methods=["GET"]),
                Route("/playground/{file}", self.playground_file, methods=["GET"]),
                # Every method: a wrong one gets TF Serving's JSON error (405).
                Route("/v1/models/{path:path}", self.models, methods=_ALL_METHODS),
            ],
            exception_handlers={HTTPException: self._http_error, Exception: self._crash},
        )

    # Errors -----------------------------------------------------------------

    async def _http_error(self, request, error):
        messages = {404: f"Not found: {request.method} {request.url.path}",
                    405: f"Method {request.method} not allowed for {request.url.path}"}
        return error_response(messages.get(error.status_code, str(error.detail)),
                              error.status_code, getattr(error, "headers", None))

    async def _crash(self, request, error):
        LOGGER.error("Unexpected error answering %s %s", request.method, request.url.path,
                     exc_info=error)
        return error_response(f"Internal error: {type(error).__name__}: {error}", 500)

    # Playground -------------------------------------------------------------

    async def index(self, request):
        return self._static("index.html")

    async def playground_file(self, request):
        return self._static(request.path_params["file"])

    def _static(self, name):
        # Only a file listed in the directory: no path tricks reach outside.
        try:
            listed = name in os.listdir(self.playground_dir)
        except FileNotFoundError:
            listed = False
        path = os.path.join(self.playground_dir, name)
        if not listed or not os.path.isfile(path):
            return error_response(f"Not found: playground/{name}", 404)
        media_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return FileResponse(path, media_type=media_type,
                            headers={"Cache-Control": "no-cache"})

    async def playground_info(self, request):
        servable = self.versions.get()
        if servable is None:
            return error_response(f"Servable not found for request: "
                                  f"Latest({self.model_name})", 404)
        metadata = servable.metadata
        return json_response({
            "model_name": self.model_name, "version": servable.version,
            "beam_size": metadata.get("beam_size"), "alpha": metadata.get("alpha"),
            "extra_length": metadata.get("extra_length"), "examples": servable.examples,
        })

    # TF Serving's API ---------------------------------------------------------

    async def models(self, request):
        try:
            return await self._models(request)
        except Exception as error:  # a 500 with the traceback logged, never a hang
            return await self._crash(request, error)

    async def _models(self, request):
        path = request.path_params["path"]
        method = request.method
        batching = _BATCHING_PATH.fullmatch(path)
        match = _MODEL_PATH.fullmatch(path)
        if batching:
            if method not in ("GET", "HEAD"):
                return self._not_allowed(request, "GET")
            return self._batching(batching.group("name"))
        if match is None:
            return error_response(f"Malformed request: {method} {request.url.path}", 404)
        if match.group("other"):
            return error_response(
                f"Malformed request: {method} {request.url.path} (kt-serve serves "
                ":predict; :classify and :regress are TF Serving's Example APIs)", 404)
        name = match.group("name")
        version = int(match.group("version")) if match.group("version") else None
        if match.group("predict"):
            if method != "POST":
                return self._not_allowed(request, "POST")
            return await self._predict(request, name, version)
        if method not in ("GET", "HEAD"):
            return self._not_allowed(request, "GET")
        if match.group("metadata"):
            return self._metadata(name, version)
        return self._status(name, version)

    def _not_allowed(self, request, allowed):
        return error_response(f"Method {request.method} not allowed for {request.url.path} "
                              f"(use {allowed})", 405, {"Allow": allowed})

    def _servable(self, name, version):
        """The servable a request names, or `RestError` 404 in TF
        Serving's words."""
        servable = self.versions.get(version) if name == self.model_name else None
        if servable is None:
            which = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise RestError(f"Servable not found for request: {which}", 404)
        return servable

    def _status(self, name, version):
        entries = self.versions.status(version) if name == self.model_name else []
        if not entries:
            message = (f"Could not find any versions of model {name}" if version is None
                       else f"Could not find version {version} of model {name}")
            return error_response(message, 404)
        return json_response(rest_api.model_status(entries))

    def _metadata(self, name, version):
        try:
            servable = self._servable(name, version)
        except RestError as e:
            return error_response(e.message, e.status)
        return json_response(rest_api.model_metadata(name, servable.version, servable.specs))

    def _batching(self, name):
        if name != self.model_name:
            return error_response(f"Servable not found for request: Latest({name})", 404)
        if self.batcher is None:
            return json_response({"enabled": False})
        return json_response({"enabled": True, **self.batcher.statistics()})

    async def _predict(self, request, name, version):
        try:
            servable = self._servable(name, version)
            body = await self._read_body(request)
            loop = asyncio.get_running_loop()
            parsed = await loop.run_in_executor(self.executor, _parse, body, servable.specs)
            self._check_work(parsed.inputs)
            spec = servable.specs[parsed.signature_name]

            def run(inputs):
                return servable.predict(parsed.signature_name, inputs)

            if self.batcher is not None and batchable(spec):
                key = (servable.version, id(servable), parsed.signature_name,
                       batch_key(parsed.inputs))
                outputs = await self.batcher.submit(key, parsed.inputs, run)
            else:
                outputs = await loop.run_in_executor(self.executor, run, parsed.inputs)
            answer = await loop.run_in_executor(self.executor, _answer, outputs,
                                                parsed.row_format)
        except RestError as e:
            return error_response(e.message, e.status)
        except ModelError as e:
            return error_response(e.args[0], 400)
        except ModelOverloaded as e:
            return error_response(e.args[0], 503)
        except QueueFull as e:
            return error_response(str(e), 503)
        except TaskTooLarge as e:
            return error_response(str(e), 400)
        return Response(answer, 200, media_type="application/json")

    def _check_work(self, inputs):
        """Refuses (400) a request over `max_request_sentences` rows or
        `max_beam_size`."""
        rows = max((len(value) for value in inputs.values() if np.ndim(value) >= 1),
                   default=0)
        if rows > self.max_request_sentences:
            raise RestError(f"The request holds {rows} sentences, more than "
                            f"--max-request-sentences ({self.max_request_sentences}); send "
                            "them in several requests.")
        beam_size = inputs.get("beam_size")
        if beam_size is not None and np.ndim(beam_size) == 0 \
                and int(beam_size) > self.max_beam_size:
            raise RestError(f"beam_size {int(beam_size)} is larger than --max-beam-size "
                            f"({self.max_beam_size}).")

    async def _read_body(self, request):
        """The body, refusing (413) one over `max_request_bytes` before
        reading it when its Content-Length says so, else as soon as it
        grows past the limit."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RestError(f"The request body has {int(declared)} bytes, over the limit of "
                            f"{limit} (--max-request-bytes).", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RestError(f"The request body has more than {limit} bytes, the limit "
                                "(--max-request-bytes).", 413)
            chunks.append(chunk)
        return b"".join(chunks)


def _parse(body, specs):
    return rest_api.parse_predict_request(rest_api.decode_body(body), specs)


def _answer(outputs, row_format):
    return rest_api.dumps(rest_api.predict_response(outputs, row_format))


def create_app(model_name, versions, batcher=None, max_request_bytes=1 << 20,
               playground_dir=PLAYGROUND_DIR):
    """The Starlette application serving `versions` as `model_name` (see
    `ServingApp`)."""
    return ServingApp(model_name, versions, batcher, max_request_bytes, playground_dir).app


def bind(host, port):
    """A listening-ready TCP socket bound to `host:port` (port 0: a free
    one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"Cannot listen on {host}:{port}: {e.strerror}.") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock):
    """`http://host:port` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(app, sock, ready=None):
    """Serves `app` on `sock` with uvicorn until SIGINT or SIGTERM; calls
    `ready()` once it accepts connections. Logs go to stderr; no access
    log."""
    import uvicorn

    configure_logging()
    config = uvicorn.Config(app, log_config=None, access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    async def main():
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and ready is not None:
            ready()
        await task

    asyncio.run(main())


class StderrHandler(logging.StreamHandler):
    """A log handler writing to whatever `sys.stderr` is when it writes
    (so a caller that swaps stderr, e.g. a test, never sees a closed one)."""

    def __init__(self, level=logging.NOTSET):
        logging.Handler.__init__(self, level)

    @property
    def stream(self):
        return sys.stderr


def configure_logging():
    """kt-serve's and uvicorn's logs to stderr, INFO and above (stdout
    carries the ready line only). Touches only those two loggers: a
    `logging.config.dictConfig` would close every other handler, some of
    them on streams the caller owns."""
    formatter = logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s")
    for name in ("kt-serve", "uvicorn"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not any(isinstance(h, StderrHandler) for h in logger.handlers):
            handler = StderrHandler()
            handler.setFormatter(formatter)
            logger.addHandler(handler)
    # uvicorn.error and uvicorn.access reach the handler through "uvicorn".
    logging.getLogger("uvicorn").propagate = False
