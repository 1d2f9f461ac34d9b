"""Who may reach kt-serve, and over what: the Host-header allowlist
(`--allowed-hosts`) and CORS (`--rest-api-enable-cors-support`) of the
REST server, and TLS for the gRPC port (`--ssl-config-file`).

The HTTP checks are Starlette's middleware: `TrustedHostMiddleware` decides
whether a Host is allowed (its parsing and `*.example.com` patterns), and a
refusal is TF Serving's JSON error body; `CORSMiddleware` answers preflights
and adds the CORS headers, allowing any origin as TF Serving does.
"""

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from keras_transformer.serving.app import error_response

_ALLOWED = "kt_serve.allowed_host"  # scope key: the request passed the Host check


def parse_allowed_hosts(text):
    """The host patterns of `--allowed-hosts` ("localhost,*.example.com"):
    host names or addresses without a port, a leading `*.` matching any
    subdomain.

    Raises: `ValueError` naming the flag for an empty list or a pattern
    Starlette does not accept.
    """
    hosts = [host.strip() for host in text.split(",") if host.strip()]
    if not hosts:
        raise ValueError(f"--allowed-hosts {text!r}: names no host.")
    for host in hosts:
        if "*" in host[1:] or (host.startswith("*") and not host.startswith("*.")) \
                or host == "*":
            raise ValueError(f"--allowed-hosts: {host!r} is not a host or a '*.domain' "
                             "pattern.")
    return hosts


class JsonTrustedHost:
    """ASGI middleware: Starlette's `TrustedHostMiddleware` check, with a
    refused request answered 400 and TF Serving's `{"error": ...}`
    instead of Starlette's text/plain body."""

    def __init__(self, app, allowed_hosts):
        self.app = app
        self.allowed_hosts = list(allowed_hosts)
        self._check = TrustedHostMiddleware(self._passed, self.allowed_hosts,
                                            www_redirect=False)

    async def _passed(self, scope, receive, send):
        scope[_ALLOWED] = True
        await self.app(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_or_drop(message):
            # Starlette's own refusal is dropped; the app's answer goes out.
            if scope.get(_ALLOWED):
                await send(message)

        await self._check(scope, receive, send_or_drop)
        if not scope.get(_ALLOWED):
            host = Headers(scope=scope).get("host", "")
            response = error_response(
                f"Invalid host header {host!r}: not in --allowed-hosts "
                f"({','.join(self.allowed_hosts)}).", 400)
            await response(scope, receive, send)


def http_middleware(app, cors=False, allowed_hosts=None):
    """`app` (ASGI) behind the Host check when `allowed_hosts` (a list of
    patterns) is given, and answering CORS when `cors`; the Host check
    comes first, so a refused Host gets no CORS preflight either."""
    if cors:
        app = CORSMiddleware(app, allow_origins=["*"], allow_methods=["GET", "POST"],
                             allow_headers=["*"])
    if allowed_hosts:
        app = JsonTrustedHost(app, allowed_hosts)
    return app


def ssl_config_class():
    """TF Serving's `tensorflow.serving.SSLConfig` message class: from
    `tensorflow_serving.config.ssl_config_pb2` where installed, else
    built from its four fields (tensorflow-serving-api does not ship that
    module)."""
    try:
        from tensorflow_serving.config import ssl_config_pb2

        return ssl_config_pb2.SSLConfig
    except ImportError:
        pass
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/config/ssl_config.proto", package="tensorflow.serving",
        syntax="proto3")
    message = proto.message_type.add(name="SSLConfig")
    for number, (name, kind) in enumerate(
            [("server_key", field.TYPE_STRING), ("server_cert", field.TYPE_STRING),
             ("custom_ca", field.TYPE_STRING), ("client_verify", field.TYPE_BOOL)], 1):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    # A pool of its own: the default one may hold TF Serving's definition.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.SSLConfig"))


def grpc_server_credentials(path):
    """`grpc.ServerCredentials` from TF Serving's `SSLConfig` text file at
    `path`: `server_key` and `server_cert` (PEM text), `custom_ca` (PEM
    text of the CA that signs client certificates) and `client_verify`
    (require a client certificate signed by `custom_ca`).

    Raises: `ValueError` naming `--ssl-config-file` and `path` for a file
    that cannot be read or parsed, or lacks what its settings need;
    `ImportError` without the `grpc` extra.
    """
    try:
        import grpc
        from google.protobuf import text_format
    except ImportError:
        raise ImportError("--ssl-config-file needs grpcio and protobuf: pip install "
                          "'attention-transformer-keras[grpc]'") from None
    where = f"--ssl-config-file {path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot read it: {e}") from None
    config = ssl_config_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ValueError(f"{where}: {e}") from None
    for field, kind in (("server_key", "PRIVATE KEY"), ("server_cert", "CERTIFICATE")):
        value = getattr(config, field)
        if "-----BEGIN" not in value or kind not in value:
            raise ValueError(f"{where}: {field} must hold a PEM {kind.lower()} (the text, "
                             "not a file name).")
    if config.custom_ca and "-----BEGIN CERTIFICATE" not in config.custom_ca:
        raise ValueError(f"{where}: custom_ca must hold PEM certificates (the text, not a "
                         "file name).")
    if config.client_verify and not config.custom_ca:
        raise ValueError(f"{where}: client_verify needs custom_ca, the CA that signs the "
                         "clients' certificates.")
    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() or None,
        require_client_auth=config.client_verify)
