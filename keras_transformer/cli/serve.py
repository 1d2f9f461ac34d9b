"""Serves exported translators over TF Serving's REST API, for development,
demos and tests. TF Serving is the production server; kt-serve speaks the
same REST API on the same SavedModels, so clients written against one work
against the other.

    kt-export --run-dir runs/base --name demo      # saved_models/demo/1
    kt-serve --model-name demo --model-base-path saved_models/demo
    # kt-serve: serving demo version 1 at http://127.0.0.1:8501
    curl -d '{"inputs": {"text": ["Ein Hund."]}}' \\
        http://127.0.0.1:8501/v1/models/demo:predict

Routes: POST /v1/models/NAME[/versions/N]:predict, GET /v1/models/NAME[/versions/N]
(status), GET .../metadata, GET /v1/models/NAME/batching (batching counters),
GET / (the playground). It serves the newest integer version directory under
--model-base-path and loads newer ones as they appear (kt-export renames a
finished version into place), switching when loaded. Once listening it prints
one line to stdout, `kt-serve: serving NAME version V at http://HOST:PORT`.
A base path with no loadable version exits with status 2. See docs/serving.md.
"""

import argparse
import os
import sys

from keras_transformer import startup
from keras_transformer.cli.common import run_command


def _at_least(low, kind=int):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, received {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, received {text}")
        return value
    return parse


def build_parser():
    # Plain constants: reading them loads no TensorFlow.
    from keras_transformer.serving import limits

    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="kt-serve", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    models = parser.add_argument_group("models (one by name, or TF Serving's config file)")
    models.add_argument("--model-name",
                        help="the model's name in the URLs (/v1/models/NAME)")
    models.add_argument("--model-base-path",
                        help="the directory of its versions, saved_models/NAME/<version>/ "
                        "(default: saved_models/NAME)")
    models.add_argument("--model-config-file",
                        help="TF Serving's ModelServerConfig text file: several models, "
                        "version policies and labels (instead of --model-name; needs the "
                        "grpc extra)")
    models.add_argument("--model-config-file-poll-wait-seconds", type=_at_least(0, float),
                        default=0.0,
                        help="seconds between looks at --model-config-file for changes; 0: "
                        "read it only at start (default: %(default)s)")
    models.add_argument("--file-system-poll-wait-seconds", type=_at_least(0, float),
                        default=1.0,
                        help="seconds between looks for new versions; 0: look only at "
                        "start (default: %(default)s)")
    models.add_argument("--max-num-load-retries", type=_at_least(0),
                        default=limits.DEFAULT_MAX_NUM_LOAD_RETRIES,
                        help="tries after a version fails to load (default: %(default)s)")
    models.add_argument("--load-retry-interval-micros", type=_at_least(0),
                        default=limits.DEFAULT_LOAD_RETRY_INTERVAL_MICROS,
                        help="microseconds between two tries (default: %(default)s)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--engine", choices=("auto", "savedmodel", "ctranslate2"),
                        default="auto",
                        help="what serves a version: auto (by what its directory holds: "
                        "saved_model.pb or a CTranslate2 export), savedmodel or ctranslate2 "
                        "(default: %(default)s)")
    engine.add_argument("--ctranslate2-compute-type", default="default",
                        help="CTranslate2's compute type: default (as exported: float32, or "
                        "int8_float32 for an int8 export), float32, int8, int8_float32 "
                        "(default: %(default)s)")
    engine.add_argument("--ctranslate2-threads", type=_at_least(0), default=1,
                        help="CTranslate2's threads per search, intra_threads; 0: its "
                        "default (default: %(default)s)")
    engine.add_argument("--ctranslate2-vocabulary-map", choices=("auto", "on", "off"),
                        default="auto",
                        help="use a CTranslate2 export's vocabulary map (vmap.txt): auto (if "
                        "it has one), on (it must), off (default: %(default)s)")
    engine.add_argument("--ctranslate2-inter-threads", type=_at_least(1), default=1,
                        help="CTranslate2 searches that run at once, inter_threads "
                        "(default: %(default)s)")
    parser.add_argument("--rest-api-port", type=_at_least(0), default=8501,
                        help="port to listen on; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--rest-api-host", default="127.0.0.1",
                        help="address to listen on, REST and gRPC (default: %(default)s, this "
                        "machine only; 0.0.0.0 exposes the server to the network)")
    parser.add_argument("--port", type=_at_least(0), default=None,
                        help="gRPC port (TF Serving's PredictionService and ModelService); "
                        "0 picks a free one; default: no gRPC (needs the grpc extra)")
    security = parser.add_argument_group("access")
    security.add_argument("--allowed-hosts", metavar="HOSTS",
                          help="comma-separated Host headers REST answers, e.g. "
                          "localhost,127.0.0.1 or *.example.com; others get 400 (against DNS "
                          "rebinding; default: any)")
    security.add_argument("--rest-api-enable-cors-support", action="store_true",
                          help="answer CORS preflights and allow any origin on REST")
    security.add_argument("--ssl-config-file",
                          help="TF Serving's SSLConfig text file: TLS on the gRPC port, "
                          "client certificates with client_verify (needs --port)")
    security.add_argument("--enable-grpc-healthcheck-service", action="store_true",
                          help="the standard gRPC health service (grpc.health.v1) on --port: "
                          "SERVING while a model version is available")
    parser.add_argument("--monitoring-config-file",
                        help="TF Serving's MonitoringConfig text file: prometheus_config "
                        "{enable, path} (default: metrics at /monitoring/prometheus/metrics)")
    batching = parser.add_argument_group("batching (as TF Serving's)")
    batching.add_argument("--enable-batching", action="store_true",
                          help="merge concurrent requests of the same signature and options "
                          "into one model call")
    batching.add_argument("--max-batch-size", type=_at_least(1), default=32,
                          help="most sentences in one merged call (default: %(default)s)")
    batching.add_argument("--batch-timeout-micros", type=_at_least(0), default=2000,
                          help="longest wait for a batch to fill, in microseconds "
                          "(default: %(default)s)")
    batching.add_argument("--max-enqueued-batches", type=_at_least(1), default=64,
                          help="batches that may wait; beyond, requests get 503 "
                          "(default: %(default)s)")
    batching.add_argument("--num-batch-threads", type=_at_least(1), default=1,
                          help="batches that run at once (default: %(default)s)")
    work = parser.add_argument_group("limits (each refusal is a 4xx or 503 with a message)")
    work.add_argument("--max-request-sentences", type=_at_least(1),
                      default=limits.DEFAULT_MAX_REQUEST_SENTENCES,
                      help="most sentences in one request; more get 400 (with batching, "
                      "also at most --max-batch-size, as TF Serving refuses) "
                      "(default: %(default)s)")
    work.add_argument("--max-beam-size", type=_at_least(1),
                      default=limits.DEFAULT_MAX_BEAM_SIZE,
                      help="largest beam_size a request may ask for; larger get 400 "
                      "(default: %(default)s)")
    work.add_argument("--max-request-work", type=_at_least(0),
                      default=limits.DEFAULT_MAX_REQUEST_WORK,
                      help="most work one request may ask for: sentences x beam x (source "
                      "pieces + target limit), source pieces bounded by each sentence's "
                      "UTF-8 bytes; more get 400 naming the numbers; 0: no limit "
                      "(default: %(default)s)")
    work.add_argument("--chunk-work", type=_at_least(1), default=limits.DEFAULT_CHUNK_WORK,
                      help="an unbatched request of more work runs in row chunks of at most "
                      "this much, so a deadline or a client that goes away stops the chunks "
                      "not yet started (default: %(default)s)")
    work.add_argument("--max-request-bytes", type=_at_least(1), default=1 << 20,
                      help="largest request body; larger ones get 413 (default: %(default)s)")
    work.add_argument("--max-enqueued-requests", type=_at_least(1),
                      default=limits.DEFAULT_MAX_ENQUEUED_REQUESTS,
                      help="unbatched requests waiting for or running on the model; more "
                      "get 503 (default: %(default)s)")
    work.add_argument("--max-concurrent-requests", type=_at_least(1),
                      default=limits.DEFAULT_MAX_CONCURRENT_REQUESTS,
                      help="requests in flight, REST and gRPC each; more get 503 "
                      "(default: %(default)s)")
    work.add_argument("--max-connections", type=_at_least(1),
                      default=limits.DEFAULT_MAX_CONNECTIONS,
                      help="open REST connections; one more closes the longest idle one, "
                      "or gets 503 when all are busy (default: %(default)s)")
    work.add_argument("--max-header-bytes", type=_at_least(64),
                      default=limits.DEFAULT_MAX_HEADER_BYTES,
                      help="longest request line and headers; longer get 431 and the "
                      "connection closes (default: %(default)s)")
    work.add_argument("--max-url-bytes", type=_at_least(16), default=limits.DEFAULT_MAX_URL_BYTES,
                      help="longest request line; longer get 414 and the connection closes "
                      "(default: %(default)s)")
    work.add_argument("--request-header-timeout-seconds", type=_at_least(0.001, float),
                      default=limits.DEFAULT_HEADER_TIMEOUT_SECONDS,
                      help="a connection whose request headers take longer is closed "
                      "(default: %(default)s)")
    work.add_argument("--request-body-timeout-seconds", type=_at_least(0.001, float),
                      default=limits.DEFAULT_BODY_TIMEOUT_SECONDS,
                      help="a body that takes longer to arrive gets 408 "
                      "(default: %(default)s)")
    work.add_argument("--rest-api-timeout-in-ms", type=_at_least(0),
                      default=limits.DEFAULT_REST_API_TIMEOUT_MS,
                      help="a predict request that takes longer gets 504; 0: no limit "
                      "(default: %(default)s)")
    startup.add_arguments(parser)
    return parser


def _metrics_path(path):
    """The metrics path a MonitoringConfig file asks for (None: off)."""
    if path is None:
        from keras_transformer.serving.app import METRICS_PATH

        return METRICS_PATH
    try:
        from google.protobuf import text_format
        from tensorflow_serving.config import monitoring_config_pb2
    except ImportError:
        raise ImportError("--monitoring-config-file needs TF Serving's protos: pip install "
                          "'attention-transformer-keras[grpc]'") from None
    config = monitoring_config_pb2.MonitoringConfig()
    with open(path, encoding="utf-8") as f:
        try:
            text_format.Parse(f.read(), config)
        except text_format.ParseError as e:
            raise ValueError(f"--monitoring-config-file {path}: {e}") from None
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    return prometheus.path or "/monitoring/prometheus/metrics"


def serve(argv=None):
    """kt-serve as a function: loads the models' versions, serves until
    SIGINT/SIGTERM.

    Raises: `FileNotFoundError` (`NoServableVersion`) when a model has no
    loadable version; `ValueError` for a bad config file or an address
    that cannot be bound; `ImportError` when an option needs the grpc extra.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.model_name is None) == (args.model_config_file is None):
        parser.error("give --model-name (with --model-base-path) or --model-config-file, "
                     "not both")
    if args.model_config_file and args.model_base_path:
        parser.error("--model-base-path goes with --model-name; a config file names each "
                     "model's base_path")
    for flag, given in (("--ssl-config-file", args.ssl_config_file),
                        ("--enable-grpc-healthcheck-service",
                         args.enable_grpc_healthcheck_service)):
        if given and args.port is None:
            parser.error(f"{flag} is for the gRPC port: give --port too")
    from keras_transformer.serving import security
    from keras_transformer.serving.app import ServingApp
    from keras_transformer.serving.batching import BatchScheduler
    from keras_transformer.serving.metrics import Metrics
    from keras_transformer.serving.model_versions import VersionPolicy
    from keras_transformer.serving.models import (
        ModelConfigWatcher,
        ServedModels,
        manager_factory,
        version_loader,
    )
    from keras_transformer.serving.server import bind, configure_logging, run_server, url_of
    from keras_transformer.serving.work import RequestLimits

    configure_logging()
    metrics_path = _metrics_path(args.monitoring_config_file)
    allowed_hosts = (security.parse_allowed_hosts(args.allowed_hosts)
                     if args.allowed_hosts is not None else None)
    credentials = (security.grpc_server_credentials(args.ssl_config_file)
                   if args.ssl_config_file else None)
    if args.enable_grpc_healthcheck_service:
        from keras_transformer.serving.grpc_admin import health_imports

        health_imports()
    metrics = Metrics()
    request_limits = RequestLimits(args.max_request_sentences, args.max_beam_size,
                                   args.max_request_work)
    load = version_loader(args.engine, args.ctranslate2_compute_type, args.ctranslate2_threads,
                          args.ctranslate2_inter_threads, args.ctranslate2_vocabulary_map,
                          request_limits)
    make_manager = manager_factory(args.file_system_poll_wait_seconds,
                                   args.max_num_load_retries,
                                   args.load_retry_interval_micros / 1e6, metrics, load=load)
    models = ServedModels({})
    watcher = None
    sock = bind(args.rest_api_host, args.rest_api_port)
    batcher = None
    try:
        if args.model_config_file:
            watcher = ModelConfigWatcher(args.model_config_file, models, make_manager,
                                         args.model_config_file_poll_wait_seconds)
            watcher.start()
        else:
            base_path = args.model_base_path or os.path.join("saved_models", args.model_name)
            manager = make_manager(args.model_name, base_path, VersionPolicy.latest(1))
            manager.start()
            models.replace({args.model_name: manager}, {})
        if args.enable_batching:
            batcher = BatchScheduler(args.max_batch_size, args.batch_timeout_micros,
                                     args.max_enqueued_batches, args.num_batch_threads,
                                     metrics=metrics)
        app = ServingApp(models, batcher=batcher, max_request_bytes=args.max_request_bytes,
                         request_limits=request_limits,
                         chunk_work=args.chunk_work,
                         max_enqueued_requests=args.max_enqueued_requests,
                         max_concurrent_requests=args.max_concurrent_requests,
                         body_timeout=args.request_body_timeout_seconds,
                         rest_api_timeout=args.rest_api_timeout_in_ms / 1000,
                         metrics=metrics, metrics_path=metrics_path)
        grpc_address = {}

        def on_start(loop):
            if args.port is None:
                return None
            from keras_transformer.serving.grpc_service import start_grpc_server

            server, port = start_grpc_server(
                app, loop, args.rest_api_host, args.port, credentials=credentials,
                config_watcher=watcher, health=args.enable_grpc_healthcheck_service)
            grpc_address["port"] = port
            return lambda: server.stop(1)

        def ready():
            # The gRPC line first: a reader that stops at the first serving
            # line has seen it.
            if "port" in grpc_address:
                print(f"kt-serve: gRPC at {args.rest_api_host}:{grpc_address['port']}",
                      flush=True)
            for name in models.names:
                served = models.get(name).get()
                print(f"kt-serve: serving {name} version {served.version} at "
                      f"{url_of(sock)}", flush=True)

        http_app = security.http_middleware(app.app, args.rest_api_enable_cors_support,
                                            allowed_hosts)
        run_server(http_app, sock, ready, header_timeout=args.request_header_timeout_seconds,
                   max_connections=args.max_connections, on_start=on_start,
                   max_header_bytes=args.max_header_bytes, max_url_bytes=args.max_url_bytes)
    finally:
        if watcher is not None:
            watcher.stop()
        models.stop()
        if batcher is not None:
            batcher.shutdown()
        sock.close()


def main(argv=None):
    """kt-serve; returns the exit status (2: no loadable version under a
    base path, a bad config file, or the address is taken, with the reason
    on stderr)."""
    startup.start(argv)
    try:
        return run_command(serve, argv)
    except ImportError as e:  # an option that needs an extra
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
