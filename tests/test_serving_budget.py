"""kt-serve's work budget and connection limits, on fake models and a
trivial application (no TensorFlow model runs): a request's work is bounded
before it runs, a long one runs in row chunks that a deadline or a departed
client stops, and the HTTP protocol answers 414 and 431 and keeps idle
sockets from locking clients out, whichever parser runs."""

import asyncio
import socket
import threading
import time

import numpy as np
import pytest
from starlette.requests import ClientDisconnect
from test_serving_operations import SPECS, FakeServable, _app

from keras_transformer.serving import app as app_module
from keras_transformer.serving import server
from keras_transformer.serving import work
from keras_transformer.serving.rest_api import RestError, SignatureSpec, TensorSpec

METADATA = {"beam_size": 4, "extra_length": 10, "max_source_tokens": 31,
            "config": {"max_length": 32}}


def texts(*sentences):
    array = np.empty(len(sentences), object)
    array[:] = [s.encode() for s in sentences]
    return array


def test_work_counts_sentences_beam_and_the_longest_padded_sentence():
    model = work.WorkModel(METADATA)
    inputs = {"text": texts("abc", "abcdefgh"), "beam_size": np.int32(3),
              "extra_length": np.int32(5)}
    total, pieces, hypotheses, extra = model.measure(inputs)
    assert pieces.tolist() == [4, 9] and (hypotheses, extra) == (3, 5)
    # 2 sentences x 3 x (9 pieces + min(9 + 1 + 5, 32) target positions).
    assert total == 2 * 3 * (9 + 15)
    # Pieces stop at max_source_tokens, target positions at max_length.
    (long,) = model.measure({"text": texts("x" * 500)})[1]
    assert long == 31
    assert model.measure({"text": texts("x" * 500)})[0] == 4 * (31 + 32)
    # Sampling searches one hypothesis; ids count their length.
    assert model.measure({"text": texts("ab"), "temperature": np.float32(1.0)})[2] == 1
    assert model.measure({"source_ids": np.zeros((2, 7), np.int32)})[1].tolist() == [7, 7]


def test_chunks_cover_the_rows_in_order_within_the_budget():
    model = work.WorkModel(METADATA)
    inputs = {"text": texts(*["a b c d"] * 7, "x" * 30, "ab"), "beam_size": np.int32(2)}
    assert model.chunks(inputs, 10**9) == [(0, 9)]
    budget = 120
    chunks = model.chunks(inputs, budget)
    assert chunks[0][0] == 0 and chunks[-1][1] == 9
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    for start, stop in chunks:
        part = work.split_rows(inputs, start, stop)
        assert model.measure(part)[0] <= budget or stop - start == 1
    assert work.split_rows(inputs, 2, 4)["beam_size"] == 2
    joined = work.join_rows([{"t": np.arange(2)}, {"t": np.arange(3)}])
    assert joined["t"].tolist() == [0, 1, 0, 1, 2]


def test_only_row_shaped_signatures_run_in_chunks():
    text = TensorSpec("string", (None,))
    assert work.chunkable(SPECS["serving_default"])
    assert work.chunkable(SignatureSpec({"text": text, "n": TensorSpec("int32", ())},
                                        {"translations": TensorSpec("string", (None, 3))}))
    assert not work.chunkable(SignatureSpec({"source_ids": TensorSpec("int32", (None, None))},
                                            {"ids": TensorSpec("int32", (None, None))}))
    assert not work.chunkable(SignatureSpec({"text": text},
                                            {"pieces": TensorSpec("string", (None, None))}))


def _serving(tmp_path, **limits):
    """The fake model's app, its servable carrying an export's metadata."""
    serving = _app(tmp_path, **limits)
    serving.servable("m").metadata = dict(METADATA)
    return serving


def test_a_request_over_the_work_budget_is_refused_naming_the_numbers(tmp_path):
    serving = _serving(tmp_path, request_limits=work.RequestLimits(max_request_work=1000))
    servable = serving.servable("m")
    FakeServable.calls = 0
    inputs = {"text": texts(*["abcdefgh"] * 20)}
    with pytest.raises(RestError) as refused:
        asyncio.run(serving.run_predict(servable, "m", "serving_default", inputs))
    message = refused.value.message
    assert refused.value.status == 400 and FakeServable.calls == 0
    assert "asks for 2320 units of work, more than --max-request-work (1000)" in message
    assert "20 sentences x 4 hypotheses x (9 source pieces" in message
    outputs = asyncio.run(serving.run_predict(servable, "m", "serving_default",
                                              {"text": texts(*["abcdefgh"] * 8)}))
    assert len(outputs["translation"]) == 8


def test_a_deadline_stops_the_chunks_not_yet_started(tmp_path):
    # One sentence a chunk, 0.1 s each: 20 would take 2 s; the deadline is 0.35 s.
    serving = _serving(tmp_path, chunk_work=1, rest_api_timeout=0.35)
    servable = serving.servable("m")
    FakeServable.calls, FakeServable.delay = 0, 0.1
    inputs = {"text": texts(*[f"s{i}" for i in range(20)])}

    async def ask():
        with pytest.raises(RestError) as late:
            await serving.run_predict(servable, "m", "serving_default", inputs)
        assert late.value.status == 504
        await asyncio.sleep(0.5)  # what runs in the background would run now

    try:
        asyncio.run(ask())
    finally:
        FakeServable.delay = 0.0
    assert 2 <= FakeServable.calls <= 6, FakeServable.calls
    assert serving._enqueued == 0


def test_chunked_answers_equal_the_whole_request(tmp_path):
    serving = _serving(tmp_path, chunk_work=1)
    servable = serving.servable("m")
    FakeServable.calls = 0
    inputs = {"text": texts(*[f"s{i}" for i in range(5)])}
    outputs = asyncio.run(serving.run_predict(servable, "m", "serving_default", inputs))
    assert FakeServable.calls == 5
    assert [t.decode() for t in outputs["translation"]] == [f"s{i}@1" for i in range(5)]


def test_a_client_that_goes_away_cancels_its_work():
    cancelled = []

    scope = {"method": "POST", "path": "/v1/models/m:predict"}

    async def receive():
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def long_work():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def ask():
        start = time.monotonic()
        with pytest.raises(ClientDisconnect):
            await app_module._unless_disconnected(scope, receive, long_work())
        return time.monotonic() - start

    assert asyncio.run(ask()) < 1 and cancelled == [True]


# The HTTP protocol's limits --------------------------------------------------


async def _hello(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(5)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture(params=["httptools", "h11"])
def http_server(request):
    """A trivial application behind kt-serve's protocol, in a thread:
    header limit 1 KiB, request line 256 bytes, 8 connections."""
    if request.param == "httptools":
        pytest.importorskip("httptools")
    import uvicorn

    sock = server.bind("127.0.0.1", 0)
    config = uvicorn.Config(_hello, log_config=None, access_log=False, lifespan="off",
                            http=server.guarded_protocol(
                                5.0, request.param, max_connections=8,
                                max_header_bytes=1024, max_url_bytes=256),
                            h11_max_incomplete_event_size=1025)
    running = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(running.serve(sockets=[sock])),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield sock.getsockname()[:2]
    running.should_exit = True
    thread.join(10)
    sock.close()


def _read_all(sock, limit=5.0):
    sock.settimeout(limit)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data, True
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        return data, True


def _get(address, path="/"):
    """The status line of a GET, `b"HTTP/1.1 200 hello"` for the application's
    answer."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = _read_all(sock)[0]
    return answer[:12] + (b" hello" if b"\r\nhello\r\n" in answer else b"")


def test_a_header_that_never_ends_gets_431_and_the_connection_closes(http_server):
    with socket.create_connection(http_server, timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ")
        sent = 0
        try:
            for _ in range(64):
                sock.sendall(b"a" * 256)
                sent += 256
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer, closed = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b'{"error":' in answer and b"--max-header-bytes" in answer
    assert closed
    assert _get(http_server) == b"HTTP/1.1 200 hello"


def test_a_request_line_over_the_limit_gets_414(http_server):
    with socket.create_connection(http_server, timeout=5) as sock:
        sock.sendall(b"GET /" + b"a" * 300)
        answer, closed = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 414") and closed, answer[:200]
    # Headers that end within the limits pass.
    assert _get(http_server, "/" + "a" * 100) == b"HTTP/1.1 200 hello"


def test_a_body_that_arrives_after_its_answer_is_not_the_next_request_head(http_server):
    # The application answers without reading the body; the rest of the
    # body, longer than the request-line limit, arrives after the answer.
    # The next request on the connection is counted from its own first byte.
    body = b"x" * 2000
    with socket.create_connection(http_server, timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n"
                     + body[:10])
        answer = b""
        while not answer.endswith(b"0\r\n\r\n"):  # the chunked answer's end
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        sock.sendall(body[10:])
        time.sleep(0.2)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read_all(sock)[0]
    assert answer.startswith(b"HTTP/1.1 200") and b"hello" in answer, answer[:200]


def test_idle_sockets_cannot_lock_clients_out(http_server):
    idle = [socket.create_connection(http_server, timeout=5) for _ in range(40)]
    try:
        start = time.monotonic()
        assert _get(http_server) == b"HTTP/1.1 200 hello"
        assert time.monotonic() - start < 1
        time.sleep(0.2)
        closed = sum(1 for s in idle if _read_all(s, 0.05)[1])
        assert closed >= 40 - 8, closed  # the longest idle ones were closed
    finally:
        for s in idle:
            s.close()


def test_when_every_connection_is_busy_a_new_one_gets_a_json_503(http_server):
    busy = []
    try:
        for _ in range(8):
            s = socket.create_connection(http_server, timeout=5)
            s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append(s)
        time.sleep(0.3)
        with socket.create_connection(http_server, timeout=5) as sock:
            answer, closed = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 503") and closed, answer[:200]
        assert b"application/json" in answer and b'{"error":' in answer
    finally:
        for s in busy:
            s.close()
