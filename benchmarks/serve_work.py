"""The memory a unit of kt-serve's request work costs on an export: requests
of growing work (`keras_transformer.serving.work`: sentences x beam x
(source pieces + target limit)) run one after another on the servable
kt-serve loads, and the process's peak resident memory (VmHWM) is read
after each; bytes per unit is the peak's growth over the work.

`--text bytes` (the default) sends sentences of a character the vocabulary
lacks, which SentencePiece's byte fallback splits into one piece per UTF-8
byte: the work's byte bound on source pieces is then exact, so the figure
is the memory of a unit of actual work, the most any accepted request can
cost per unit. `--text words` sends English words, whose pieces the bound
overestimates (a lower figure per counted unit).

    python -m benchmarks serve-work --saved-model saved_models/demo

Writes `benchmarks/results/<cpu>_<date>_<commit>_serve-work.json`.
"""

import time

import numpy as np

from benchmarks import harness


def parse_args(argv=None):
    parser = harness.parser(__doc__, prog="python -m benchmarks serve-work")
    parser.add_argument("--saved-model", required=True,
                        help="an export directory (or its base path: the newest version)")
    parser.add_argument("--sentences", default="4,8,16",
                        help="comma-separated request sizes, growing (default: %(default)s)")
    parser.add_argument("--words", type=int, default=40,
                        help="words (or, with --text bytes, characters) per sentence")
    parser.add_argument("--text", choices=["bytes", "words"], default="bytes",
                        help="what the sentences are made of (default: %(default)s)")
    parser.add_argument("--beam-size", type=int, default=64)
    parser.add_argument("--extra-length", type=int, default=64)
    parser.add_argument("--json", help="result file (default: benchmarks/results/...)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.export.saved_model import resolve_version
    from keras_transformer.serving.model_versions import Servable
    from keras_transformer.serving.work import WorkModel

    path = resolve_version(args.saved_model)
    servable = Servable(path, 1)
    servable.warm_up()
    model = WorkModel(servable.metadata)
    if args.text == "bytes":
        sentence = "\u0436" * args.words  # Cyrillic zhe: 2 UTF-8 bytes, 2 pieces
    else:
        words = "the dog sees a red cat near the old house".split()
        sentence = " ".join(words[i % len(words)] for i in range(args.words))
    base = harness.status_mib("VmHWM") * 2**20
    rows = []
    for count in (int(n) for n in args.sentences.split(",")):
        text = np.empty(count, object)
        text[:] = [sentence.encode()] * count
        inputs = {"text": text, "beam_size": np.int32(args.beam_size),
                  "alpha": np.float32(0.6), "extra_length": np.int32(args.extra_length)}
        work = model.measure(inputs)[0]
        start = time.monotonic()
        servable.predict("translate_with_options", inputs)
        seconds = time.monotonic() - start
        growth = harness.status_mib("VmHWM") * 2**20 - base
        rows.append({"sentences": count, "work": int(work), "seconds": round(seconds, 2),
                     "peak_growth_mib": round(growth / 2**20, 1),
                     "bytes_per_unit": round(growth / work, 1)})
        print(rows[-1], flush=True)
    # The slope between the smallest and the largest request: the fixed
    # costs of a first large call (arenas, kernels) cancel out.
    slope = ((rows[-1]["peak_growth_mib"] - rows[0]["peak_growth_mib"]) * 2**20
             / max(1, rows[-1]["work"] - rows[0]["work"]))
    fields = harness.record()
    document = {**fields, "kind": "serve-work", "export": path,
                "request": {"text": args.text, "words": args.words, "beam_size": args.beam_size,
                            "extra_length": args.extra_length},
                "rows": rows, "bytes_per_unit_slope": round(slope, 1),
                "units_per_2_gib": int(2 * 2**30 / max(slope, 1e-9))}
    print(f"bytes per unit of work: {slope:.0f} (the slope); 2 GiB = "
          f"{document['units_per_2_gib']} units")
    harness.write_result(document, fields, "serve-work", args.json)
