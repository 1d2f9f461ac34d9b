"""BLEU of a trained model's CTranslate2 exports (float32 and int8) against
the package's own searches, on one test set.

    python -m benchmarks ctranslate2-bleu --run-dir runs/demo --checkpoint averaged
    python -m benchmarks ctranslate2-bleu --run-dir runs/m30k --checkpoint averaged \\
        --source data/multi30k/test_2016_flickr.en.gz \\
        --reference data/multi30k/test_2016_flickr.de.gz

The test set: `--source FILE --reference FILE` (one sentence a line, .gz
ok), or else the built-in corpus's test split in the run's direction (its
train_args.json). `--sentences N` keeps the first N. Translated with:

- the package's beam search (`Translator.translate`, beam 4, GNMT length
  penalty alpha 0.6; alpha 0; and beam 1, alpha 0) and its greedy search
  (`Translator.sample` at temperature 0: the argmax at every step);
- CTranslate2 float32: beam 4 with its length penalty (log P / length**a)
  0.6 and 0, and greedy;
- CTranslate2 int8 (int8 weights, int8_float32 compute): beam 4, 0.6.

Every search has the package's length limit (source tokens + 1 + 50). For
each: sacreBLEU BLEU and chrF (`keras_transformer.evaluation`), seconds, and
how many translations equal the matching package search's. The figures go to
`benchmarks/results/<cpu>_<date>_<commit>_ctranslate2-bleu.json` (`--json`
names another file). Seconds are wall time on a machine that may be shared;
the package's searches run under XLA (`--no-xla`: without), compilation
included.
"""

import argparse
import os
import sys
import tempfile
import time

from benchmarks import harness

# name -> (engine, beam size, alpha, what it is compared with)
SEARCHES = {
    "package_beam4_gnmt0.6": ("package", 4, 0.6, None),
    "package_beam4_alpha0": ("package", 4, 0.0, None),
    "package_beam1_alpha0": ("package", 1, 0.0, None),
    "package_greedy": ("package", 0, 0.0, None),  # sampling at temperature 0
    "ct2_float32_beam4_lp0.6": ("float32", 4, 0.6, "package_beam4_gnmt0.6"),
    "ct2_float32_beam4_lp0": ("float32", 4, 0.0, "package_beam4_alpha0"),
    "ct2_float32_greedy": ("float32", 1, 0.0, "package_greedy"),
    "ct2_int8_beam4_lp0.6": ("int8", 4, 0.6, "ct2_float32_beam4_lp0.6"),
}


NOTE = ("CTranslate2's length penalty divides log P by length**alpha, the package's by "
        "((5 + length) / 6)**alpha; at alpha 0 both are log P. CTranslate2 finishes a "
        "hypothesis when eos is among the beam's best beam_size candidates and ends one "
        "at the length limit without eos; the package's beam search has its own rules "
        "(docs/decoding-and-serving.md), so its beam 1 need not be greedy search. "
        "package_greedy is Translator.sample at temperature 0. Seconds are wall time on "
        "a shared 2-core machine, the package's XLA compilation included when it runs "
        "under XLA.")


def load_test_set(run, args):
    """`(sources, references)`, lists of str."""
    if args.source:
        sources, references = harness.read_text(args.source), harness.read_text(args.reference)
        if len(sources) != len(references):
            raise ValueError(f"--source has {len(sources)} lines but --reference "
                             f"{len(references)}.")
    else:
        from keras_transformer.data.synthetic import builtin_source

        train_args = run.load_args()
        data = train_args.get("data") or "builtin"
        if not data.startswith("builtin"):
            raise ValueError(f"{run.path} was trained on --data {data}: give --source and "
                             "--reference.")
        location = data.partition(":")[2]
        pairs = builtin_source(location, "test", train_args.get("src_lang", "en"),
                               train_args.get("tgt_lang", "synth"))
        sources, references = [], []
        for source, reference in pairs.as_numpy_iterator():
            sources.append(source.decode("utf-8"))
            references.append(reference.decode("utf-8"))
    n = args.sentences or len(sources)
    return sources[:n], references[:n]


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--run-dir", required=True, help="the trained run directory")
    parser.add_argument("--checkpoint", default="auto",
                        help="which weights, as kt-export's --checkpoint (default: auto)")
    parser.add_argument("--sentences", type=int, default=0,
                        help="translate the first N sentences (default: all)")
    parser.add_argument("--source", help="a source file, one sentence a line (with "
                        "--reference); default: the built-in corpus's test split")
    parser.add_argument("--reference", help="the references of --source")
    parser.add_argument("--extra-length", type=int, default=50,
                        help="output length limit: source tokens + 1 + this (default: 50)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0,
                        help="CTranslate2's threads (default: its own choice)")
    parser.add_argument("--xla", action=argparse.BooleanOptionalAction, default=True,
                        help="run the package's searches under XLA (default)")
    parser.add_argument("--json", help="the result file (default: benchmarks/results/"
                                       "<cpu>_<date>_<commit>_ctranslate2-bleu.json)")
    args = parser.parse_args(argv)
    if bool(args.source) != bool(args.reference):
        parser.error("--source and --reference go together")

    from keras_transformer.evaluation import score_translations
    from keras_transformer.export import Translator
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator
    from keras_transformer.run_directory import RunDirectory

    run = RunDirectory(args.run_dir)
    prefix, reason = run.resolve_checkpoint(args.checkpoint)
    print(f"Translating with {reason}", file=sys.stderr, flush=True)
    model = run.load_model(prefix, quiet=True)
    source_tokenizer, target_tokenizer = run.load_tokenizers()
    sources, references = load_test_set(run, args)
    package = Translator(model, source_tokenizer, target_tokenizer=target_tokenizer,
                         extra_length=args.extra_length)

    outputs, figures = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for quantization in ("float32", "int8"):
            path = export_ctranslate2(model, source_tokenizer, target_tokenizer,
                                      os.path.join(tmp, quantization),
                                      quantization=quantization,
                                      extra_length=args.extra_length)
            engines[quantization] = CTranslate2Translator(path, intra_threads=args.threads)
        for name, (engine, beam_size, alpha, compared) in SEARCHES.items():
            start = time.perf_counter()
            if engine == "package" and beam_size == 0:
                texts, _ = package.sample(sources, temperature=0.0,
                                          extra_length=args.extra_length,
                                          batch_size=args.batch_size)
            elif engine == "package":
                texts, _ = package.translate(sources, beam_size=beam_size, alpha=alpha,
                                             extra_length=args.extra_length,
                                             batch_size=args.batch_size,
                                             jit_compile=args.xla)
            else:
                texts, _ = engines[engine].translate(sources, beam_size=beam_size, alpha=alpha,
                                                     extra_length=args.extra_length,
                                                     batch_size=args.batch_size)
            seconds = time.perf_counter() - start
            outputs[name] = texts
            scores = score_translations(texts, references)
            figures[name] = {
                "engine": "package" if engine == "package" else f"ctranslate2 {engine}",
                "compute_type": (None if engine == "package"
                                 else engines[engine].compute_type),
                "beam_size": beam_size or 1,
                # CTranslate2's beam 1 is its greedy search; the package's
                # is its beam search with one beam.
                "search": ("greedy" if beam_size == 0 or (beam_size == 1 and engine != "package")
                           else "beam"),
                "alpha": alpha,
                "length_penalty": (None if beam_size in (0, 1) else "gnmt ((5+len)/6)**alpha"
                                   if engine == "package" else "len**alpha"),
                "bleu": round(scores["bleu"], 2),
                "chrf": round(scores["chrf"], 2),
                "seconds": round(seconds, 2),
            }
            if compared:
                same = sum(a == b for a, b in zip(texts, outputs[compared]))
                figures[name]["same_as"] = compared
                figures[name]["same_translations"] = same
            print(f"{name:26s} BLEU {scores['bleu']:6.2f}  chrF {scores['chrf']:6.2f}  "
                  f"{seconds:7.1f} s" + (f"  same as {compared}: {same}/{len(texts)}"
                                         if compared else ""), flush=True)
    record = harness.record("python -m benchmarks ctranslate2-bleu "
                               + " ".join(argv if argv is not None else sys.argv[1:]))
    import ctranslate2

    result = {
        **record,
        "run_dir": args.run_dir,
        "checkpoint": reason,
        "test_set": ({"source": args.source, "reference": args.reference} if args.source
                     else "built-in corpus, test split"),
        "sentences": len(sources),
        "extra_length": args.extra_length,
        "bleu_signature": score_translations(outputs[next(iter(SEARCHES))],
                                             references)["bleu_signature"],
        "ctranslate2_version": ctranslate2.__version__,
        "figures": figures,
        "note": NOTE,
    }
    harness.write_result(result, record, "ctranslate2-bleu", args.json)
