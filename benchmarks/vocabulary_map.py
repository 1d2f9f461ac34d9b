"""What CTranslate2's vocabulary map (`kt-export --vocabulary-map`) does to
int8 throughput and BLEU, on a trained run.

    python -m benchmarks vocabulary-map --run-dir runs/demo
    python -m benchmarks vocabulary-map --run-dir runs/m30k \\
        --source ../shared/data/multi30k/test_2016_flickr.en \\
        --reference ../shared/data/multi30k/test_2016_flickr.de

The run's weights (`--checkpoint`, default auto) are exported once as a
CTranslate2 int8 version with the map built from the run's training data
(`kt-export --format ctranslate2 --quantization int8 --vocabulary-map`).
The test set (`--source`/`--reference`, else the built-in corpus's test
split) is translated by `CTranslate2Translator` with the map and without
it (`vocabulary_map="off"`), beam 4, the export's other defaults, batches
of `--batch-size`, one thread (`--threads`): sacreBLEU of each, then
sentences/s in `--rounds` alternating rounds; the ratio is the median of
the per-round ratios. The result goes to
`benchmarks/results/<cpu>_<date>_<commit>_vocabulary-map.json`.
"""

import os
import statistics
import tempfile
import time

from benchmarks import harness


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--checkpoint", default="auto")
    parser.add_argument("--source")
    parser.add_argument("--reference")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if (args.source is None) != (args.reference is None):
        parser.error("--source and --reference go together")
    import sacrebleu

    from keras_transformer.cli import export
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator
    from keras_transformer.export.vocabulary_map import (
        VOCABULARY_MAP_FILE,
        read_vocabulary_map,
    )

    if args.source:
        sources, references = harness.read_text(args.source), harness.read_text(args.reference)
    else:
        sources, references = harness.held_out()
    record = harness.record()
    with tempfile.TemporaryDirectory() as work_dir:
        path = export.export(["--run-dir", args.run_dir, "--checkpoint", args.checkpoint,
                              "--output-dir", work_dir, "--name", "m", "--format",
                              "ctranslate2", "--quantization", "int8", "--vocabulary-map"])
        mapping = read_vocabulary_map(os.path.join(path, VOCABULARY_MAP_FILE))
        engines = {name: CTranslate2Translator(path, intra_threads=args.threads,
                                               vocabulary_map=name)
                   for name in ("off", "on")}
        report = {**record, "run_dir": args.run_dir, "sentences": len(sources),
                  "vocabulary_map": {"source_pieces": len(mapping) - 1,
                                     "always": len(mapping[""]),
                                     "target_vocabulary": len(engines["off"].target_tokens)},
                  "args": vars(args)}
        for name, engine in engines.items():
            hypotheses, _ = engine.translate(sources, beam_size=args.beam_size,
                                             batch_size=args.batch_size)
            report[f"bleu_{name}"] = sacrebleu.corpus_bleu(hypotheses, [references]).score
            print(f"map {name}: BLEU {report[f'bleu_{name}']:.2f}", flush=True)
        rounds = []
        for r, order in harness.flipped(("off", "on"), args.rounds):
            this = {}
            for name in order:
                start = time.perf_counter()
                engines[name].translate(sources, beam_size=args.beam_size,
                                        batch_size=args.batch_size)
                this[name] = len(sources) / (time.perf_counter() - start)
            rounds.append(this)
            print(f"round {r}: without {this['off']:.1f}, with {this['on']:.1f} sentences/s",
                  flush=True)
    report["rounds"] = rounds
    report["ratio_median"] = statistics.median(r["on"] / r["off"] for r in rounds)
    print(f"with / without the map: {report['ratio_median']:.3f}x sentences/s; BLEU "
          f"{report['bleu_off']:.2f} -> {report['bleu_on']:.2f}")
    harness.write_result(report, record, "vocabulary-map", args.json, indent=1)
