"""kt-serve's HTTP application (Starlette); `server` runs it under uvicorn.

Routes (TF Serving's REST API, plus a playground; `[/versions/<v>]` may also
be `[/labels/<label>]`):

- `POST /v1/models/<name>[/versions/<v>]:predict`: predict (`rest_api`).
- `GET /v1/models/<name>[/versions/<v>]`: model status.
- `GET /v1/models/<name>[/versions/<v>]/metadata`: signatures' inputs and
  outputs.
- `GET /monitoring/prometheus/metrics`: the metrics (`metrics`), as TF
  Serving's `--monitoring_config_file` enables them.
- `GET /v1/models/<name>/batching`: batching counters (kt-serve's own:
  `{"enabled": false}` without --enable-batching).
- `GET /`: `playground/index.html`; `GET /playground/<file>`: the files of
  `playground/`; `GET /playground/info`: the served version's name,
  decoding defaults and example sentences.

Every error is TF Serving's JSON body `{"error": "<message>"}`: 400 for a
bad request (including the model rejecting its inputs, or asking for more
work than the limits allow), 404 for an unknown model, version, label or
path, 405 for a wrong method, 408 for a body not received within
`body_timeout`, 413 for a body over the size limit, 503 when a queue is
full, too many requests are in flight, or the model runs out of memory, 504
past `rest_api_timeout`; an unexpected exception is a 500 with its
traceback logged. A client that goes away costs one log line at most.
Model calls and JSON conversion run on worker threads, so the event loop
keeps answering while models run.

Predict requests from REST and gRPC (`grpc_service`) meet the same limits,
queues, batching and metrics through `ServingApp.run_predict`.
"""

import asyncio
import concurrent.futures
import logging
import mimetypes
import os
import re
import time

import numpy as np
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from keras_transformer.serving import limits, rest_api, work
from keras_transformer.serving.batching import (
    QUEUE_FULL_MESSAGE,
    QueueFull,
    TaskTooLarge,
    batch_key,
    batchable,
)
from keras_transformer.serving.metrics import CONTENT_TYPE, UNKNOWN_MODEL, Metrics
from keras_transformer.serving.model_versions import ModelError, ModelOverloaded
from keras_transformer.serving.models import ServedModels, single_model
from keras_transformer.serving.rest_api import RestError

LOGGER = logging.getLogger("kt-serve")
PLAYGROUND_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "playground")

_MODEL_PATH = re.compile(
    # At most 18 digits: an int64, and no huge number reaches int().
    r"(?P<name>[^/:]+)(?:/versions/(?P<version>[0-9]{1,18})|/labels/(?P<label>[^/:]+))?"
    r"(?:(?P<predict>:predict)|(?P<metadata>/metadata)|(?P<other>:[A-Za-z]+))?")
# HTTP statuses as TF Serving maps canonical error codes, and back.
STATUS_CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED",
                408: "DEADLINE_EXCEEDED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
                499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE",
                504: "DEADLINE_EXCEEDED"}
METRICS_PATH = "/monitoring/prometheus/metrics"


def status_code_name(status):
    """The canonical code name of an HTTP status, "OK" for 200, for
    metrics and gRPC."""
    return "OK" if status == 200 else STATUS_CODES.get(status, "UNKNOWN")
# Request bodies (and answers, estimated) up to this size are converted on
# the event loop; larger ones on a worker thread, so the loop keeps
# answering while a big one parses.
INLINE_BYTES = 16 * 1024
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_MODELS_PREFIX = "/v1/models/"
_BATCHING_PATH = re.compile(r"(?P<name>[^/:]+)/batching")


def json_response(document, status=200, headers=None):
    return Response(rest_api.dumps(document), status, headers=headers,
                    media_type="application/json")


def error_response(message, status, headers=None):
    return json_response({"error": message}, status, headers)


class ServingApp:
    """The application's state and endpoints.

    Args:
        models: a `models.ServedModels` (started), or a model name, with
            `versions` its `VersionManager`.
        versions: with a model name as `models`: its `VersionManager`.
        batcher: a `batching.BatchScheduler`, or None (no batching).
        max_request_bytes: the largest request body accepted (413 beyond).
        request_limits: a `work.RequestLimits`: the sentences, beam and work one
            request may ask for (400 beyond, naming the numbers), batching
            or not (default: kt-serve's defaults).
        chunk_work: an unbatched request of more work runs in row chunks of
            at most this much, one after another, so a deadline or a client
            that goes away stops the chunks not yet started.
        max_enqueued_requests: the most unbatched predict requests waiting
            for or running on the model at once (503 beyond).
        max_concurrent_requests: the most HTTP requests in flight at once,
            reading their body included (503 beyond).
        body_timeout: seconds a request's body may take to arrive (408
            beyond).
        rest_api_timeout: seconds a predict request may take in all (504
            beyond; the model call itself finishes in the background);
            None or 0: no limit.
        playground_dir: where `/` and `/playground/<file>` read from.
        executor: runs model calls and JSON conversion (default: a thread
            pool of its own).
        metrics: a `metrics.Metrics` (default: a new one); served at
            `metrics_path` (None: not served).
    """

    def __init__(self, models, versions=None, batcher=None, max_request_bytes=1 << 20,
                 playground_dir=PLAYGROUND_DIR, executor=None,
                 request_limits=None,
                 chunk_work=limits.DEFAULT_CHUNK_WORK,
                 max_enqueued_requests=limits.DEFAULT_MAX_ENQUEUED_REQUESTS,
                 max_concurrent_requests=limits.DEFAULT_MAX_CONCURRENT_REQUESTS,
                 body_timeout=limits.DEFAULT_BODY_TIMEOUT_SECONDS,
                 rest_api_timeout=limits.DEFAULT_REST_API_TIMEOUT_MS / 1000,
                 metrics=None, metrics_path=METRICS_PATH):
        if not isinstance(models, ServedModels):
            models = single_model(models, versions)
        self.models = models
        self.batcher = batcher
        self.max_request_bytes = max_request_bytes
        self.request_limits = request_limits or work.RequestLimits()
        self.chunk_work = chunk_work
        self.max_enqueued_requests = max_enqueued_requests
        self.max_concurrent_requests = max_concurrent_requests
        self.body_timeout = body_timeout
        self.rest_api_timeout = rest_api_timeout or None
        self.playground_dir = playground_dir
        self.metrics = metrics if metrics is not None else Metrics()
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(
            thread_name_prefix="kt-serve-predict")
        self._enqueued = 0  # unbatched predict requests on the model; event loop only
        self._in_flight = 0  # HTTP requests being answered; event loop only
        routes = [
            Route("/", self.index, methods=["GET"]),
            Route("/playground/info", self.playground_info, methods=["GET"]),
            Route("/playground/{file}", self.playground_file, methods=["GET"]),
            # Every method: a wrong one gets TF Serving's JSON error (405).
            Route(_MODELS_PREFIX + "{path:path}", self.models_endpoint, methods=_ALL_METHODS),
        ]
        if metrics_path:
            routes.append(Route(metrics_path, self.prometheus, methods=["GET"]))
        starlette = Starlette(
            routes=routes,
            exception_handlers={HTTPException: self._http_error, Exception: self._crash},
        )
        self.app = _FrontDoor(starlette, self)

    @property
    def model_name(self):
        """The default model's name (the playground's)."""
        return self.models.default_name

    @property
    def versions(self):
        """The default model's `VersionManager`."""
        return self.models.get(self.models.default_name)

    # Errors -----------------------------------------------------------------

    async def _http_error(self, request, error):
        messages = {404: f"Not found: {request.method} {request.url.path}",
                    405: f"Method {request.method} not allowed for {request.url.path}"}
        return error_response(messages.get(error.status_code, str(error.detail)),
                              error.status_code, getattr(error, "headers", None))

    async def _crash(self, request, error):
        return _internal_error(request.method, request.url.path, error)

    # Playground and metrics ---------------------------------------------------

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
        name = self.model_name
        manager = self.models.get(name) if name is not None else None
        servable = manager.get() if manager is not None else None
        if servable is None:
            return error_response(f"Servable not found for request: Latest({name})", 404)
        metadata = servable.metadata
        return json_response({
            "model_name": name, "version": servable.version,
            "beam_size": metadata.get("beam_size"), "alpha": metadata.get("alpha"),
            "extra_length": metadata.get("extra_length"), "examples": servable.examples,
            "engine": metadata.get("engine", "savedmodel"),
        })

    async def prometheus(self, request):
        return Response(self.metrics.exposition(), 200, media_type=CONTENT_TYPE)

    # TF Serving's API ---------------------------------------------------------

    async def models_endpoint(self, request):
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
        label = match.group("label")
        if match.group("predict"):
            # A POST goes to `predict` before Starlette (`_FrontDoor`).
            return self._not_allowed(request, "POST")
        if method not in ("GET", "HEAD"):
            return self._not_allowed(request, "GET")
        try:
            if label is not None:
                version = self.label_version(name, label)
            if match.group("metadata"):
                return self._metadata(name, version)
            return self._status(name, version)
        except RestError as e:
            return error_response(e.message, e.status)

    def _not_allowed(self, request, allowed):
        return error_response(f"Method {request.method} not allowed for {request.url.path} "
                              f"(use {allowed})", 405, {"Allow": allowed})

    def label_version(self, name, label):
        """The version `label` names for model `name`, or `RestError`
        404."""
        if self.models.get(name) is None:
            raise RestError(f"Servable not found for request: Latest({name})", 404)
        version = self.models.label_version(name, label)
        if version is None:
            raise RestError(f"Unrecognized servable version label: {label}", 404)
        return version

    def servable(self, name, version=None, label=None):
        """The servable a request names, or `RestError` 404 in TF Serving's
        words."""
        if label is not None:
            version = self.label_version(name, label)
        manager = self.models.get(name)
        servable = manager.get(version) if manager is not None else None
        if servable is None:
            which = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise RestError(f"Servable not found for request: {which}", 404)
        return servable

    def metrics_model_name(self, name):
        """`name` when the server serves a model of that name, else
        `metrics.UNKNOWN_MODEL`: the `model_name` label of a request's
        metrics, bounded by the served models whatever clients send."""
        return name if self.models.get(name) is not None else UNKNOWN_MODEL

    def status_entries(self, name, version=None):
        """`VersionManager.status` of model `name`, or `RestError` 404 in
        TF Serving's words when it has none."""
        manager = self.models.get(name)
        entries = manager.status(version) if manager is not None else []
        if not entries:
            raise RestError(f"Could not find any versions of model {name}" if version is None
                            else f"Could not find version {version} of model {name}", 404)
        return entries

    def _status(self, name, version):
        try:
            entries = self.status_entries(name, version)
        except RestError as e:
            return error_response(e.message, e.status)
        return json_response(rest_api.model_status(entries))

    def _metadata(self, name, version):
        try:
            servable = self.servable(name, version)
        except RestError as e:
            return error_response(e.message, e.status)
        return json_response(rest_api.model_metadata(name, servable.version, servable.specs))

    def _batching(self, name):
        if self.models.get(name) is None:
            return error_response(f"Servable not found for request: Latest({name})", 404)
        if self.batcher is None:
            return json_response({"enabled": False})
        return json_response({"enabled": True, **self.batcher.statistics()})

    def predict_path(self, path):
        """`(name, version, label)` of a predict URL path
        (`/v1/models/<name>[/versions/<v>|/labels/<l>]:predict`), else
        None."""
        if not path.startswith(_MODELS_PREFIX):
            return None
        match = _MODEL_PATH.fullmatch(path, len(_MODELS_PREFIX))
        if match is None or not match.group("predict"):
            return None
        version = match.group("version")
        return match.group("name"), int(version) if version else None, match.group("label")

    async def predict(self, scope, receive, send, name, version, label):
        """Answers a predict POST (an ASGI request; `predict_path`'s
        parts): TF Serving's answer or JSON error, and its metrics. The
        path every translation takes, so it is called before Starlette's
        middleware and router and reads the body from `receive` directly."""
        start = time.monotonic()
        status = 500  # until answered otherwise
        try:
            servable = self.servable(name, version, label)
            body = await self._read_body(scope, receive)
            parsed = await self._off_loop(len(body), _parse, body, servable.specs,
                                          self.request_limits.max_request_sentences)
            outputs = await _unless_disconnected(
                scope, receive, self.run_predict(servable, name, parsed.signature_name,
                                                 parsed.inputs, start))
            rows = max((np.size(v) for v in outputs.values()), default=0)
            answer = await self._off_loop(rows * 64, _answer, outputs, parsed.row_format)
            status = 200
            response = Response(answer, 200, media_type="application/json")
        except RestError as e:
            status = e.status
            response = error_response(e.message, e.status)
        except ClientDisconnect:
            status = 499
            LOGGER.info("The client of POST %s went away before its answer", scope["path"])
            response = Response(status_code=499)
        except Exception as error:  # a 500 with the traceback logged, never a hang
            response = _internal_error("POST", scope["path"], error)
        finally:
            self.metrics.observe_request(self.metrics_model_name(name),
                                         status_code_name(status),
                                         (time.monotonic() - start) * 1e6, "REST")
        await response(scope, receive, send)

    async def _off_loop(self, size, function, *args):
        """`function(*args)`, on a worker thread when `size` (bytes, about)
        is over `INLINE_BYTES`, else on the event loop: a small request's
        JSON costs less than the hop to a thread and back."""
        if size <= INLINE_BYTES:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, function,
                                                                *args)

    async def run_predict(self, servable, name, signature_name, inputs, start=None):
        """Runs a parsed predict request under the server's limits: the
        work checks, the queue bound (or the batcher's), and the deadline.

        Args:
            servable: from `servable(...)`.
            name: the model's name (for metrics).
            signature_name: a signature of `servable`.
            inputs: `{input name: np.ndarray}` matching its specs.
            start: `time.monotonic()` when the request arrived (the
                deadline counts from it; default: now).

        Returns: `{output name: np.ndarray}`.
        Raises: `RestError` with TF Serving's status and message for every
        refusal (400, 503, 504).
        """
        start = time.monotonic() if start is None else start
        model, measured = self.request_limits.check(servable, inputs)
        spec = servable.specs[signature_name]

        def run(merged):
            return servable.predict(signature_name, merged)

        try:
            if self.batcher is not None and batchable(spec):
                key = (servable.version, id(servable), signature_name, batch_key(inputs))
                call = self.batcher.submit(key, inputs, run)
            else:
                chunks = (model.chunks(inputs, self.chunk_work, measured)
                          if work.chunkable(spec)
                          else [None])
                call = self._unbatched(run, inputs, chunks)
            if self.rest_api_timeout is None:
                return await call
            left = self.rest_api_timeout - (time.monotonic() - start)
            try:
                return await _within(call, max(left, 0.0))
            except asyncio.TimeoutError:
                raise RestError(f"Deadline exceeded: the request took longer than "
                                f"{self.rest_api_timeout * 1000:g} ms "
                                "(--rest-api-timeout-in-ms).", 504) from None
        except ModelError as e:
            raise RestError(e.args[0], 400) from None
        except ModelOverloaded as e:
            raise RestError(e.args[0], 503) from None
        except QueueFull as e:
            self.metrics.observe_queue_full(self.metrics_model_name(name))
            raise RestError(str(e), 503) from None
        except TaskTooLarge as e:
            raise RestError(str(e), 400) from None

    async def _unbatched(self, run, inputs, chunks=(None,)):
        """`run(inputs)` on the executor, refusing (`QueueFull`) beyond
        `max_enqueued_requests` waiting or running. `chunks`: row slices
        `(start, stop)` run one after another and joined (None: the whole
        request); cancelling the call (a deadline, a departed client) runs
        no further chunk."""
        if self._enqueued >= self.max_enqueued_requests:
            raise QueueFull(f"{QUEUE_FULL_MESSAGE} ({self.max_enqueued_requests} requests "
                            "wait or run, --max-enqueued-requests)")
        self._enqueued += 1
        loop = asyncio.get_running_loop()
        future = None
        try:
            parts = []
            for chunk in chunks:
                part = inputs if chunk is None else work.split_rows(inputs, *chunk)
                future = loop.run_in_executor(self.executor, run, part)
                parts.append(await asyncio.shield(future))
            future = None
            return work.join_rows(parts)
        finally:
            # The count drops when the running model call ends, even if the
            # client left.
            if future is not None and not future.done():
                future.add_done_callback(self._dequeued)
            else:
                self._enqueued -= 1

    def _dequeued(self, _):
        self._enqueued -= 1

    async def _read_body(self, scope, receive):
        """The body of an ASGI request, refusing (413) one over
        `max_request_bytes` before reading it when its Content-Length says
        so, else as soon as it grows past the limit, and (408) one that
        takes longer than `body_timeout` to arrive. Raises
        `ClientDisconnect` if the client leaves first."""
        limit = self.max_request_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RestError(f"The request body has {int(declared)} bytes, over the limit of "
                            f"{limit} (--max-request-bytes).", 413)

        async def read():
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise RestError(f"The request body has more than {limit} bytes, the "
                                    "limit (--max-request-bytes).", 413)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)

        try:
            return await _within(read(), self.body_timeout)
        except asyncio.TimeoutError:
            raise RestError(f"The request body did not arrive within {self.body_timeout:g} s "
                            "(--request-body-timeout-seconds).", 408) from None


class _FrontDoor:
    """ASGI middleware: at most `max_concurrent_requests` HTTP requests in
    flight (one more gets a JSON 503 at once); then a predict POST goes to
    `ServingApp.predict`, every other request to Starlette."""

    def __init__(self, app, owner):
        self.app = app
        self.owner = owner

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        owner = self.owner
        if owner._in_flight >= owner.max_concurrent_requests:
            response = error_response(
                f"Too many requests in flight ({owner.max_concurrent_requests}, "
                "--max-concurrent-requests); try again later.", 503, {"Retry-After": "1"})
            return await response(scope, receive, send)
        owner._in_flight += 1
        try:
            predict = scope["method"] == "POST" and owner.predict_path(scope["path"])
            if predict:
                await owner.predict(scope, receive, send, *predict)
            else:
                await self.app(scope, receive, send)
        finally:
            owner._in_flight -= 1


def _internal_error(method, path, error):
    """A 500 with the exception in TF Serving's JSON error, its traceback
    logged."""
    LOGGER.error("Unexpected error answering %s %s", method, path, exc_info=error)
    return error_response(f"Internal error: {type(error).__name__}: {error}", 500)


async def _within(awaitable, seconds):
    """`await awaitable`, cancelled with `asyncio.TimeoutError` after
    `seconds`: through `asyncio.timeout` where Python has it (3.11), which
    spares the task `asyncio.wait_for` makes for each request."""
    if _TIMEOUT is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with _TIMEOUT(seconds):
        return await awaitable


_TIMEOUT = getattr(asyncio, "timeout", None)


async def _unless_disconnected(scope, receive, coroutine):
    """Awaits `coroutine` in the current task, cancelling it (and raising
    `ClientDisconnect`) if the client of ASGI request `scope` closes its
    connection first: its body has been read, so the next ASGI message is the
    disconnect. The watch is a callback on one `receive()`, not a second
    task to wait beside the work."""
    task = asyncio.current_task()
    gone = []

    def watch_done(watch):
        if (not watch.cancelled() and watch.exception() is None
                and watch.result()["type"] == "http.disconnect"):
            gone.append(True)
            task.cancel()

    watch = asyncio.ensure_future(receive())
    watch.add_done_callback(watch_done)
    try:
        return await coroutine
    except asyncio.CancelledError:
        if not gone:
            raise
        if hasattr(task, "uncancel"):  # Python 3.11: this cancel is handled here
            task.uncancel()
        LOGGER.info("The client of %s %s went away; its remaining work is cancelled",
                    scope["method"], scope["path"])
        raise ClientDisconnect() from None
    finally:
        watch.remove_done_callback(watch_done)
        watch.cancel()


def _parse(body, specs, max_rows):
    return rest_api.parse_predict_request(rest_api.decode_body(body), specs, max_rows)


def _answer(outputs, row_format):
    return rest_api.dumps(rest_api.predict_response(outputs, row_format))


def create_app(model_name, versions, batcher=None, max_request_bytes=1 << 20,
               playground_dir=PLAYGROUND_DIR, **limits_):
    """The ASGI application serving `versions` as `model_name` (see
    `ServingApp`; `limits_` its keyword arguments)."""
    return ServingApp(model_name, versions, batcher, max_request_bytes, playground_dir,
                      **limits_).app
