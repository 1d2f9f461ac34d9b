"""Arguments and I/O shared by kt-translate, kt-evaluate and kt-export.

Importing it imports no TensorFlow, so the commands can import it before
their start-up settings apply; the functions that need the library import
it when called (after `startup.start()`)."""

import argparse
import sys

from keras_transformer import startup


def translation_parser(prog, description, ctranslate2=False):
    """The parser of a command that translates with a trained model or a
    SavedModel (kt-translate, kt-evaluate): model and decoding arguments,
    decoding defaults from the model, start-up flags; `ctranslate2`: also
    `--ctranslate2-model` and the engine flags (see `add_model_arguments`)."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_arguments(parser, ctranslate2=ctranslate2, ensemble=True)
    add_decoding_arguments(parser, defaults_from_model=True)
    startup.add_arguments(parser)
    return parser


ENGINES = ("tensorflow", "ctranslate2", "litert")


def add_model_arguments(parser, saved_model=True, ctranslate2=False, ensemble=False):
    """`--run-dir`/`--checkpoint` (and `--saved-model`, and
    `--ctranslate2-model`) to choose a model, exactly one of them; with
    `ensemble`, also `--ensemble` (more run directories decoding with
    `--run-dir`'s as one); with `ctranslate2`, also `--engine`,
    `--compute-type` and `--threads` (`check_engine` checks them,
    `open_from_args` applies them)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", help="a run directory (config.json, vocabulary, "
                        "checkpoints/; --checkpoint chooses which weights)")
    if saved_model:
        source.add_argument("--saved-model", help="an exported SavedModel: "
                            "saved_models/<name>/<version>, or saved_models/<name> (newest)")
    if ctranslate2:
        source.add_argument("--ctranslate2-model", metavar="DIR",
                            help="translate with CTranslate2's engine from a directory "
                            "that kt-export --format ctranslate2 wrote (needs the "
                            "ctranslate2 package; --alpha is then its length penalty, "
                            "log P / length**alpha)")
        source.add_argument("--litert-model", metavar="DIR",
                            help="translate with the LiteRT interpreter from a directory "
                            "that kt-export --format litert wrote (beam search only; "
                            "one sentence per interpreter call)")
    parser.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    if ensemble:
        parser.add_argument("--ensemble", metavar="RUN_DIR", action="append", default=[],
                            help="with --run-dir: another run directory (same vocabulary) "
                            "whose model, at the same --checkpoint, decodes with --run-dir's "
                            "as one ensemble (the mean of their next-token probabilities); "
                            "repeat for more members")
    if not ctranslate2:
        return
    group = parser.add_argument_group("engine")
    group.add_argument("--engine", choices=ENGINES, default=None,
                       help="tensorflow: the Keras model or the SavedModel; ctranslate2: "
                       "CTranslate2's engine, from --ctranslate2-model, or from --run-dir's "
                       "weights converted as the command starts; litert: the LiteRT "
                       "interpreter, from --litert-model (default: the engine of the model "
                       "flag given, else tensorflow)")
    group.add_argument("--compute-type", default=None,
                       choices=("default", "float32", "int8", "int8_float32"),
                       help="with --engine ctranslate2: the type CTranslate2 computes in "
                       "(default: the export's weights' type, float32 for --run-dir; int8 "
                       "on float32 weights quantizes as it loads)")
    group.add_argument("--threads", type=int, default=None,
                       help="with --engine ctranslate2: CTranslate2's threads for the search "
                       "(default: its own choice); with --engine litert: the interpreter's "
                       "(default: 1)")
    group.add_argument("--vocabulary-map", choices=("auto", "on", "off"), default=None,
                       help="with --ctranslate2-model: use the export's vocabulary map "
                       "(vmap.txt, kt-export --vocabulary-map): auto (default: if it has "
                       "one), on (it must), off")


CHECKPOINT_HELP = (
    "with --run-dir: auto (default: averaged/ unless stale, else best/, else the latest "
    "training checkpoint), last, best, averaged (even if stale), best:K or last:K (average "
    "the best/last K now into averaged/), or a checkpoint prefix (e.g. "
    "runs/x/checkpoints/ckpt-12000)")


def run_command(function, argv):
    """Runs `function(argv)` as a command: bad input (a `ValueError`, a
    missing file) is one `error:` line on stderr and exit status 2
    (KT_TRACEBACK=1 raises instead); else 0."""
    import os

    try:
        function(argv)
    except (ValueError, FileNotFoundError) as e:
        if os.environ.get("KT_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def add_decoding_arguments(parser, defaults_from_model=False, xla=True):
    from keras_transformer.decoding import (
        DEFAULT_ALPHA,
        DEFAULT_BEAM_SIZE,
        DEFAULT_EXTRA_LENGTH,
        DEFAULT_MIN_LENGTH,
    )

    note = " (default: the SavedModel's, else %(default)s)" if defaults_from_model else ""
    for name, default, paper in [("beam_size", DEFAULT_BEAM_SIZE, "; paper: 4"),
                                 ("alpha", DEFAULT_ALPHA, "; paper: 0.6"),
                                 ("extra_length", DEFAULT_EXTRA_LENGTH, "; paper: 50"),
                                 ("min_length", DEFAULT_MIN_LENGTH,
                                  "; a SavedModel's is fixed at export")]:
        add_search_flag(parser, name, None if defaults_from_model else default,
                        "{help}" + paper + note)
    if not xla:
        return
    parser.add_argument("--xla", action=argparse.BooleanOptionalAction, default=True,
                        help="compile the search with XLA on bucketed static shapes (same "
                        "translations, several times faster on CPU); with --saved-model: "
                        "its translate_xla signature, unless search options differ from "
                        "the export's (those run its XLA-free translate_with_options)")


def add_parallel_windows_flag(parser):
    """`--parallel-windows N` (`streaming.in_order`'s `in_flight`) for
    kt-translate and kt-evaluate."""
    from keras_transformer.streaming import DEFAULT_IN_FLIGHT

    parser.add_argument("--parallel-windows", type=int, default=None, metavar="N",
                        help="windows translated at once, each in a thread of its own, "
                        f"written in input order (the same output): default {DEFAULT_IN_FLIGHT} "
                        "with TensorFlow's engine, whose search of a small model keeps "
                        "about one core busy; 1 with CTranslate2's (--threads sets its "
                        "parallelism) and LiteRT's (one interpreter)")


def parallel_windows(parser, args):
    """`--parallel-windows`, defaulted by engine (after `check_engine`);
    `parser.error` below 1."""
    from keras_transformer.streaming import DEFAULT_IN_FLIGHT

    if args.parallel_windows is None:
        return DEFAULT_IN_FLIGHT if args.engine == "tensorflow" else 1
    if args.parallel_windows < 1:
        parser.error("--parallel-windows must be at least 1")
    return args.parallel_windows


def add_search_flag(parser, name, default, help):
    """`--<name>` (dashes for underscores) with the type of the search
    option `name` (`decoding.search_options.OPTIONS`); `help` may name the
    option's `{help}` and `{default}`. `check_search_flags` holds its value
    to the option's range."""
    from keras_transformer.decoding.search_options import OPTIONS

    option = OPTIONS[name]
    parser.add_argument("--" + name.replace("_", "-"),
                        type=float if option.dtype == "float32" else int, default=default,
                        help=help.replace("{help}", option.help).replace(
                            "{default}", str(option.default)))


def check_search_flags(parser, args):
    """`parser.error` (exit status 2) naming the first search-option flag
    whose value the option's range refuses."""
    from keras_transformer.decoding.search_options import OPTIONS

    for name, option in OPTIONS.items():
        value = getattr(args, name, None)
        problem = None if value is None else option.problem(value)
        if problem is not None:
            parser.error("--" + name.replace("_", "-") + problem[len(name):])


def check_engine(parser, args):
    """Sets `args.engine` (see `--engine`) and `parser.error`s (exit status
    2, naming the flag) for engine flags that cannot work together."""
    ctranslate2_model = getattr(args, "ctranslate2_model", None)
    if getattr(args, "ensemble", None) and args.run_dir is None:
        parser.error("--ensemble adds members to --run-dir's model; it needs --run-dir")
    check_search_flags(parser, args)
    litert_model = getattr(args, "litert_model", None)
    if args.engine is None:
        args.engine = ("ctranslate2" if ctranslate2_model is not None
                       else "litert" if litert_model is not None else "tensorflow")
    if (args.engine == "litert") != (litert_model is not None):
        parser.error("--litert-model and --engine litert go together")
    if args.engine == "litert":
        for name in ("compute_type", "vocabulary_map", "checkpoint", "min_length"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')} does not apply to --litert-model")
        if args.threads is not None and args.threads < 1:
            parser.error(f"--threads must be at least 1, received {args.threads}")
        return
    if args.engine == "tensorflow":
        if ctranslate2_model is not None:
            parser.error("--ctranslate2-model needs --engine ctranslate2 (the default with it)")
        for name in ("compute_type", "threads", "vocabulary_map"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')} needs --engine ctranslate2")
        return
    if getattr(args, "ensemble", None):
        parser.error("--ensemble needs --engine tensorflow: CTranslate2 decodes one model")
    if getattr(args, "saved_model", None) is not None:
        parser.error("--engine ctranslate2 takes --ctranslate2-model (kt-export --format "
                     "ctranslate2) or --run-dir (converted as the command starts), "
                     "not --saved-model")
    if ctranslate2_model is not None and args.checkpoint is not None:
        parser.error("--checkpoint applies to --run-dir, not --ctranslate2-model")
    if ctranslate2_model is None and args.vocabulary_map is not None:
        parser.error("--vocabulary-map applies to --ctranslate2-model (an export with vmap.txt)")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, received {args.threads}")
    require_ctranslate2(parser)


def require_ctranslate2(parser):
    """`parser.error` naming the extra to install when the `ctranslate2`
    package is missing."""
    from keras_transformer.export.ctranslate2 import import_ctranslate2

    try:
        import_ctranslate2()
    except ImportError as e:
        parser.error(str(e))


def open_from_args(args):
    """The translator `args` name: with `--engine ctranslate2` (after
    `check_engine`) a `CTranslate2Translator`, of --ctranslate2-model or of
    --run-dir's weights converted now (the checkpoint and why is printed to
    stderr); else as `open_translator` gives it."""
    from keras_transformer.export.saved_model import open_translator

    if getattr(args, "engine", "tensorflow") == "litert":
        from keras_transformer.export.litert_translator import LiteRTTranslator

        return LiteRTTranslator(args.litert_model, threads=args.threads or 1)
    if getattr(args, "engine", "tensorflow") == "ctranslate2":
        from keras_transformer.export.ctranslate2_translator import (
            CTranslate2Translator,
            ctranslate2_translator_from_run,
        )

        options = dict(compute_type=args.compute_type or "default",
                       intra_threads=args.threads or 0)
        if args.ctranslate2_model is not None:
            return CTranslate2Translator(args.ctranslate2_model,
                                         vocabulary_map=args.vocabulary_map or "auto",
                                         min_length=args.min_length, **options)
        translator, reason = ctranslate2_translator_from_run(
            args.run_dir, args.checkpoint, beam_size=args.beam_size, alpha=args.alpha,
            extra_length=args.extra_length, min_length=args.min_length, **options)
        print(f"CTranslate2 engine: converted {reason}", file=sys.stderr, flush=True)
        return translator
    return open_translator(
        run_dir=args.run_dir, checkpoint=args.checkpoint,
        saved_model=getattr(args, "saved_model", None), ensemble=getattr(args, "ensemble", ()),
        beam_size=args.beam_size, alpha=args.alpha, extra_length=args.extra_length,
        min_length=args.min_length,
    )


def decoding_options(args, translator):
    """Per-call options: for a SavedModel or CTranslate2 the search options
    (None: the export's defaults); a run-directory translator was built with
    them already. The first two choose whether the search runs under XLA."""
    from keras_transformer.export.saved_model import SavedModelTranslator

    search = dict(beam_size=args.beam_size, alpha=args.alpha, extra_length=args.extra_length)
    if getattr(args, "engine", "tensorflow") in ("ctranslate2", "litert"):
        return search
    if isinstance(translator, SavedModelTranslator):
        return {**search, "jit_compile": args.xla}
    return {"jit_compile": args.xla}


def read_lines(path):
    """The lines of `path` as a list (`streaming.iter_lines`): bytes,
    without line endings or a byte-order mark."""
    from keras_transformer.streaming import iter_lines

    return list(iter_lines(path))
