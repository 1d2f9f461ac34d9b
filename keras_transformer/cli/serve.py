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
    from keras_transformer.serving.limits import (
        DEFAULT_MAX_BEAM_SIZE,
        DEFAULT_MAX_REQUEST_SENTENCES,
    )

    parser = argparse.ArgumentParser(
        prog="kt-serve", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-name", required=True,
                        help="the model's name in the URLs (/v1/models/NAME)")
    parser.add_argument("--model-base-path",
                        help="the directory of its versions, saved_models/NAME/<version>/ "
                        "(default: saved_models/NAME)")
    parser.add_argument("--rest-api-port", type=_at_least(0), default=8501,
                        help="port to listen on; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--rest-api-host", default="127.0.0.1",
                        help="address to listen on (default: %(default)s, this machine only; "
                        "0.0.0.0 exposes the server to the network)")
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
    parser.add_argument("--file-system-poll-wait-seconds", type=_at_least(0, float), default=1.0,
                        help="seconds between looks for a new version; 0: look only at "
                        "start (default: %(default)s)")
    parser.add_argument("--max-request-sentences", type=_at_least(1),
                        default=DEFAULT_MAX_REQUEST_SENTENCES,
                        help="most sentences in one request; more get 400 (with batching, "
                             "also at most --max-batch-size, as TF Serving refuses)")
    parser.add_argument("--max-beam-size", type=_at_least(1), default=DEFAULT_MAX_BEAM_SIZE,
                        help="largest beam_size a request may ask for; larger get 400")
    parser.add_argument("--max-request-bytes", type=_at_least(1), default=1 << 20,
                        help="largest request body; larger ones get 413 (default: %(default)s)")
    startup.add_arguments(parser)
    return parser


def serve(argv=None):
    """kt-serve as a function: loads the newest version, serves until
    SIGINT/SIGTERM.

    Raises: `FileNotFoundError` (`NoServableVersion`) when the base path has
    no loadable version; `ValueError` when the address cannot be bound.
    """
    args = build_parser().parse_args(argv)
    from keras_transformer.serving.app import (
        ServingApp,
        bind,
        configure_logging,
        run_server,
        url_of,
    )
    from keras_transformer.serving.batching import BatchScheduler
    from keras_transformer.serving.model_versions import VersionManager

    configure_logging()
    base_path = args.model_base_path or os.path.join("saved_models", args.model_name)
    versions = VersionManager(base_path, args.file_system_poll_wait_seconds)
    sock = bind(args.rest_api_host, args.rest_api_port)
    batcher = None
    try:
        versions.start()
        if args.enable_batching:
            batcher = BatchScheduler(args.max_batch_size, args.batch_timeout_micros,
                                     args.max_enqueued_batches, args.num_batch_threads)
        app = ServingApp(args.model_name, versions, batcher, args.max_request_bytes,
                         max_request_sentences=args.max_request_sentences,
                         max_beam_size=args.max_beam_size)

        def ready():
            served = versions.get()
            print(f"kt-serve: serving {args.model_name} version {served.version} at "
                  f"{url_of(sock)}", flush=True)

        run_server(app.app, sock, ready)
    finally:
        versions.stop()
        if batcher is not None:
            batcher.shutdown()
        sock.close()


def main(argv=None):
    """kt-serve; returns the exit status (2: no loadable version under the
    base path, or the address is taken, with the reason on stderr)."""
    startup.start(argv)
    return run_command(serve, argv)


if __name__ == "__main__":
    sys.exit(main())
