"""What TF Serving's operators expect of kt-serve, on fake models (no
TensorFlow model runs): version policies and load retries, the model config
file with several models and labels (read again when it changes), the
Prometheus metrics, and the back-pressure limits (queue, in-flight
requests, body and request deadlines, clients that go away)."""

import asyncio
import os
import threading
import time

import numpy as np
import pytest

from keras_transformer.serving.app import ServingApp
from keras_transformer.serving.metrics import (
    METRICS,
    REQUEST_COUNT,
    UNKNOWN_MODEL,
    Metrics,
    prometheus_name,
)
from keras_transformer.serving.model_versions import VersionManager, VersionPolicy
from keras_transformer.serving.models import (
    ModelConfigWatcher,
    ServedModels,
    manager_factory,
    read_model_config,
)
from keras_transformer.serving.rest_api import SignatureSpec, TensorSpec

TEXT = TensorSpec("string", (None,))
SPECS = {"serving_default": SignatureSpec({"text": TEXT},
                                          {"translation": TEXT,
                                           "score": TensorSpec("float32", (None,))})}


class FakeServable:
    """Echoes its input; a file `broken` in the version directory fails
    the load; `delay` seconds per call (a class attribute tests set)."""

    delay = 0.0
    calls = 0

    def __init__(self, path, version):
        if os.path.exists(os.path.join(path, "broken")):
            raise OSError("half copied")
        self.version, self.path = version, path
        self.specs = SPECS
        self.metadata, self.examples = {}, []
        self.load_seconds, self.warmup_seconds = 0.01, 0.002

    def predict(self, signature, inputs):
        FakeServable.calls += 1
        time.sleep(self.delay)
        text = inputs["text"]
        return {"translation": np.array([f"{t.decode()}@{self.version}".encode()
                                         for t in text], object),
                "score": np.zeros(len(text), np.float32)}


def make_version(base, version, broken=False):
    os.makedirs(base / str(version), exist_ok=True)
    (base / str(version) / "saved_model.pb").write_bytes(b"")
    if broken:
        (base / str(version) / "broken").write_text("")


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# Version policies and retries -------------------------------------------------


def test_version_policies_choose_like_tf_serving():
    assert VersionPolicy.latest(1).choose([3, 1, 2]) == [3]
    assert VersionPolicy.latest(2).choose([3, 1, 2]) == [2, 3]
    assert VersionPolicy.all().choose([3, 1]) == [1, 3]
    assert VersionPolicy.specific([1, 7]).choose([1, 2, 3]) == [1]
    with pytest.raises(ValueError, match="num_versions must be an int >= 1"):
        VersionPolicy.latest(0)


def test_a_version_that_fails_to_load_is_retried_then_given_up(tmp_path):
    make_version(tmp_path, 1)
    manager = VersionManager(str(tmp_path), poll_wait_seconds=0.02, load=FakeServable,
                             max_num_load_retries=2, load_retry_interval=0.1)
    manager.start()
    try:
        make_version(tmp_path, 2, broken=True)  # a `cp -r` under way
        wait_for(lambda: manager.status(2) and manager.status(2)[0][2])
        version, state, error = manager.status(2)[0]
        assert state == "LOADING" and "half copied" in error
        assert manager.get().version == 1  # still served meanwhile
        os.remove(tmp_path / "2" / "broken")  # the copy finished
        wait_for(lambda: manager.get().version == 2)
        assert manager.status(2) == [(2, "AVAILABLE", "")]
        assert manager.status(1) == [(1, "END", "")]
        make_version(tmp_path, 3, broken=True)
        wait_for(lambda: manager.status(3) and manager.status(3)[0][1] == "END")
        assert "half copied" in manager.status(3)[0][2]
        tries = manager._failures[3][0]
        assert tries == 3  # the first try and two retries
        time.sleep(0.3)
        assert manager._failures[3][0] == 3 and manager.get().version == 2
        # Given up, but the directory changes (copied in again): tried afresh.
        os.remove(tmp_path / "3" / "broken")
        wait_for(lambda: manager.get().version == 3)
        assert manager.status(3) == [(3, "AVAILABLE", "")] and 3 not in manager._failures
    finally:
        manager.stop()


def test_one_look_at_the_base_path_at_a_time(tmp_path):
    """The poller and a config reload both call `poll_once`: a version
    they both find loads once."""
    loads = []

    def slow_load(path, version):
        loads.append(version)
        time.sleep(0.2)
        return FakeServable(path, version)

    make_version(tmp_path, 1)
    manager = VersionManager(str(tmp_path), poll_wait_seconds=0, load=slow_load)
    manager.start()
    make_version(tmp_path, 2)
    looks = [threading.Thread(target=manager.poll_once) for _ in range(3)]
    for look in looks:
        look.start()
    for look in looks:
        look.join()
    assert loads == [1, 2] and manager.served_versions() == [2]


def test_start_falls_back_to_an_older_version_and_retries_the_newer(tmp_path):
    make_version(tmp_path, 1)
    make_version(tmp_path, 2, broken=True)
    manager = VersionManager(str(tmp_path), poll_wait_seconds=0.02, load=FakeServable,
                             max_num_load_retries=5, load_retry_interval=0.05)
    assert manager.start() == 1
    try:
        assert manager.status(2)[0][1] == "LOADING"
        os.remove(tmp_path / "2" / "broken")
        wait_for(lambda: manager.get().version == 2)
    finally:
        manager.stop()


def test_latest_two_serves_two_and_a_removed_version_is_unloaded(tmp_path):
    for version in (1, 2, 3):
        make_version(tmp_path, version)
    manager = VersionManager(str(tmp_path), poll_wait_seconds=0.02, load=FakeServable,
                             policy=VersionPolicy.latest(2))
    manager.start()
    try:
        assert manager.served_versions() == [2, 3]
        make_version(tmp_path, 4)
        wait_for(lambda: manager.served_versions() == [3, 4])
        assert manager.get().version == 4 and manager.get(3).version == 3
        manager.set_policy(VersionPolicy.specific([1]))
        wait_for(lambda: manager.served_versions() == [1])
    finally:
        manager.stop()


# The model config file --------------------------------------------------------

CONFIG = """
model_config_list {
  config {
    name: "en_de"
    base_path: "models/en_de"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config {
    name: "de_en"
    base_path: "models/de_en"
  }
}
"""


def test_the_model_config_file_parses_with_tf_serving_s_protos(tmp_path):
    pytest.importorskip("tensorflow_serving")
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    en_de, de_en = read_model_config(str(path))
    assert en_de.name == "en_de" and en_de.base_path == str(tmp_path / "models" / "en_de")
    assert en_de.policy == VersionPolicy.specific([1, 2])
    assert en_de.labels == {"stable": 1, "canary": 2}
    assert de_en.policy == VersionPolicy.latest(1) and de_en.labels == {}
    path.write_text('model_config_list { config { name: "x" base_path: "b" '
                    'model_version_policy { latest { num_versions: 0 } } } }')
    assert read_model_config(str(path))[0].policy == VersionPolicy.latest(1)
    for text, message in [
            ("model_config_list { config { name: 'x' base_pth: 'b' } }",
             r"1:\d+ : .*base_pth"),
            ("model_config_list { config { base_path: 'b' } }", "config 1: name is empty"),
            ("model_config_list { config { name: 'a' base_path: 'b' } "
             "config { name: 'a' base_path: 'c' } }", r"config 2 \(a\): the name is used twice"),
            ("model_config_list { config { name: 'a' base_path: 'b' "
             "model_platform: 'pytorch' } }", "model_platform 'pytorch'"),
            ("", "names no model")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as raised:
            read_model_config(str(path))
        assert str(path) in str(raised.value)


def _serve_config(tmp_path, poll=0.05):
    for name, versions in (("en_de", (1, 2, 3)), ("de_en", (4,))):
        for version in versions:
            make_version(tmp_path / "models" / name, version)
    config = tmp_path / "models.config"
    config.write_text(CONFIG)
    models = ServedModels({})
    watcher = ModelConfigWatcher(str(config), models,
                                 manager_factory(0.02, 0, 0.0, load=FakeServable), poll)
    watcher.start()
    return config, models, watcher


def test_several_models_with_labels_and_a_config_that_changes(tmp_path):
    pytest.importorskip("tensorflow_serving")
    import httpx

    config, models, watcher = _serve_config(tmp_path)
    app = ServingApp(models).app
    try:
        assert models.names == ["en_de", "de_en"]
        assert models.get("en_de").served_versions() == [1, 2]
        assert models.get("de_en").served_versions() == [4]

        async def ask(calls):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://kt") as c:
                return [await c.request(m, p, **k) for m, p, k in calls]

        body = {"json": {"instances": ["hi"]}}
        stable, canary, newest, version, other, unknown, status = asyncio.run(ask([
            ("POST", "/v1/models/en_de/labels/stable:predict", body),
            ("POST", "/v1/models/en_de/labels/canary:predict", body),
            ("POST", "/v1/models/en_de:predict", body),
            ("POST", "/v1/models/en_de/versions/1:predict", body),
            ("POST", "/v1/models/de_en:predict", body),
            ("POST", "/v1/models/en_de/labels/nightly:predict", body),
            ("GET", "/v1/models/en_de/labels/canary", {})]))
        assert stable.json()["predictions"][0]["translation"] == "hi@1"
        assert canary.json()["predictions"][0]["translation"] == "hi@2"
        assert newest.json()["predictions"][0]["translation"] == "hi@2"
        assert version.json()["predictions"][0]["translation"] == "hi@1"
        assert other.json()["predictions"][0]["translation"] == "hi@4"
        assert unknown.status_code == 404
        assert unknown.json()["error"] == "Unrecognized servable version label: nightly"
        assert status.json()["model_version_status"][0]["version"] == "2"

        # The operator moves "stable" to 3, serves the newest two, drops de_en.
        config.write_text(CONFIG.replace("specific { versions: 1 versions: 2 }",
                                         "latest { num_versions: 2 }")
                          .replace('key: "stable" value: 1', 'key: "stable" value: 3')
                          .split("  config {\n    name: \"de_en\"")[0] + "}\n")
        wait_for(lambda: models.get("en_de").served_versions() == [2, 3]
                 and models.get("de_en") is None)
        stable, gone = asyncio.run(ask([
            ("POST", "/v1/models/en_de/labels/stable:predict", body),
            ("POST", "/v1/models/de_en:predict", body)]))
        assert stable.json()["predictions"][0]["translation"] == "hi@3"
        assert gone.status_code == 404
        # A file that no longer parses changes nothing.
        config.write_text("model_config_list { config { name: ")
        time.sleep(0.3)
        assert models.names == ["en_de"] and models.get("en_de").served_versions() == [2, 3]
    finally:
        watcher.stop()
        models.stop()


def test_a_new_base_path_that_does_not_load_leaves_the_old_one_serving(tmp_path):
    pytest.importorskip("tensorflow_serving")
    config, models, watcher = _serve_config(tmp_path)
    try:
        old = models.get("en_de")
        make_version(tmp_path / "models" / "en_de_v2", 7, broken=True)
        config.write_text(CONFIG.replace('"models/en_de"', '"models/en_de_v2"')
                          .replace("specific { versions: 1 versions: 2 }",
                                   "latest { num_versions: 1 }")
                          .replace('key: "stable" value: 1', 'key: "stable" value: 7')
                          .replace('version_labels { key: "canary" value: 2 }', ""))
        wait_for(lambda: "en_de" in watcher._failed)
        # TF Serving keeps serving the old base path, labels and all.
        assert models.get("en_de") is old and old.served_versions() == [1, 2]
        assert models.labels("en_de") == {"stable": 1, "canary": 2}
        assert models.get("de_en").served_versions() == [4]
        # The new base path is tried again once it changes, the file unchanged.
        os.remove(tmp_path / "models" / "en_de_v2" / "7" / "broken")
        wait_for(lambda: models.get("en_de") is not old and not watcher._failed)
        assert models.get("en_de").served_versions() == [7]
        assert models.labels("en_de") == {"stable": 7}
        assert old.served_versions() == []
    finally:
        watcher.stop()
        models.stop()


# Metrics ------------------------------------------------------------------------


def _app(tmp_path, **limits):
    make_version(tmp_path / "m", 1)
    manager = VersionManager(str(tmp_path / "m"), poll_wait_seconds=0, load=FakeServable)
    manager.start()
    return ServingApp("m", manager, **limits)


def _series(text):
    """`{(sample name, sorted labels): value}` of an exposition, read by
    prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples}


def test_metrics_use_tf_serving_s_names_in_prometheus_format(tmp_path):
    import httpx

    serving = _app(tmp_path)

    async def ask():
        transport = httpx.ASGITransport(app=serving.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kt") as c:
            await c.post("/v1/models/m:predict", json={"instances": ["a"]})
            await c.post("/v1/models/m:predict", json={"instances": [1]})
            await c.post("/v1/models/nope:predict", json={"instances": ["a"]})
            return await c.get("/monitoring/prometheus/metrics")

    metrics = asyncio.run(ask())
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = metrics.text
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    assert "# TYPE :tensorflow:serving:request_latency histogram" in text
    series = _series(text)
    # The parser names a counter's samples `<name>_total`, OpenMetrics' way.
    count = ":tensorflow:serving:request_count_total"
    latency = ":tensorflow:serving:request_latency"
    assert series[count, (("model_name", "m"), ("status", "OK"))] == 1
    assert series[count, (("model_name", "m"), ("status", "INVALID_ARGUMENT"))] == 1
    assert series[count, (("model_name", UNKNOWN_MODEL), ("status", "NOT_FOUND"))] == 1
    rest = (("API", "predict"), ("entrypoint", "REST"), ("model_name", "m"))
    assert series[latency + "_count", rest] == 2
    assert series[latency + "_bucket", tuple(sorted(rest + (("le", "+Inf"),)))] == 2


def test_the_exposition_holds_tf_serving_s_families():
    metrics = Metrics()
    metrics.observe_request("m", "OK", 1500.0, "REST")
    metrics.observe_batch(3)
    metrics.observe_queue_full("m")
    metrics.observe_load("/models/m/1", 0.5, 0.25)
    from prometheus_client.parser import text_string_to_metric_families

    families = {family.name: family
                for family in text_string_to_metric_families(metrics.exposition())}
    assert {name: family.type for name, family in families.items()} == \
        {prometheus_name(name): kind for name, (kind, *_) in METRICS.items()}
    for name, (_, labels, *_) in METRICS.items():
        for sample in families[prometheus_name(name)].samples:
            assert set(sample.labels) - {"le"} == set(labels), sample
    # TF Serving's counters have no `_total` (the parser adds it to a
    # counter's samples unless the exposition's TYPE line named it so).
    text = metrics.exposition()
    assert "_total" not in text and "_created" not in text
    assert ':tensorflow:serving:request_count{model_name="m",status="OK"} 1' in text


def test_histogram_buckets_are_cumulative():
    metrics = Metrics()
    for microseconds in (5.0, 15.0, 15.0, 1e12):
        metrics.observe_request("m", "OK", microseconds, "GRPC")
    series = _series(metrics.exposition())
    buckets = sorted((float(dict(labels)["le"]), value) for (name, labels), value
                     in series.items() if name.endswith("request_latency_bucket"))
    counts = [value for _, value in buckets]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 4
    assert buckets[0][0] == 10 and buckets[-2][1] == 3
    assert metrics.value(REQUEST_COUNT, ("m", "OK")) == 4


UNKNOWN_NAMES = 300


def _unknown_name(i):
    return f"{i:04d}-" + "x" * 1000


def _bounded(first, after):
    """Asserts that `after` (the exposition after `UNKNOWN_NAMES` requests
    naming unknown models) has the series of `first` (after one) and none
    of the names."""
    assert set(_series(after)) == set(_series(first))
    assert len(_series(after)) < 200 and len(after) < len(first) + 200
    assert "x" * 100 not in after


def test_unknown_model_names_leave_the_metrics_bounded(tmp_path):
    import httpx

    serving = _app(tmp_path)

    async def ask():
        transport = httpx.ASGITransport(app=serving.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kt") as c:
            texts = []
            for i in range(UNKNOWN_NAMES):
                answer = await c.post(f"/v1/models/{_unknown_name(i)}:predict",
                                      json={"instances": ["a"]})
                assert answer.status_code == 404
                if i in (0, UNKNOWN_NAMES - 1):
                    texts.append((await c.get("/monitoring/prometheus/metrics")).text)
            return texts

    first, after = asyncio.run(ask())
    _bounded(first, after)
    assert serving.metrics.value(REQUEST_COUNT, (UNKNOWN_MODEL, "NOT_FOUND")) == UNKNOWN_NAMES


def test_unknown_model_names_over_grpc_leave_the_metrics_bounded(tmp_path):
    pytest.importorskip("tensorflow_serving")
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from keras_transformer.serving.grpc_service import start_grpc_server

    serving = _app(tmp_path)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, port = start_grpc_server(serving, loop, "127.0.0.1", 0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            texts = []
            for i in range(UNKNOWN_NAMES):
                request = predict_pb2.PredictRequest()
                request.model_spec.name = _unknown_name(i)
                with pytest.raises(grpc.RpcError) as error:
                    stub.Predict(request, timeout=30)
                assert error.value.code() == grpc.StatusCode.NOT_FOUND
                if i in (0, UNKNOWN_NAMES - 1):
                    texts.append(serving.metrics.exposition())
    finally:
        server.stop(None)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    _bounded(*texts)
    assert 'entrypoint="GRPC"' in texts[-1]
    assert serving.metrics.value(REQUEST_COUNT, (UNKNOWN_MODEL, "NOT_FOUND")) == UNKNOWN_NAMES


# Back-pressure ------------------------------------------------------------------


async def _call(app, method, path, body=b"", body_chunks=None, disconnect_after=None):
    """One request through the ASGI app; `body_chunks` an async iterator of
    chunks; `disconnect_after` chunks, then the client goes away. Returns
    (status, body bytes)."""
    chunks = body_chunks
    sent = {"status": None, "body": b""}
    count = 0

    async def receive():
        nonlocal count
        if chunks is None:
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect_after is not None and count >= disconnect_after:
            return {"type": "http.disconnect"}
        count += 1
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message):
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
        elif message["type"] == "http.response.body":
            sent["body"] += message.get("body", b"")

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"content-type", b"application/json")],
             "http_version": "1.1", "scheme": "http", "server": ("kt", 80),
             "client": ("127.0.0.1", 1), "root_path": ""}
    await app(scope, receive, send)
    return sent["status"], sent["body"]


PREDICT = "/v1/models/m:predict"
BODY = b'{"instances": ["a"]}'


def test_a_full_queue_and_too_many_requests_answer_503(tmp_path):
    serving = _app(tmp_path, max_enqueued_requests=2, max_concurrent_requests=4)
    FakeServable.delay = 0.5
    try:
        async def slow_body():
            await asyncio.sleep(0.1)
            yield BODY

        async def later():
            await asyncio.sleep(0.05)
            return await _call(serving.app, "POST", PREDICT, BODY)

        async def scenario():
            # Two run, two more upload while two others arrive: those two
            # find four requests in flight, the uploads then a full queue.
            return await asyncio.gather(
                *[_call(serving.app, "POST", PREDICT, BODY) for _ in range(2)],
                *[_call(serving.app, "POST", PREDICT, body_chunks=slow_body())
                  for _ in range(2)],
                *[later() for _ in range(2)])

        answers = asyncio.run(scenario())
    finally:
        FakeServable.delay = 0.0
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 200, 503, 503, 503, 503], answers
    messages = [body.decode() for status, body in answers if status == 503]
    assert sum("--max-concurrent-requests" in m for m in messages) == 2
    assert sum("--max-enqueued-requests" in m and "queue" in m for m in messages) == 2


def test_a_request_past_the_rest_api_timeout_gets_504(tmp_path):
    serving = _app(tmp_path, rest_api_timeout=0.1)
    FakeServable.delay = 0.6
    try:
        start = time.monotonic()
        status, body = asyncio.run(_call(serving.app, "POST", PREDICT, BODY))
        took = time.monotonic() - start
    finally:
        FakeServable.delay = 0.0
    assert status == 504 and b"--rest-api-timeout-in-ms" in body
    assert took < 0.5


def test_a_body_that_never_finishes_gets_408(tmp_path):
    serving = _app(tmp_path, body_timeout=0.2)

    async def trickle():
        yield b'{"instances": '
        await asyncio.sleep(30)
        yield b"[]}"

    start = time.monotonic()
    status, body = asyncio.run(_call(serving.app, "POST", PREDICT, body_chunks=trickle()))
    assert status == 408 and b"--request-body-timeout-seconds" in body
    assert time.monotonic() - start < 5


def test_a_client_that_leaves_mid_upload_costs_one_log_line(tmp_path, caplog):
    serving = _app(tmp_path)

    async def chunks():
        while True:
            yield b"[" * 10

    with caplog.at_level("INFO", logger="kt-serve"):
        caplog.clear()  # the model's loading lines, when an earlier test set INFO
        status, _ = asyncio.run(_call(serving.app, "POST", PREDICT, body_chunks=chunks(),
                                      disconnect_after=3))
    records = [r for r in caplog.records if r.name == "kt-serve"]
    assert len(records) == 1 and "went away" in records[0].getMessage()
    assert records[0].levelname == "INFO" and records[0].exc_info is None
    assert status == 499


def test_the_queue_count_drops_when_the_model_call_ends(tmp_path):
    serving = _app(tmp_path, max_enqueued_requests=1, rest_api_timeout=0.05)
    FakeServable.delay = 0.3

    async def scenario():
        first = await _call(serving.app, "POST", PREDICT, BODY)
        assert first[0] == 504
        await asyncio.sleep(0.5)  # the abandoned model call ends
        FakeServable.delay = 0.0
        return await _call(serving.app, "POST", PREDICT, BODY)

    try:
        second = asyncio.run(scenario())
    finally:
        FakeServable.delay = 0.0
    assert second[0] == 200 and serving._enqueued == 0


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_a_late_header_closes_the_connection(parser):
    """The protocol uvicorn runs, with either parser: a connection that
    sends part of its request line and stops is closed after the header
    deadline; TCP_NODELAY keeps a small answer from waiting for the
    client's delayed ACK."""
    if parser == "httptools":
        pytest.importorskip("httptools")
    import socket

    from keras_transformer.serving.server import bind, run_server, url_of

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = bind("127.0.0.1", 0)
    port = int(url_of(sock).rsplit(":", 1)[1])
    ready = threading.Event()
    thread = threading.Thread(target=run_server, args=(app, sock, ready.set),
                              kwargs={"header_timeout": 0.3, "parser": parser}, daemon=True)
    thread.start()
    assert ready.wait(30)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        assert slow.recv(100) == b""  # closed by the server
        assert time.monotonic() - start < 3
    with socket.create_connection(("127.0.0.1", port), timeout=5) as fine:
        fine.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(5):  # keep-alive: each answer whole within milliseconds
            start = time.monotonic()
            fine.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok"):
                chunk = fine.recv(1000)
                assert chunk, f"the server closed the connection after {answer!r}"
                answer += chunk
            times.append(time.monotonic() - start)
            assert b"200" in answer
        # A delayed ACK costs 40 ms or more; the median stays far below.
        assert sorted(times)[2] < 0.02, times


def test_the_examples_in_the_serving_docstrings_run():
    import doctest

    from keras_transformer.serving import metrics, model_versions

    for module in (metrics, model_versions):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
