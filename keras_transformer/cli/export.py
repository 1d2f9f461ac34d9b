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
playground offers. `--xla-column-blocks 2` makes `translate_xla` faster for
one sentence or a few on CPU, for a larger SavedModel (docs/performance.md).

--format ctranslate2 writes a CTranslate2 model directory instead, for
CTranslate2's CPU engine (needs `pip install ctranslate2`; see
"CTranslate2" in docs/decoding-and-serving.md):

    kt-export --run-dir runs/base --name de_en --format ctranslate2 \\
        --quantization int8
    # -> saved_models/de_en_ct2/<next version>/  (the model, its
    #    vocabularies, the SentencePiece model(s), keras_transformer.json;
    #    written to a temporary directory and renamed)
    kt-translate --ctranslate2-model saved_models/de_en_ct2 --input test.de
    kt-serve --model-name de_en --model-base-path saved_models/de_en_ct2

--quantization is float32 (default, exact), int8 or int8_float32 (int8
weights). --beam-size, --alpha and --extra-length become the directory's
search defaults; --alpha there is CTranslate2's length penalty
(log P / length ** alpha).

--format litert writes a LiteRT (TensorFlow Lite) file for phones and edge
boards, beam search inside (docs/litert.md):

    kt-export --run-dir runs/base --name de_en --format litert \\
        --quantization dynamic-int8
    # -> saved_models/de_en_litert/<next version>/  (model.tflite, the
    #    SentencePiece models, keras_transformer_litert.json)
    kt-translate --litert-model saved_models/de_en_litert --input test.de

--quantization is float32 (default, the SavedModel's translations),
dynamic-int8 (int8 weights) or float16 (float16 weights, float32 arithmetic).
--saved-model saved_models/de_en (instead of --run-dir) rebuilds the
translator from a SavedModel this package exported, its search defaults
included, when the run directory is gone (--format litert only).

--checkpoint chooses the weights: auto (the default: averaged/ unless training
went on after averaging, else the best validated checkpoint in best/, else the
latest training checkpoint), last, best, averaged, best:K or last:K (average
the best or last K now into averaged/), or a checkpoint prefix. The command
prints `Exporting <checkpoint>: <why>` to stderr, and the SavedModel's path
as the last (only) line of stdout (the CTranslate2 or LiteRT directory's
with --format ctranslate2 or litert).
"""

import argparse
import os
import sys

from keras_transformer import startup
from keras_transformer.cli.common import (
    add_decoding_arguments,
    add_model_arguments,
    read_lines,
    require_ctranslate2,
    run_command,
)

# Example sentences kept from --examples.
MAX_EXAMPLES = 50
FORMATS = ("saved_model", "ctranslate2", "litert")


def build_parser():
    from keras_transformer.export.ctranslate2 import QUANTIZATIONS
    from keras_transformer.export.litert import QUANTIZATIONS as LITERT_QUANTIZATIONS

    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="kt-export", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
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
    parser.add_argument("--format", choices=FORMATS, default="saved_model",
                        help="saved_model (default): <output-dir>/<name>/<version>/ for TF "
                        "Serving; ctranslate2: a CTranslate2 model directory, "
                        "<output-dir>/<name>_ct2/<version>/; litert: a LiteRT file for devices, "
                        "<output-dir>/<name>_litert/<version>/")
    parser.add_argument("--quantization",
                        choices=QUANTIZATIONS + LITERT_QUANTIZATIONS[1:], default=None,
                        help="the weights' type: float32 (default; the same translations as "
                        "the model); with --format ctranslate2 also int8 or int8_float32 "
                        "(int8 weights, one scale per row; float32 for the rest); with "
                        "--format litert also dynamic-int8 (int8 weights) or float16 (float16 "
                        "weights, float32 arithmetic)")
    parser.add_argument("--vocabulary-map", action="store_true",
                        help="with --format ctranslate2: also write a vocabulary map "
                        "(vmap.txt) built from co-occurrence in the run's training data, "
                        "which CTranslate2's engine then uses (use_vmap)")
    parser.add_argument("--xla-column-blocks", type=int, default=1, metavar="N",
                        help="with N > 1, translate_xla multiplies by copies of the decoder's "
                        "weights and output table cut into N column blocks: the same "
                        "translations to float32 rounding, lower latency for a few sentences "
                        "on CPU (2 measured best on 2 cores; docs/performance.md), a "
                        "SavedModel larger by those weights (default: %(default)s, none)")
    startup.add_arguments(parser)
    return parser


def check_arguments(parser, args):
    """`parser.error` (exit status 2, naming the flag) for flags that do not
    apply to the chosen --format."""
    from keras_transformer.export import ctranslate2, litert

    allowed = {"ctranslate2": ctranslate2.QUANTIZATIONS, "litert": litert.QUANTIZATIONS}
    if args.format in allowed:
        if args.quantization not in (None,) + allowed[args.format]:
            parser.error(f"--quantization {args.quantization} does not apply to --format "
                         f"{args.format} (choose from {', '.join(allowed[args.format])})")
        if args.xla_column_blocks != 1:
            parser.error(f"--xla-column-blocks applies to --format saved_model, not "
                         f"{args.format}")
    elif args.quantization is not None:
        parser.error("--quantization applies to --format ctranslate2 or litert")
    if args.format == "ctranslate2":
        require_ctranslate2(parser)
    elif args.vocabulary_map:
        parser.error("--vocabulary-map applies to --format ctranslate2")
    if args.saved_model is not None:
        if args.format != "litert":
            parser.error("--saved-model applies to --format litert (rebuilt from the "
                         "SavedModel's weights and vocabulary); export other formats from "
                         "--run-dir")
        if args.checkpoint is not None:
            parser.error("--checkpoint applies to --run-dir, not --saved-model")
    if args.xla_column_blocks < 1:
        parser.error(f"--xla-column-blocks must be at least 1, received {args.xla_column_blocks}")


def training_vocabulary_map(run, source_tokenizer, target_tokenizer):
    """`vocabulary_map.build_vocabulary_map` of the run's training pairs
    (its data settings, train_args.json), tokenized by its vocabularies."""
    import dataclasses

    import keras_transformer as kt
    from keras_transformer.export.vocabulary_map import build_vocabulary_map
    from keras_transformer.pipeline.corpus import Corpus
    from keras_transformer.tokenizer import sentencepiece_ids

    names = {f.name for f in dataclasses.fields(kt.TrainingConfig)}
    settings = {k: v for k, v in run.load_args().items() if k in names}
    corpus = Corpus(kt.TrainingConfig(**settings))
    if not corpus.has("train"):
        raise ValueError(f"--vocabulary-map: {run.path} records no training data.")
    source, _ = sentencepiece_ids(source_tokenizer.model_proto)
    target, _ = sentencepiece_ids(target_tokenizer.model_proto)
    pairs = ((s.decode("utf-8", "replace"), t.decode("utf-8", "replace"))
             for s, t in corpus.pairs("train").as_numpy_iterator())
    return build_vocabulary_map(pairs, lambda text: source.encode(text, out_type=str),
                                lambda text: target.encode(text, out_type=str))


def new_version_directory(output_dir, base_name, version):
    """`<output_dir>/<base_name>/<version>/`, the next version when None;
    `ValueError` when it exists (a served version is never rewritten)."""
    from keras_transformer.export.saved_model import versions

    base = os.path.join(output_dir, base_name)
    version = max(versions(base), default=0) + 1 if version is None else version
    if os.path.exists(os.path.join(base, str(version))):
        raise ValueError(f"{base}/{version} exists: a served version is never "
                         "rewritten; export a new --version.")
    return os.path.join(base, str(version))


def export_litert_version(translator, output_dir, name, version, quantization):
    """`export_litert` into `new_version_directory(output_dir,
    "<name>_litert", version)`."""
    from keras_transformer.export.litert import export_litert

    return export_litert(translator, new_version_directory(output_dir, f"{name}_litert",
                                                           version), quantization)


def _export_saved_model(parser, args):
    """--format litert from --saved-model: the translator rebuilt from the
    export (its search defaults, unless a search flag is given)."""
    from keras_transformer.export.saved_model import resolve_version, translator_from_saved_model

    path = resolve_version(args.saved_model)
    given = {name: getattr(args, name) for name in ("beam_size", "alpha", "extra_length",
                                                     "min_length")
             if getattr(args, name) != parser.get_default(name)}
    print(f"Exporting {path}", file=sys.stderr, flush=True)
    translator = translator_from_saved_model(path, **given)
    name = args.name or os.path.basename(os.path.dirname(os.path.abspath(path)))
    path = export_litert_version(translator, args.output_dir, name, args.version,
                                 args.quantization or "float32")
    print(path)
    return path


def export(argv=None):
    """kt-export as a function: prints the SavedModel's path (with --format
    ctranslate2, the CTranslate2 directory's).

    Returns: that path.
    """
    from keras_transformer.export import export_translator, translator_from_run_directory
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import averaged_if_asked

    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.saved_model is not None:
        return _export_saved_model(parser, args)
    run = RunDirectory(args.run_dir)
    # Resolved once: "best:K" / "last:K" average here, then read "averaged".
    prefix, reason = run.resolve_checkpoint(averaged_if_asked(run, args.checkpoint))
    # stderr: stdout is the SavedModel's path alone, for scripts.
    print(f"Exporting {reason}", file=sys.stderr, flush=True)
    name = args.name or os.path.basename(os.path.normpath(args.run_dir))
    examples = None
    if args.examples:
        examples = [line.decode("utf-8", "replace").strip()
                    for line in read_lines(args.examples)]
        examples = [line for line in examples if line][:MAX_EXAMPLES]
    if args.format == "ctranslate2":
        from keras_transformer.export.ctranslate2 import export_ctranslate2

        model = run.load_model(prefix, quiet=True)
        source, target = run.load_tokenizers()
        directory = new_version_directory(args.output_dir, f"{name}_ct2", args.version)
        mapping = training_vocabulary_map(run, source, target) if args.vocabulary_map else None
        path = export_ctranslate2(
            model, source, target, directory,
            quantization=args.quantization or "float32", beam_size=args.beam_size,
            alpha=args.alpha, extra_length=args.extra_length, examples=examples,
            vocabulary_map=mapping, min_length=args.min_length)
        print(path)
        return path
    translator = translator_from_run_directory(
        run, prefix, beam_size=args.beam_size, alpha=args.alpha,
        extra_length=args.extra_length, xla_column_blocks=args.xla_column_blocks,
        min_length=args.min_length,
    )
    if args.format == "litert":
        path = export_litert_version(translator, args.output_dir, name, args.version,
                                     args.quantization or "float32")
        print(path)
        return path
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
