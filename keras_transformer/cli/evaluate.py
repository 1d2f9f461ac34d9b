"""Translates a test set and scores it with sacreBLEU (BLEU and chrF) on the
detokenized output, printing sacreBLEU's signature strings.

    kt-evaluate --run-dir runs/base \\
        --source ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --reference ../shared/data/multi30k/test_2016_flickr.de.gz

One sentence per line in --source and --reference (.gz ok). The source is
translated --window lines at a time (default 4096), --parallel-windows of
them at once (as kt-translate), with a progress bar on stderr when it is a
terminal (--quiet: never). The translations can be
kept with --hypotheses. --tokenized-bleu de adds the
BLEU the Multi30k papers report (lowercased, punctuation-normalised,
Moses-tokenized), on its own labelled line: a different number from
sacreBLEU's.

--engine ctranslate2 scores CTranslate2's translations instead, of an
export (--ctranslate2-model DIR) or of a run directory's weights converted
as the command starts, as kt-translate does (--alpha is then CTranslate2's
length penalty, log P / length ** alpha):

    kt-evaluate --engine ctranslate2 --run-dir runs/base --compute-type int8 \\
        --source test.en.gz --reference test.de.gz
"""

import json
import sys

from keras_transformer import startup
from keras_transformer.cli.common import (
    add_parallel_windows_flag,
    check_engine,
    decoding_options,
    open_from_args,
    parallel_windows,
    run_command,
    translation_parser,
)


def build_parser():
    from keras_transformer.streaming import DEFAULT_WINDOW

    parser = translation_parser("kt-evaluate", __doc__, ctranslate2=True)
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--reference", required=True, help="reference translations")
    parser.add_argument("--hypotheses", help="also write the translations here")
    parser.add_argument("--tokenize", default="13a",
                        help="sacreBLEU BLEU tokenizer (default: %(default)s)")
    parser.add_argument("--tokenized-bleu", metavar="LANG",
                        help="also print the BLEU the Multi30k papers report (lowercased, "
                             "punctuation-normalised, Moses-tokenized, multi-bleu.perl) for "
                             "target language LANG, on its own labelled line")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="LINES",
                        help="lines translated at a time, length-sorted (default: "
                        "%(default)s)")
    add_parallel_windows_flag(parser)
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (it shows only when stderr is a terminal)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    return parser


def evaluate(argv=None, stdout=None):
    """kt-evaluate as a function: prints the scores to `stdout` (default
    `sys.stdout`).

    Returns: the scores, as `keras_transformer.evaluation.score_translations`
    gives them.
    """
    from keras_transformer.evaluation import score_translations
    from keras_transformer.streaming import (
        count_lines,
        in_order,
        iter_lines,
        one_line,
        progress_bar,
        windows,
    )

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    if args.window < 1:
        parser.error("--window must be at least 1")
    check_engine(parser, args)
    args.parallel_windows = parallel_windows(parser, args)
    out = stdout or sys.stdout
    sources, references = count_lines(args.source), count_lines(args.reference)
    if sources != references:
        parser.error(f"{sources} source lines but {references} reference lines.")
    references = [r.decode("utf-8", "replace") for r in iter_lines(args.reference)]
    translator = open_from_args(args)
    options = decoding_options(args, translator)

    def translated(lines):
        found, _ = translator.translate(lines, batch_size=args.batch_size, **options)
        return [one_line(t) for t in found]

    translations = []
    with progress_bar(sources, quiet=args.quiet) as bar:
        for found in in_order(translated, windows(iter_lines(args.source), args.window),
                              args.parallel_windows):
            translations += found
            bar.update(len(found))
    if args.hypotheses:
        from keras_transformer.files import write_atomically

        write_atomically(args.hypotheses, "".join(t + "\n" for t in translations).encode())
    scores = score_translations(translations, references, tokenize=args.tokenize,
                                tokenized_bleu_lang=args.tokenized_bleu)
    if args.json:
        out.write(json.dumps(scores, indent=2) + "\n")
    else:
        lines = [scores["bleu_text"], scores["chrf_text"]]
        if args.tokenized_bleu:
            lines.append(scores["tokenized_bleu_text"])
        out.write("".join(line + "\n" for line in lines))
    return scores


def main(argv=None):
    startup.start(argv)
    return run_command(evaluate, argv)


if __name__ == "__main__":
    sys.exit(main())
