"""Exports a trained model as a SavedModel that TF Serving serves: strings
in, strings out.

    kt-export --run-dir runs/base --name de_en
    # -> saved_models/de_en/<next version>/  (written to a temporary
    #    directory and renamed, so a running server never sees half a model)

The SavedModel has the signatures `serving_default` (text -> translation,
score, with --beam-size/--alpha/--extra-length fixed at export),
`translate_with_options` (the same plus beam_size, alpha, extra_length
inputs) and `translate_ids` (token ids in and out). It needs only
TensorFlow and tensorflow-text to load.

--checkpoint chooses the weights: auto (the default: averaged/ unless training
went on after averaging, else the best validated checkpoint in best/, else the
latest training checkpoint), last, best, averaged, best:K or last:K (average
the best or last K now into averaged/), or a checkpoint prefix. The command
prints `Exporting <checkpoint>: <why>` to stderr, and the SavedModel's path
as the last (only) line of stdout.
"""

import argparse
import os
import sys

from keras_transformer import startup
from keras_transformer.cli.common import (
    add_decoding_arguments,
    add_model_arguments,
    run_command,
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kt-export", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser, saved_model=False)
    add_decoding_arguments(parser, xla=False)
    parser.add_argument("--name", help="model name, the <name> in saved_models/<name>/ "
                        "(default: the run directory's name)")
    parser.add_argument("--output-dir", default="saved_models",
                        help="where <name>/<version>/ is written (default: %(default)s)")
    parser.add_argument("--version", type=int,
                        help="version number (default: one more than the newest)")
    startup.add_arguments(parser)
    return parser


def export(argv=None):
    """kt-export as a function: prints the SavedModel's path.

    Returns: that path.
    """
    from keras_transformer.export import export_translator, translator_from_run_directory

    from keras_transformer.run_directory import RunDirectory

    args = build_parser().parse_args(argv)
    run = RunDirectory(args.run_dir)
    # Resolved once: "best:K" / "last:K" average as a side effect.
    prefix, reason = run.resolve_checkpoint(args.checkpoint)
    # stderr: stdout is the SavedModel's path alone, for scripts.
    print(f"Exporting {reason}", file=sys.stderr, flush=True)
    translator = translator_from_run_directory(
        run, prefix, beam_size=args.beam_size, alpha=args.alpha,
        extra_length=args.extra_length,
    )
    name = args.name or os.path.basename(os.path.normpath(args.run_dir))
    path = export_translator(translator, args.output_dir, name, args.version)
    print(path)
    return path


def main(argv=None):
    """kt-export; returns the exit status (2: no such checkpoint or a stale
    average, with the reason on stderr)."""
    startup.start(argv)
    return run_command(export, argv)


if __name__ == "__main__":
    sys.exit(main())
