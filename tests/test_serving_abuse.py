"""Hostile requests against kt-serve serving the tiny export with its
default limits (body and header deadlines shortened so the test takes
seconds): each gets a 4xx, or a 503 for overload, within seconds; none gets
a 5xx; the server lives on, logs no traceback, and its resident memory
stays within `MEMORY_BOUND_MIB` of what it was after its first answer. The
gRPC API (`--port`) answers what REST answers and meets the same limits.
Every test runs with both engines, the SavedModel and CTranslate2."""

import concurrent.futures
import json
import os
import socket
import time

import pytest
import requests
from support.serving_model import export_tiny_model, start_server, stop_server

NAME = "tiny"
BODY_TIMEOUT = 2.0
# The probes ask for no model work beyond a few short sentences; the bound
# leaves room for the allocator's arenas of the threads that parse them.
MEMORY_BOUND_MIB = 200
SLOW_CLIENTS = 64
OPTIONS = {"alpha": 0.6, "extra_length": 4}


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module", params=["savedmodel", "ctranslate2"])
def server(request, tmp_path_factory):
    """kt-serve on the tiny export, a SavedModel or a CTranslate2 export of
    the same weights (every test runs against both engines)."""
    directory = tmp_path_factory.mktemp("abuse")
    if request.param == "ctranslate2":
        pytest.importorskip("ctranslate2")
        from support.serving_model import export_tiny_ctranslate2

        export = export_tiny_ctranslate2(directory, name=NAME)
    else:
        export = export_tiny_model(directory, name=NAME)
    grpc = ["--port", "0"] if _has_tf_serving() else []
    process, url = start_server(["--model-name", NAME, "--model-base-path",
                                 os.path.dirname(export),
                                 "--request-body-timeout-seconds", str(BODY_TIMEOUT),
                                 "--request-header-timeout-seconds", str(BODY_TIMEOUT),
                                 *grpc])
    try:
        first = requests.post(f"{url}/v1/models/{NAME}:predict",
                              json={"inputs": {"text": ["a dog"]}}, timeout=60)
        assert first.status_code == 200
        host, port = url.rsplit("/", 1)[1].split(":")
        yield {"process": process, "url": url, "address": (host, int(port)),
               "rss": rss_mib(process.pid)}
    finally:
        stop_server(process)


def _has_tf_serving():
    import importlib.util

    return importlib.util.find_spec("tensorflow_serving") is not None


def _options(beam_size=2, **changes):
    return {"signature_name": "translate_with_options",
            "inputs": {"text": ["the dog"], "beam_size": beam_size, **OPTIONS, **changes}}


def _raw(address, data, read_timeout):
    """Sends `data` on a new connection and returns what comes back
    within `read_timeout` seconds (b"" if the server closed it)."""
    with socket.create_connection(address, timeout=read_timeout) as sock:
        sock.sendall(data)
        try:
            return sock.recv(4096)
        except TimeoutError:
            return None


def _post_headers(length):
    return (f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def test_hostile_requests_get_4xx_or_503_within_seconds(server):
    url = f"{server['url']}/v1/models/{NAME}"
    sentences = ["a"] * 20000
    probes = {
        "beam_size 2^30+1": ("predict", _options(2**30 + 1)),
        "beam_size 4,096": ("predict", _options(4096)),
        "alpha NaN": ("predict", _options(alpha=float("nan"))),
        "extra_length 2^31-1": ("predict", _options(extra_length=2**31 - 1)),
        "20,000 sentences at beam 64": ("predict", {
            "signature_name": "translate_with_options",
            "inputs": {"text": sentences, "beam_size": 64, **OPTIONS}}),
        "a 5,000-digit version": (f"versions/{'7' * 5000}", {"inputs": {"text": ["a"]}}),
    }
    for what, (route, body) in probes.items():
        data = json.dumps(body)
        assert len(data) < 1 << 20, what
        start = time.monotonic()
        path = f"{url}:predict" if route == "predict" else f"{url}/{route}:predict"
        answer = requests.post(path, data=data, timeout=60,
                               headers={"Content-Type": "application/json"})
        took = time.monotonic() - start
        assert 400 <= answer.status_code < 500 or answer.status_code == 503, \
            (what, answer.status_code, answer.text)
        assert "error" in answer.json(), what
        assert took < 10, (what, took)


def test_a_body_that_never_finishes_gets_408(server):
    start = time.monotonic()
    answer = _raw(server["address"], _post_headers(1000) + b'{"inputs": ', 4 * BODY_TIMEOUT)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - start < 3 * BODY_TIMEOUT


def test_a_client_that_disconnects_mid_upload_costs_nothing(server):
    with socket.create_connection(server["address"], timeout=5) as sock:
        sock.sendall(_post_headers(100000) + b'{"inputs": {"text": ["' + b"a" * 5000)
    alive = requests.post(f"{server['url']}/v1/models/{NAME}:predict",
                          json={"inputs": {"text": ["a dog"]}}, timeout=60)
    assert alive.status_code == 200


def test_64_slow_clients_are_cut_off_and_others_still_served(server):
    def slow_client(i):
        start = time.monotonic()
        with socket.create_connection(server["address"], timeout=4 * BODY_TIMEOUT) as sock:
            if i % 2:  # headers that never end
                sock.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\n")
            else:  # a body one byte at a time
                sock.sendall(_post_headers(200))
            answer = b""
            try:
                while True:
                    if i % 2 == 0:
                        sock.sendall(b" ")
                    chunk = sock.recv(4096) if i % 2 else _recv_nowait(sock)
                    if chunk == b"":
                        break
                    answer += chunk or b""
                    if answer.startswith(b"HTTP/1.1") and b"\r\n\r\n" in answer:
                        break
                    if chunk is None:
                        time.sleep(0.2)
            except (ConnectionResetError, BrokenPipeError):
                pass
        return answer, time.monotonic() - start

    with concurrent.futures.ThreadPoolExecutor(SLOW_CLIENTS + 1) as pool:
        slow = [pool.submit(slow_client, i) for i in range(SLOW_CLIENTS)]
        time.sleep(0.5)
        fine = requests.post(f"{server['url']}/v1/models/{NAME}:predict",
                             json={"inputs": {"text": ["a dog"]}}, timeout=60)
        results = [f.result() for f in slow]
    assert fine.status_code == 200
    for i, (answer, took) in enumerate(results):
        assert took < 4 * BODY_TIMEOUT, (i, took)
        if i % 2 == 0:
            assert answer.startswith(b"HTTP/1.1 408"), (i, answer[:100])
        else:
            assert answer == b"", (i, answer[:100])


def _recv_nowait(sock):
    sock.setblocking(False)
    try:
        return sock.recv(4096)
    except BlockingIOError:
        return None
    finally:
        sock.setblocking(True)


def test_the_server_lives_on_without_tracebacks_and_within_its_memory_bound(server):
    # Runs after the probes above (pytest keeps the file's order).
    alive = requests.get(f"{server['url']}/v1/models/{NAME}", timeout=30)
    assert alive.status_code == 200
    grown = rss_mib(server["process"].pid) - server["rss"]
    assert grown < MEMORY_BOUND_MIB, f"resident memory grew {grown:.0f} MiB"
    with open(server["process"].stderr_path, encoding="utf-8", errors="replace") as f:
        log = f.read()
    assert "Traceback" not in log and "Internal error" not in log, log[-3000:]
    assert log.count("went away") <= 2, log[-3000:]


# gRPC ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub(server):
    pytest.importorskip("tensorflow_serving")
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(server["process"].grpc_target)
    yield (prediction_service_pb2_grpc.PredictionServiceStub(channel),
           model_service_pb2_grpc.ModelServiceStub(channel))
    channel.close()


def _predict_request(signature, text, **options):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    dtypes = {"beam_size": tf.int32, "alpha": tf.float32, "extra_length": tf.int32}
    request = predict_pb2.PredictRequest()
    request.model_spec.name = NAME
    request.model_spec.signature_name = signature
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(text, tf.string))
    for key, value in options.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtypes[key]))
    return request


def test_grpc_predict_answers_what_rest_answers(server, stub):
    import tensorflow as tf

    predict, _ = stub
    sentences = ["the dog sees a cat", "a red house"]
    for signature, options in (("serving_default", {}),
                               ("translate_with_options", {"beam_size": 2, **OPTIONS})):
        response = predict.Predict(_predict_request(signature, sentences, **options),
                                   timeout=60)
        rest = requests.post(f"{server['url']}/v1/models/{NAME}:predict", timeout=60,
                             json={"signature_name": signature,
                                   "inputs": {"text": sentences, **options}}).json()["outputs"]
        translations = [t.decode() for t in tf.make_ndarray(response.outputs["translation"])]
        assert translations == rest["translation"]
        scores = tf.make_ndarray(response.outputs["score"]).tolist()
        assert scores == pytest.approx(rest["score"], rel=1e-6)
        assert response.model_spec.version.value == 1
        assert response.model_spec.signature_name == signature


def test_grpc_meets_the_same_limits_with_canonical_codes(stub):
    import grpc

    predict, _ = stub
    for request, code in [
            (_predict_request("translate_with_options", ["a"], beam_size=2**30 + 1,
                              **OPTIONS), grpc.StatusCode.INVALID_ARGUMENT),
            (_predict_request("translate_with_options", ["a"], beam_size=2,
                              alpha=float("nan"), extra_length=4),
             grpc.StatusCode.INVALID_ARGUMENT),
            (_predict_request("serving_default", ["a"] * 600), grpc.StatusCode.INVALID_ARGUMENT),
            (_predict_request("no_such_signature", ["a"]), grpc.StatusCode.INVALID_ARGUMENT)]:
        with pytest.raises(grpc.RpcError) as raised:
            predict.Predict(request, timeout=60)
        assert raised.value.code() == code, raised.value.details()
        assert "[[" not in raised.value.details()
    missing = _predict_request("serving_default", ["a"])
    missing.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as raised:
        predict.Predict(missing, timeout=60)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_model_status_and_metadata(server, stub):
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
    )

    predict, models = stub
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = NAME
    status = models.GetModelStatus(request, timeout=30)
    assert [(s.version, s.state) for s in status.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = NAME
    request.metadata_field.append("signature_def")
    metadata = predict.GetModelMetadata(request, timeout=30)
    definitions = get_model_metadata_pb2.SignatureDefMap()
    metadata.metadata["signature_def"].Unpack(definitions)
    rest = requests.get(f"{server['url']}/v1/models/{NAME}/metadata", timeout=30).json()
    rest_definitions = rest["metadata"]["signature_def"]["signature_def"]
    assert set(definitions.signature_def) >= set(rest_definitions) - {"__saved_model_init_op"}
    for name, definition in rest_definitions.items():
        assert set(definitions.signature_def[name].inputs) == set(definition["inputs"])
        assert set(definitions.signature_def[name].outputs) == set(definition["outputs"])


def test_the_package_s_grpc_client_translates_through_kt_serve(server):
    pytest.importorskip("tensorflow_serving")
    from keras_transformer.serving.client import GrpcClient, RestClient

    sentences = ["the dog sees a cat", "a red house"]
    through_grpc = GrpcClient(server["process"].grpc_target, model=NAME).translate(sentences)
    through_rest = RestClient(server["url"], model=NAME).translate(sentences)
    assert list(through_grpc[0]) == list(through_rest[0])


def test_metrics_count_rest_and_grpc_requests(server):
    text = requests.get(f"{server['url']}/monitoring/prometheus/metrics", timeout=30).text
    assert f':tensorflow:serving:request_count{{model_name="{NAME}",status="OK"}}' in text
    assert 'status="INVALID_ARGUMENT"' in text
    assert 'entrypoint="REST"' in text
    if _has_tf_serving():
        assert 'entrypoint="GRPC"' in text
    assert ":tensorflow:cc:saved_model:load_latency" in text
    assert ":tensorflow:serving:model_warmup_latency_count" in text


# Probes with a status GET alongside --------------------------------------------


class StatusWatch:
    """GETs the model's status every 0.25 s on its own connection while a
    probe runs; `worst` is the slowest answer (seconds), a failure counts
    as the probe's whole duration."""

    def __init__(self, url):
        self.url, self.worst, self._stop = f"{url}/v1/models/{NAME}", 0.0, False

    def __enter__(self):
        import threading

        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        with requests.Session() as session:
            while not self._stop:
                start = time.monotonic()
                try:
                    ok = session.get(self.url, timeout=10).status_code == 200
                except requests.RequestException:
                    ok = False
                took = time.monotonic() - start
                self.worst = max(self.worst, took if ok else 10.0)
                time.sleep(0.25)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join(15)


def _probe(server, what, run):
    """Runs `run()` with a `StatusWatch`; returns and prints the record:
    the answer, seconds, resident memory growth (MiB) and the worst status
    GET latency."""
    before = rss_mib(server["process"].pid)
    with StatusWatch(server["url"]) as watch:
        time.sleep(0.3)  # a first status GET before the probe
        start = time.monotonic()
        answer = run()
        took = time.monotonic() - start
        time.sleep(0.3)
    record = {"probe": what, "answer": answer, "seconds": round(took, 3),
              "memory_growth_mib": round(rss_mib(server["process"].pid) - before, 1),
              "worst_status_get_seconds": round(watch.worst, 3)}
    print("PROBE", json.dumps(record))
    return record


def _grpc_text_request(signature="serving_default"):
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = NAME
    request.model_spec.signature_name = signature
    return request


def _grpc_code(predict, request):
    import grpc

    try:
        predict.Predict(request, timeout=60)
        return "OK"
    except grpc.RpcError as e:
        assert "Traceback" not in (e.details() or "")
        return e.code().name


def test_grpc_tensors_are_checked_before_they_are_materialised(server, stub):
    from tensorflow.core.framework import types_pb2

    predict, _ = stub
    huge = _grpc_text_request()
    text = huge.inputs["text"]
    text.dtype = types_pb2.DT_STRING
    text.tensor_shape.dim.add().size = 50_000_000
    text.string_val.append(b"a dog")
    no_dtype = _grpc_text_request()
    no_dtype.inputs["text"].tensor_shape.dim.add().size = 1
    no_dtype.inputs["text"].string_val.append(b"a dog")
    short = _grpc_text_request()
    short.inputs["text"].dtype = types_pb2.DT_STRING
    short.inputs["text"].tensor_shape.dim.add().size = 3
    short.inputs["text"].string_val.extend([b"a", b"b"])
    content = _predict_request("translate_with_options", ["a dog"], beam_size=2, **OPTIONS)
    content.inputs["beam_size"].ClearField("int_val")
    content.inputs["beam_size"].tensor_content = b"\0" * 64
    negative = _grpc_text_request()
    negative.inputs["text"].dtype = types_pb2.DT_STRING
    negative.inputs["text"].tensor_shape.dim.add().size = -5
    for what, request in (("shape [50,000,000], one string", huge), ("no dtype", no_dtype),
                          ("shape [3], two strings", short),
                          ("beam_size of 64 bytes", content), ("shape [-5]", negative)):
        record = _probe(server, f"gRPC {what}", lambda r=request: _grpc_code(predict, r))
        assert record["answer"] == "INVALID_ARGUMENT", record
        assert record["seconds"] < 1 and record["memory_growth_mib"] < 50, record
        assert record["worst_status_get_seconds"] < 1, record


def test_the_work_budget_refuses_the_largest_requests_before_they_run(server):
    sentence = " ".join(["the dog sees a cat"] * 8)  # 40 words
    body = {"signature_name": "translate_with_options",
            "inputs": {"text": [sentence] * 512, "beam_size": 64, "alpha": 0.6,
                       "extra_length": 64}}

    def post():
        answer = requests.post(f"{server['url']}/v1/models/{NAME}:predict", json=body,
                               timeout=60)
        assert "--max-request-work" in answer.json()["error"], answer.text
        return answer.status_code

    record = _probe(server, "512 sentences of 40 words, beam 64, extra_length 64", post)
    assert record["answer"] == 400 and record["seconds"] < 2, record
    assert record["worst_status_get_seconds"] < 1, record


def test_3000_idle_connections_do_not_lock_clients_out(server):
    """3,000 sockets opened at once and held: the server accepts the burst
    (the longest idle ones closed beyond --max-connections), then a new
    client is served within a second while they stay open."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3500:
        pytest.skip(f"needs 3,500 open files, the limit is {soft} (ulimit -n)")
    idle = []

    def open_hold_and_post():
        for _ in range(3000):
            idle.append(socket.create_connection(server["address"], timeout=5))
        burst = time.monotonic()
        while requests.get(f"{server['url']}/v1/models/{NAME}", timeout=30).status_code != 200:
            pass
        caught_up = time.monotonic() - burst
        time.sleep(0.5)
        start = time.monotonic()
        answer = requests.post(f"{server['url']}/v1/models/{NAME}:predict",
                               json={"inputs": {"text": ["a dog"]}}, timeout=30)
        return answer.status_code, round(time.monotonic() - start, 3), round(caught_up, 3)

    try:
        record = _probe(server, "3,000 idle TCP connections", open_hold_and_post)
    finally:
        for s in idle:
            s.close()
    status, served_in, _ = record["answer"]
    assert status == 200 and served_in < 1, record


def test_a_header_line_that_never_ends_is_cut_at_the_limit(server):
    def send():
        sent = 0
        with socket.create_connection(server["address"], timeout=5) as sock:
            sock.sendall(b"GET /v1/models/tiny HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            try:
                for _ in range(200):  # 12.5 MiB if nothing stops it
                    sock.sendall(b"a" * 65536)
                    sent += 65536
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                answer = sock.recv(4096)
            except (ConnectionResetError, TimeoutError):
                answer = b""
        return [answer[:12].decode(), sent]

    record = _probe(server, "a header line that never ends, 64 KiB chunks", send)
    status, sent = record["answer"]
    assert status in ("HTTP/1.1 431", ""), record  # the 431 may be lost to the reset
    assert sent < 4 << 20, record
    assert record["worst_status_get_seconds"] < 1, record
