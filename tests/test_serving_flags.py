"""TF Serving's access and operations flags on kt-serve: CORS
(`--rest-api-enable-cors-support`), the Host allowlist (`--allowed-hosts`),
the gRPC health service (`--enable-grpc-healthcheck-service`),
HandleReloadConfigRequest (with `--model-config-file`) and TLS on the gRPC
port (`--ssl-config-file`). Fake models (no TensorFlow model runs) in
process, and one kt-serve on the tiny export with every flag at once."""

import asyncio
import datetime
import ipaddress
import os

import pytest
from test_serving_operations import CONFIG, FakeServable, _serve_config, make_version

from keras_transformer.serving.app import ServingApp
from keras_transformer.serving.model_versions import VersionManager
from keras_transformer.serving.security import (
    grpc_server_credentials,
    http_middleware,
    parse_allowed_hosts,
)

BODY = {"instances": ["hi"]}


def _fake_app(tmp_path):
    make_version(tmp_path / "m", 1)
    manager = VersionManager(str(tmp_path / "m"), poll_wait_seconds=0, load=FakeServable)
    manager.start()
    return ServingApp("m", manager)


def _ask(app, calls):
    import httpx

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return [await c.request(m, p, **k) for m, p, k in calls]

    return asyncio.run(run())


PREFLIGHT = {"headers": {"Origin": "https://page.example", "Access-Control-Request-Method":
                         "POST", "Access-Control-Request-Headers": "content-type"}}


# REST: CORS and the Host allowlist ------------------------------------------------


def test_cors_is_off_by_default_and_allows_any_origin_when_on(tmp_path):
    serving = _fake_app(tmp_path)
    predict = ("POST", "/v1/models/m:predict",
               {"json": BODY, "headers": {"Origin": "https://page.example"}})
    preflight, answer = _ask(http_middleware(serving.app),
                             [("OPTIONS", "/v1/models/m:predict", PREFLIGHT), predict])
    assert preflight.status_code == 405 and answer.status_code == 200
    assert "access-control-allow-origin" not in answer.headers
    preflight, answer = _ask(http_middleware(serving.app, cors=True),
                             [("OPTIONS", "/v1/models/m:predict", PREFLIGHT), predict])
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
    assert answer.json()["predictions"][0]["translation"] == "hi@1"


def test_a_host_not_allowed_gets_400_with_a_json_error(tmp_path):
    serving = _fake_app(tmp_path)
    hosts = parse_allowed_hosts("localhost, *.example.com")
    assert hosts == ["localhost", "*.example.com"]
    calls = [("GET", "/v1/models/m", {"headers": {"Host": host}})
             for host in ("localhost:8501", "api.example.com", "attacker.test:8501", "")]
    local, sub, attacker, empty = _ask(http_middleware(serving.app, allowed_hosts=hosts),
                                       calls)
    assert local.status_code == 200 and sub.status_code == 200
    for refused in (attacker, empty):
        assert refused.status_code == 400
        assert refused.headers["content-type"] == "application/json"
        assert "--allowed-hosts" in refused.json()["error"]
    assert "attacker.test:8501" in attacker.json()["error"]
    # Without the flag every Host is answered.
    assert _ask(http_middleware(serving.app), calls[2:3])[0].status_code == 200
    for text in ("", " , ", "*", "a.*.com", "*example.com"):
        with pytest.raises(ValueError, match="--allowed-hosts"):
            parse_allowed_hosts(text)


# gRPC: health, reload, TLS (in process, fake models) -------------------------------


class Aborted(Exception):
    pass


class FakeContext:
    """A `grpc.ServicerContext`'s abort: raises, keeping code and message."""

    def abort(self, code, message):
        self.code, self.message = code, message
        raise Aborted(message)


def _config_proto(text):
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2

    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(text, request.config)
    return request


def test_reload_config_request_applies_a_config_like_the_file(tmp_path):
    pytest.importorskip("tensorflow_serving")
    import grpc

    from keras_transformer.serving.grpc_admin import reload_config

    _, models, watcher = _serve_config(tmp_path, poll=0)
    try:
        assert models.names == ["en_de", "de_en"]
        new = (CONFIG.replace("specific { versions: 1 versions: 2 }",
                              "latest { num_versions: 2 }")
               .replace('key: "stable" value: 1', 'key: "stable" value: 3')
               .split("  config {\n    name: \"de_en\"")[0] + "}\n")
        response = reload_config(watcher, _config_proto(new), FakeContext(), grpc)
        assert response.status.error_code == 0
        assert models.names == ["en_de"]
        assert models.get("en_de").served_versions() == [2, 3]
        assert models.label_version("en_de", "stable") == 3
        for text, code, message in [
                ("model_config_list { config { name: 'x' } }",
                 grpc.StatusCode.INVALID_ARGUMENT,
                 r"ReloadConfigRequest: config 1 \(x\): base_path is empty"),
                ("", grpc.StatusCode.INVALID_ARGUMENT, "names no model"),
                ("model_config_list { config { name: 'y' base_path: 'absent' } }",
                 grpc.StatusCode.NOT_FOUND, "model y does not load")]:
            context = FakeContext()
            with pytest.raises(Aborted, match=message):
                reload_config(watcher, _config_proto(text), context, grpc)
            assert context.code == code
            # An invalid config changes nothing; a valid one is served as it says.
            assert models.names == ([] if code == grpc.StatusCode.NOT_FOUND else ["en_de"])
        context = FakeContext()
        with pytest.raises(Aborted, match="--model-config-file"):
            reload_config(None, _config_proto(new), context, grpc)
        assert context.code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        watcher.stop()
        models.stop()


def _certificate(name, key, issuer=None, issuer_key=None, ca=False, server=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer.subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki():
    """PEM text of a throwaway CA, a server certificate for 127.0.0.1 and a
    client certificate, each with its key."""
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def pem_key(key):
        return key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()

    def pem(cert):
        return cert.public_bytes(serialization.Encoding.PEM).decode()

    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("ca", "server",
                                                                       "client")}
    ca = _certificate("kt-test-ca", keys["ca"], ca=True)
    return {"ca": pem(ca),
            "server_cert": pem(_certificate("localhost", keys["server"], ca, keys["ca"],
                                            server=True)),
            "server_key": pem_key(keys["server"]),
            "client_cert": pem(_certificate("client", keys["client"], ca, keys["ca"])),
            "client_key": pem_key(keys["client"])}


def _ssl_config(path, pki, custom_ca=True):
    from google.protobuf import text_format

    from keras_transformer.serving.security import ssl_config_class

    config = ssl_config_class()(server_key=pki["server_key"],
                                      server_cert=pki["server_cert"],
                                      custom_ca=pki["ca"] if custom_ca else "",
                                      client_verify=True)
    path.write_text(text_format.MessageToString(config))
    return str(path)


def _channel(target, pki, client_certificate=True):
    import grpc

    options = {"root_certificates": pki["ca"].encode()}
    if client_certificate:
        options.update(private_key=pki["client_key"].encode(),
                       certificate_chain=pki["client_cert"].encode())
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(**options))


def _health(channel, service=""):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(channel)
    status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30).status
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


def test_grpc_over_tls_with_client_certificates_and_health(tmp_path, pki):
    pytest.importorskip("tensorflow_serving")
    pytest.importorskip("grpc_health")
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    from keras_transformer.serving.grpc_service import start_grpc_server

    serving = _fake_app(tmp_path)
    manager = serving.versions
    credentials = grpc_server_credentials(_ssl_config(tmp_path / "ssl.config", pki))
    server, port = start_grpc_server(serving, None, "127.0.0.1", 0, credentials=credentials,
                                     health=True)
    target = f"127.0.0.1:{port}"
    try:
        with _channel(target, pki) as channel:
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = "m"
            status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                request, timeout=30)
            assert status.model_version_status[0].version == 1
            assert _health(channel) == "SERVING" and _health(channel, "m") == "SERVING"
            with pytest.raises(grpc.RpcError) as raised:
                _health(channel, "other")
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            # No model version available: not serving, for Watch without a Check too.
            serving.models.replace({}, {})
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
            assert _health(channel) == "NOT_SERVING" and _health(channel, "m") == "NOT_SERVING"
        for channel in (_channel(target, pki, client_certificate=False),
                        grpc.insecure_channel(target)):
            with channel, pytest.raises(grpc.RpcError) as raised:
                _health(channel)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)
        manager.stop()


def test_a_bad_ssl_config_file_is_an_error_naming_it(tmp_path, pki, capsys):
    from keras_transformer.cli import serve

    path = tmp_path / "ssl.config"
    for text, message in [
            ("server_key: 'k' server_cert: 'c' client_verify: tru",
             r"1:\d+ : .*client_verify"),
            ("server_key: 'k.pem' server_cert: 'c.pem'", "server_key must hold a PEM"),
            (None, "client_verify needs custom_ca")]:
        if text is None:
            _ssl_config(path, pki, custom_ca=False)
        else:
            path.write_text(text)
        with pytest.raises(ValueError, match=message) as raised:
            grpc_server_credentials(str(path))
        assert f"--ssl-config-file {path}" in str(raised.value)
    with pytest.raises(ValueError, match="cannot read it"):
        grpc_server_credentials(str(tmp_path / "absent"))
    assert serve.main(["--model-name", "m", "--model-base-path", str(tmp_path / "none"),
                       "--port", "0", "--rest-api-port", "0",
                       "--ssl-config-file", str(path)]) == 2
    assert str(path) in capsys.readouterr().err


# kt-serve with every flag ----------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    """kt-serve on the tiny export from a config file, with CORS, a Host
    allowlist, health and TLS requiring client certificates."""
    pytest.importorskip("tensorflow_serving")
    pytest.importorskip("grpc_health")
    from support.serving_model import export_tiny_model, start_server, stop_server

    directory = tmp_path_factory.mktemp("flags")
    export = export_tiny_model(directory, name="tiny")
    config = directory / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "tiny" base_path: '
                      f'"{os.path.dirname(export)}" }} }}')
    process, url = start_server([
        "--model-config-file", str(config), "--port", "0",
        "--ssl-config-file", _ssl_config(directory / "ssl.config", pki),
        "--enable-grpc-healthcheck-service", "--rest-api-enable-cors-support",
        "--allowed-hosts", "127.0.0.1,localhost"], timeout=600)
    try:
        yield {"url": url, "target": process.grpc_target, "base": os.path.dirname(export)}
    finally:
        stop_server(process)


def test_kt_serve_answers_cors_and_refuses_other_hosts(server):
    import requests

    url = server["url"]
    preflight = requests.options(f"{url}/v1/models/tiny:predict", timeout=30, **PREFLIGHT)
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    refused = requests.get(f"{url}/v1/models/tiny", headers={"Host": "rebound.test"},
                           timeout=30)
    assert refused.status_code == 400 and "--allowed-hosts" in refused.json()["error"]
    assert requests.get(f"{url}/v1/models/tiny", timeout=30).status_code == 200


def test_kt_serve_grpc_over_tls_health_and_reload(server, pki):
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc

    with _channel(server["target"], pki) as channel:
        assert _health(channel) == "SERVING" and _health(channel, "tiny") == "SERVING"
        request = _config_proto(f'model_config_list {{ config {{ name: "tiny" base_path: '
                                f'"{server["base"]}" version_labels {{ key: "stable" '
                                f'value: 1 }} }} }}')
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        assert stub.HandleReloadConfigRequest(request, timeout=60).status.error_code == 0
        with pytest.raises(grpc.RpcError) as raised:
            stub.HandleReloadConfigRequest(_config_proto(""), timeout=60)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    import requests

    labelled = requests.get(f"{server['url']}/v1/models/tiny/labels/stable", timeout=30)
    assert labelled.status_code == 200
    with _channel(server["target"], pki, client_certificate=False) as channel, \
            pytest.raises(grpc.RpcError) as raised:
        _health(channel)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
