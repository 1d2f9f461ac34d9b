"""Translates one sentence per line, from stdin or a file, to stdout, in
batches, with beam search (default), n-best beam search or sampling.

    echo "Ein Mann fährt Fahrrad." | kt-translate --run-dir runs/base
    kt-translate --saved-model saved_models/de_en --input test.de \\
        --beam-size 4 --alpha 0.6 > test.hyp
    kt-translate --run-dir runs/base --input test.de --n-best 4 > test.nbest
    kt-translate --saved-model saved_models/de_en --input test.de \\
        --sampling --temperature 0.8 --top-p 0.9 --seed 1 > test.sampled

Input rules: empty or whitespace-only lines give empty lines; invalid UTF-8
is read as U+FFFD; sources longer than the model's max_length - 1 subword
tokens are truncated. Line breaks inside a translation become spaces, so
output line i always translates input line i.

--n-best K writes K lines per input line, best first, in the Moses/Marian
format "i ||| translation ||| score" (i: the input line, from 0; score:
the beam search score, log P / ((5 + length) / 6) ** alpha). K must be at
most --beam-size; without --beam-size the beam is max(K, the default).

--sampling draws each translation from the model instead: --temperature T
(default 1; 0: greedy), --top-k K (default 0: off), --top-p P (nucleus, in
(0, 1], default 1: off), --seed S (default 0). A sentence's sample depends
only on the seed and its text, so the same command gives the same output;
--scores then writes the model's log P of the sampled tokens.

--n-best and --sampling run the search without XLA (--xla applies to the
1-best beam search).

Documents: --split-sentences LANG splits each input line into sentences
(pysbd's rules for the source language LANG: abbreviations, numbers and
quotes), translates them, and joins each line's translations with a space:
one output line per input line, for paragraphs a model trained on
sentences would translate badly as one. Not with --n-best or --scores.

Big files: the input is read --window lines at a time (default 4096),
each window sorted by length into full batches and written in input
order, so memory does not grow with the input; --parallel-windows
windows are translated at once, each in a thread (default 2 with
TensorFlow's engine, which then keeps a second core busy; 1 with
CTranslate2's and LiteRT's). A progress bar (lines,
lines/s, time left) shows on stderr when it is a terminal (--quiet: never).
With --output FILE, finished windows are kept in FILE.parts/ and FILE
appears, complete, only at the end: a job that was killed resumes after
its last finished window when the same command runs again, and writes the
same bytes as an uninterrupted run.

--engine ctranslate2 translates with CTranslate2's engine instead (the
`ctranslate2` package needed; --xla does not apply), from a directory that
`kt-export --format ctranslate2` wrote (--ctranslate2-model DIR, which
implies the engine), or from a run directory's weights, converted in
float32 as the command starts (--compute-type int8 quantizes them as they
load):

    kt-translate --ctranslate2-model saved_models/de_en_ct2 --input test.de \\
        --beam-size 4 --alpha 0.6 > test.hyp
    kt-translate --engine ctranslate2 --run-dir runs/base --compute-type int8 \\
        --input test.de > test.hyp

The same flags and input rules, with the same per-sentence length limit
(source tokens + 1 + --extra-length, at most the model's max_length,
eos included). Defaults: the export's --beam-size, --alpha and
--extra-length (a run directory's: 4, 0.6, 50). --alpha is CTranslate2's length penalty: scores are
log P / length ** alpha (length with eos), not the GNMT penalty above
(at --alpha 0 both are log P). --beam-size 1 is the same greedy search as
the other engines' --sampling --temperature 0. --compute-type
(default: as exported) and --threads choose how CTranslate2 runs. Samples
are reproducible for the same input and --batch-size, but depend on the
batch a sentence is in.
"""

import sys

from keras_transformer import startup
from keras_transformer.cli.common import (
    add_parallel_windows_flag,
    add_search_flag,
    check_engine,
    decoding_options,
    open_from_args,
    parallel_windows,
    run_command,
    translation_parser,
)

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")


def build_parser():
    from keras_transformer.streaming import DEFAULT_WINDOW

    parser = translation_parser("kt-translate", __doc__, ctranslate2=True)
    parser.add_argument("--input", default="-", help="source file, one sentence per line "
                        "(.gz ok; default: stdin)")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentences per batch (default: %(default)s)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="LINES",
                        help="lines read, length-sorted and written at a time; the unit "
                        "a killed job resumes from (default: %(default)s)")
    add_parallel_windows_flag(parser)
    parser.add_argument("--split-sentences", metavar="LANG",
                        help="split each line into sentences (pysbd, source language LANG), "
                        "translate them and join them back: one output line per line")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (it shows only when stderr is a terminal)")
    parser.add_argument("--scores", action="store_true",
                        help="write 'score<TAB>translation' lines")
    parser.add_argument("--n-best", type=int, default=None, metavar="K",
                        help="write the K best translations of each line as "
                        "'i ||| translation ||| score' lines (K <= --beam-size)")
    group = parser.add_argument_group("sampling")
    group.add_argument("--sampling", action="store_true",
                       help="sample each translation instead of beam search")
    for name in ("temperature", "top_k", "top_p", "seed"):
        add_search_flag(group, name, None, "with --sampling: {help} (default: {default})")
    return parser


def check_arguments(parser, args):
    """`parser.error` (exit status 2, naming the flag) for flag values and
    combinations that cannot work."""
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    if args.window < 1:
        parser.error("--window must be at least 1")
    check_engine(parser, args)
    args.parallel_windows = parallel_windows(parser, args)
    if args.engine == "litert":
        for flag, given in (("--n-best", args.n_best is not None),
                            ("--sampling", args.sampling)):
            if given:
                parser.error(f"{flag} does not apply to --litert-model (its file holds beam "
                             "search only)")
    if args.split_sentences is not None:
        from keras_transformer.sentences import check_language

        for flag, given in (("--n-best", args.n_best is not None), ("--scores", args.scores)):
            if given:
                parser.error(f"{flag} does not apply to --split-sentences (a line's "
                             "sentences are searched one by one)")
        try:
            check_language(args.split_sentences)
        except (ValueError, ImportError) as e:
            parser.error(f"--split-sentences: {e}")
    if args.n_best is not None:
        if args.n_best < 1:
            parser.error("--n-best must be at least 1")
        if args.sampling:
            parser.error("--n-best applies to beam search, not to --sampling")
        if args.beam_size is not None and args.n_best > args.beam_size:
            parser.error(f"--n-best ({args.n_best}) must be at most --beam-size "
                         f"({args.beam_size})")
        if args.scores:
            parser.error("--scores does not apply to --n-best (its lines carry the scores)")
    given = [name for name in SAMPLING_OPTIONS if getattr(args, name) is not None]
    if not args.sampling:
        if given:
            parser.error(f"--{given[0].replace('_', '-')} needs --sampling")
        return
    for name in ("beam_size", "alpha"):
        if getattr(args, name) is not None:
            parser.error(f"--{name.replace('_', '-')} applies to beam search, not to "
                         "--sampling")


def translate(argv=None, stdout=None, collect=True):
    """kt-translate as a function: writes the translations (to `stdout`
    when --output is `-`, default `sys.stdout`) window by window
    (`keras_transformer.streaming.translate_file`).

    Returns: with `collect`, `(translations, scores)`, or with --n-best a
    list per input line of K `(translation, score)` pairs, best first;
    without (the command), None: memory does not grow with the input.
    """
    from keras_transformer.streaming import one_line, translate_file

    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    translator = open_from_args(args)
    search = _search(args, translator)
    # {first line's index: the window's result}: windows finish in any order.
    found = {} if collect else None

    def translate_window(lines, first):
        result = search(lines)
        if args.n_best is not None:
            if found is not None:
                found[first] = result
            return [f"{first + i} ||| {one_line(t)} ||| {s:.4f}"
                    for i, nbest in enumerate(result) for t, s in nbest]
        if found is not None:
            found[first] = list(zip(*result))
        return [f"{s:.4f}\t{one_line(t)}" if args.scores else one_line(t)
                for t, s in zip(*result)]

    # What changes the output bytes identifies the job; how it runs does not.
    settings = {name: value for name, value in sorted(vars(args).items())
                if name not in ("output", "quiet", "input", "parallel_windows")}
    translate_file(translate_window, args.input, args.output, args.window,
                   job={"settings": settings}, quiet=args.quiet, stdout=stdout,
                   in_flight=args.parallel_windows)
    if found is None:
        return None
    kept = [row for first in sorted(found) for row in found[first]]
    if args.n_best is not None:
        return kept
    return [t for t, _ in kept], [s for _, s in kept]


def _search(args, translator):
    """`lines -> result` of the search `args` ask for: `translate`'s,
    `sample`'s or `translate_nbest`'s, sentence by sentence with
    --split-sentences."""
    if args.n_best is not None:
        return lambda lines: translator.translate_nbest(
            lines, args.n_best, beam_size=args.beam_size, alpha=args.alpha,
            extra_length=args.extra_length, batch_size=args.batch_size)
    if args.sampling:
        from keras_transformer.decoding.search_options import OPTIONS

        options = {name: OPTIONS[name].default if getattr(args, name) is None
                   else getattr(args, name) for name in SAMPLING_OPTIONS}

        def search(lines):
            return translator.sample(lines, extra_length=args.extra_length,
                                     batch_size=args.batch_size, **options)
    else:
        options = decoding_options(args, translator)

        def search(lines):
            return translator.translate(lines, batch_size=args.batch_size, **options)
    if args.split_sentences is None:
        return search
    from keras_transformer.sentences import translate_documents

    def documents(lines):
        found = translate_documents(lambda sentences: search(sentences)[0], lines,
                                    args.split_sentences)
        return found, [None] * len(found)

    return documents


def main(argv=None):
    startup.start(argv)
    return run_command(lambda argv: translate(argv, collect=False), argv)


if __name__ == "__main__":
    sys.exit(main())
