"""Exports a trained model as a SavedModel that TF Serving serves: strings
in, strings out.

    kt-export --run-dir runs/base --name de_en
    # -> saved_models/de_en/<next version>/  (written to a temporary
    #    directory and renamed, so a running server never sees half a model)

The SavedModel has the signatures `serving_default` (text -> translation,
score, with --beam-size/--alpha/--extra-length fixed at export),
`translate_with_options` (the same plus beam_size, alpha, extra_length
inputs), `translate_ids` (token ids in and out), `translate_xla`,
`translate_nbest`, `translate_sample` and `translate_explain` (pieces,
per-token log-probabilities and the source alignment); docs/serving.md
describes them. It needs only TensorFlow and tensorflow-text to load.
`--examples FILE` stores example source sentences in it, which kt-serve's
playground offers.

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
    read_lines,
    run_command,
)


# Example sentences kept from --examples.
MAX_EXAMPLES = 50


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
    parser.add_argument("--examples", metavar="FILE",
                        help="a text file of source sentences, one per line (the first "
                        f"{MAX_EXAMPLES}, blank lines skipped), stored in the SavedModel's "
                        "assets.extra/examples.json for kt-serve's playground to offer")
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
    examples = None
    if args.examples:
        examples = [line.decode("utf-8", "replace").strip()
                    for line in read_lines(args.examples)]
        examples = [line for line in examples if line][:MAX_EXAMPLES]
    path = export_translator(translator, args.output_dir, name, args.version,
                             examples=examples)
    print(path)
    return path


def main(argv=None):
    """kt-export; returns the exit status (2: no such checkpoint or a stale
    average, with the reason on stderr)."""
    startup.start(argv)
    return run_command(export, argv)


if __name__ == "__main__":
    sys.exit(main())
