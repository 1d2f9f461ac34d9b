"""The operators' side of kt-serve's gRPC port: the standard gRPC health
service (`--enable-grpc-healthcheck-service`, `grpc.health.v1.Health` from
`grpcio-health-checking`) and `ModelService.HandleReloadConfigRequest`
(with `--model-config-file`).

Health: the service "" is SERVING while at least one model has a version
available, NOT_SERVING otherwise; each served model's name is a service
too, SERVING while that model has a version available (a removed model
turns NOT_SERVING). The status is brought up to date at each Check and
every `HEALTH_REFRESH_SECONDS` (for Watch streams).
"""

import threading

HEALTH_REFRESH_SECONDS = 1.0


def health_imports():
    """The `grpc_health.v1` modules (health, health_pb2, health_pb2_grpc).

    Raises: `ImportError` naming the flag and the extra without
    grpcio-health-checking.
    """
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    except ImportError:
        raise ImportError("--enable-grpc-healthcheck-service needs grpcio-health-checking: "
                          "pip install 'attention-transformer-keras[grpc]'") from None
    return health, health_pb2, health_pb2_grpc


def add_health_service(server, models):
    """Adds the health service, following `models` (a `ServedModels`), to
    a `grpc.Server` not started yet; it follows them until the server
    stops.

    Returns: a callable that starts following (call it after
    `server.start()`).
    Raises: `ImportError` without grpcio-health-checking.
    """
    health, health_pb2, health_pb2_grpc = health_imports()
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    known = set()
    lock = threading.Lock()

    def refresh():
        with lock:
            available = {name for name in models.names
                         if (manager := models.get(name)) is not None
                         and manager.get() is not None}
            servicer.set("", serving if available else not_serving)
            for name in known | set(models.names):
                servicer.set(name, serving if name in available else not_serving)
            known.update(models.names)

    class Health(health.HealthServicer):
        def Check(self, request, context):  # noqa: N802  (the proto's name)
            refresh()
            return super().Check(request, context)

    servicer = Health()
    refresh()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)

    def follow():
        # wait_for_termination is True while it times out: the server runs.
        while server.wait_for_termination(HEALTH_REFRESH_SECONDS):
            refresh()

    def start():
        threading.Thread(target=follow, name="kt-serve-health", daemon=True).start()

    return start


def reload_config(watcher, request, context, grpc):
    """`HandleReloadConfigRequest`: applies `request.config` through
    `watcher` (a `models.ModelConfigWatcher`, None without
    `--model-config-file`).

    Returns: a `ReloadConfigResponse` with status OK. Aborts the call with
    FAILED_PRECONDITION without a config file, INVALID_ARGUMENT for a
    config kt-serve does not serve (nothing changes), NOT_FOUND or UNKNOWN
    naming the models that did not load (the others are served).
    """
    from tensorflow_serving.apis import model_management_pb2

    if watcher is None:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "HandleReloadConfigRequest needs a server started with "
                      "--model-config-file.")
    try:
        failures = watcher.reload(request.config)
    except ValueError as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    if failures:
        code = (grpc.StatusCode.NOT_FOUND
                if all(isinstance(e, FileNotFoundError) for e in failures.values())
                else grpc.StatusCode.UNKNOWN)
        context.abort(code, "; ".join(f"model {name} does not load: {e}"
                                      for name, e in failures.items()))
    return model_management_pb2.ReloadConfigResponse()
