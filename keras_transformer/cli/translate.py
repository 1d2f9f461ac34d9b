"""Translates one sentence per line, from stdin or a file, to stdout, in
batches, with beam search.

    echo "Ein Mann fährt Fahrrad." | kt-translate --run-dir runs/base
    kt-translate --saved-model saved_models/de_en --input test.de \\
        --beam-size 4 --alpha 0.6 > test.hyp

Input rules: empty or whitespace-only lines give empty lines; invalid UTF-8
is read as U+FFFD; sources longer than the model's max_length - 1 subword
tokens are truncated. Line breaks inside a translation become spaces, so
output line i always translates input line i.
"""

import sys

from keras_transformer import startup
from keras_transformer.cli.common import (
    decoding_options,
    one_line,
    open_from_args,
    read_lines,
    translation_parser,
)


def build_parser():
    parser = translation_parser("kt-translate", __doc__)
    parser.add_argument("--input", default="-", help="source file, one sentence per line "
                        "(.gz ok; default: stdin)")
    parser.add_argument("--output", default="-", help="where to write (default: stdout)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentences per batch (default: %(default)s)")
    parser.add_argument("--scores", action="store_true",
                        help="write 'score<TAB>translation' lines")
    return parser


def translate(argv=None, stdout=None):
    """kt-translate as a function: writes the translations (to `stdout`
    when --output is `-`, default `sys.stdout`).

    Returns: `(translations, scores)`.
    """
    args = build_parser().parse_args(argv)
    translator = open_from_args(args)
    translations, scores = translator.translate(
        read_lines(args.input), batch_size=args.batch_size,
        **decoding_options(args, translator),
    )
    lines = [f"{s:.4f}\t{one_line(t)}" if args.scores else one_line(t)
             for t, s in zip(translations, scores)]
    text = "".join(line + "\n" for line in lines)
    if args.output == "-":
        (stdout or sys.stdout).write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    return translations, scores


def main(argv=None):
    startup.start(argv)
    translate(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
