"""kt-serve's HTTP application (Starlette) and its uvicorn server.

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
import collections
import concurrent.futures
import logging
import mimetypes
import os
import re
import socket
import sys
import time

import numpy as np
from starlette.applications import Starlette
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
            Route("/v1/models/{path:path}", self.models_endpoint, methods=_ALL_METHODS),
        ]
        if metrics_path:
            routes.append(Route(metrics_path, self.prometheus, methods=["GET"]))
        starlette = Starlette(
            routes=routes,
            exception_handlers={HTTPException: self._http_error, Exception: self._crash},
        )
        self.app = _ConcurrencyLimit(starlette, self)

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
        LOGGER.error("Unexpected error answering %s %s", request.method, request.url.path,
                     exc_info=error)
        return error_response(f"Internal error: {type(error).__name__}: {error}", 500)

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
        except ClientDisconnect:
            LOGGER.info("The client of %s %s went away before its answer",
                        request.method, request.url.path)
            return Response(status_code=499)
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
            if method != "POST":
                return self._not_allowed(request, "POST")
            return await self._predict(request, name, version, label)
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

    async def _predict(self, request, name, version, label):
        start = time.monotonic()
        status = 500  # until answered otherwise
        try:
            servable = self.servable(name, version, label)
            body = await self._read_body(request)
            parsed = await self._off_loop(len(body), _parse, body, servable.specs,
                                          self.request_limits.max_request_sentences)
            outputs = await _unless_disconnected(
                request, self.run_predict(servable, name, parsed.signature_name,
                                          parsed.inputs, start))
            rows = max((np.size(v) for v in outputs.values()), default=0)
            answer = await self._off_loop(rows * 64, _answer, outputs, parsed.row_format)
            status = 200
            return Response(answer, 200, media_type="application/json")
        except ClientDisconnect:
            status = 499
            raise
        except RestError as e:
            status = e.status
            return error_response(e.message, e.status)
        finally:
            self.metrics.observe_request(self.metrics_model_name(name),
                                         status_code_name(status),
                                         (time.monotonic() - start) * 1e6, "REST")

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

    async def _read_body(self, request):
        """The body, refusing (413) one over `max_request_bytes` before
        reading it when its Content-Length says so, else as soon as it
        grows past the limit, and (408) one that takes longer than
        `body_timeout` to arrive."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RestError(f"The request body has {int(declared)} bytes, over the limit of "
                            f"{limit} (--max-request-bytes).", 413)

        async def read():
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RestError(f"The request body has more than {limit} bytes, the "
                                    "limit (--max-request-bytes).", 413)
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            return await _within(read(), self.body_timeout)
        except asyncio.TimeoutError:
            raise RestError(f"The request body did not arrive within {self.body_timeout:g} s "
                            "(--request-body-timeout-seconds).", 408) from None


class _ConcurrencyLimit:
    """ASGI middleware: at most `max_concurrent_requests` HTTP requests in
    flight; one more gets a JSON 503 at once."""

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
            await self.app(scope, receive, send)
        finally:
            owner._in_flight -= 1


async def _within(awaitable, seconds):
    """`await awaitable`, cancelled with `asyncio.TimeoutError` after
    `seconds`: through `asyncio.timeout` where Python has it (3.11), which
    spares the task `asyncio.wait_for` makes for each request."""
    if _TIMEOUT is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with _TIMEOUT(seconds):
        return await awaitable


_TIMEOUT = getattr(asyncio, "timeout", None)


async def _unless_disconnected(request, coroutine):
    """Awaits `coroutine`, cancelling it (and raising `ClientDisconnect`)
    if the client closes its connection first: a request's body has been
    read, so the next ASGI message is the disconnect."""
    task = asyncio.ensure_future(coroutine)
    watch = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watch.result()["type"] == "http.disconnect":
            task.cancel()
            LOGGER.info("The client of %s %s went away; its remaining work is cancelled",
                        request.method, request.url.path)
            raise ClientDisconnect()
        return await task
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()


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


def _raw_error(status, reason, message):
    """A complete HTTP/1.1 error response with TF Serving's JSON body, for
    answers written before the application runs (the connection then
    closes)."""
    body = rest_api.dumps({"error": message})
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def guarded_protocol(header_timeout, parser="auto", max_connections=None,
                     max_header_bytes=limits.DEFAULT_MAX_HEADER_BYTES,
                     max_url_bytes=limits.DEFAULT_MAX_URL_BYTES):
    """uvicorn's HTTP protocol with kt-serve's connection limits, the same
    whichever parser runs:

    - a connection whose request line and headers have not all arrived
      `header_timeout` seconds after it opened or after its previous
      response is closed (a slow client holds no connection for longer);
    - a request line over `max_url_bytes` gets 414 and a request head over
      `max_header_bytes` gets 431, as soon as that many bytes arrived, and
      the connection closes;
    - beyond `max_connections` open connections (None: no limit), a new one
      closes the one that has been idle longest (no request running on it);
      if every connection is busy the new one gets a JSON 503 and closes.
      So idle or slow sockets cannot lock well-behaved clients out;
    - responses go out without Nagle's delay.

    `parser`: "httptools" (uvicorn's C parser), "h11" (pure Python), or
    "auto" (httptools where it is installed).
    """
    Protocol = None
    if parser in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
        except ImportError:  # httptools is not installed
            if parser == "httptools":
                raise
    if Protocol is None:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol

    # Open connections, oldest first: those that have not completed a
    # request yet (idle or slow sockets, closed first), then the others by
    # their last answer.
    fresh, served = collections.OrderedDict(), collections.OrderedDict()

    class GuardedProtocol(Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            # A response goes out in several writes (head, body): without
            # TCP_NODELAY the last waits for the client's delayed ACK.
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._new_head()
            if max_connections is not None and len(fresh) + len(served) >= max_connections:
                if not self._close_longest_idle():
                    self._refuse(503, "Service Unavailable",
                                 f"Too many connections ({max_connections}, "
                                 "--max-connections), all busy; try again later.")
                    return
            fresh[self] = None
            self._arm_header_deadline()

        def data_received(self, data):
            if self._head is not None and not self._check_head(data):
                return
            super().data_received(data)
            if self._body_left and self._request_received():
                self._body_left = False
                self._new_head()

        def on_response_complete(self):
            super().on_response_complete()
            fresh.pop(self, None)
            served.pop(self, None)
            served[self] = None
            # An answer may go out before its request's body has all
            # arrived (an error, an application that does not read it):
            # the next head starts after that body, not at the answer.
            self._body_left = not self._request_received()
            if not self._body_left:
                self._new_head()
            self._arm_header_deadline()

        def _request_received(self):
            """Whether the current request has arrived whole, body
            included (or there is none)."""
            conn = getattr(self, "conn", None)  # h11's connection state
            if conn is not None:
                import h11

                return conn.their_state in (h11.DONE, h11.IDLE, h11.MUST_CLOSE, h11.CLOSED)
            return self.cycle is None or not self.cycle.more_body

        def connection_lost(self, exc):
            fresh.pop(self, None)
            served.pop(self, None)
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _busy(self):
            return self.cycle is not None and not self.cycle.response_complete

        def _close_longest_idle(self):
            for group in (fresh, served):
                for connection in group:
                    if not connection._busy():
                        del group[connection]
                        connection.connections.discard(connection)
                        connection.transport.close()
                        return True
            return False

        def _new_head(self):
            # Bytes of the next request line and headers seen so far; the
            # last three bytes carry a CRLFCRLF split between two reads.
            self._head = bytearray()
            self._body_left = False

        def _check_head(self, data):
            """Counts `data` into the request head; answers 414 or 431 and
            returns False when a limit is passed."""
            seen = len(self._head)
            window = bytes(self._head[-3:]) + data
            end = window.find(b"\r\n\r\n")
            self._head += data if end < 0 else data[:max(0, end + 4 - min(seen, 3))]
            line_end = self._head.find(b"\r\n")
            line = len(self._head) if line_end < 0 else line_end
            if line > max_url_bytes:
                self._refuse(414, "URI Too Long",
                             f"The request line is longer than {max_url_bytes} bytes "
                             "(--max-url-bytes).")
                return False
            if len(self._head) > max_header_bytes:
                self._refuse(431, "Request Header Fields Too Large",
                             f"The request line and headers are longer than "
                             f"{max_header_bytes} bytes (--max-header-bytes).")
                return False
            if end >= 0:
                self._head = None  # complete: the body is not counted
            return True

        def _refuse(self, status, reason, message):
            LOGGER.info("Refused a connection with %d: %s", status, message)
            self._head = None
            fresh.pop(self, None)
            served.pop(self, None)
            self.connections.discard(self)
            self.transport.write(_raw_error(status, reason, message))
            self.transport.close()

        def _arm_header_deadline(self):
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            self._header_cycle = self.cycle
            self._header_timer = self.loop.call_later(header_timeout, self._header_late)

        def _header_late(self):
            # A new request's headers make a new cycle; none means they are late.
            if self.cycle is self._header_cycle and not self.transport.is_closing():
                LOGGER.info("Closed a connection whose request headers took longer than "
                            "%g s", header_timeout)
                self.transport.close()

    return GuardedProtocol


def run_server(app, sock, ready=None, header_timeout=limits.DEFAULT_HEADER_TIMEOUT_SECONDS,
               max_connections=None, on_start=None, parser="auto",
               max_header_bytes=limits.DEFAULT_MAX_HEADER_BYTES,
               max_url_bytes=limits.DEFAULT_MAX_URL_BYTES):
    """Serves `app` on `sock` with uvicorn until SIGINT or SIGTERM; calls
    `on_start(loop)` once it accepts connections (it may return a
    callable, called at shutdown), then `ready()`. The connection limits
    (`header_timeout`, `max_connections`, `max_header_bytes`,
    `max_url_bytes`) and `parser` are `guarded_protocol`'s. Logs go to
    stderr; no access log."""
    import uvicorn

    configure_logging()
    config = uvicorn.Config(app, log_config=None, access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5,
                            http=guarded_protocol(header_timeout, parser, max_connections,
                                                  max_header_bytes, max_url_bytes),
                            h11_max_incomplete_event_size=max_header_bytes + 1)
    server = uvicorn.Server(config)

    async def main():
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        stop = None
        try:
            if server.started and on_start is not None:
                stop = on_start(asyncio.get_running_loop())
            if server.started and ready is not None:
                ready()
        except BaseException:
            server.should_exit = True
            await task
            raise
        try:
            await task
        finally:
            if stop is not None:
                stop()

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
