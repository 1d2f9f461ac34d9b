"""kt-serve's HTTP server around the application (`app.ServingApp`): the
listening socket, uvicorn with the connection limits that hold whichever
HTTP parser runs (request head deadline and size, open connections), and
the log format.
"""

import asyncio
import collections
import logging
import socket
import sys

from keras_transformer.serving import limits, rest_api

LOGGER = logging.getLogger("kt-serve")


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
