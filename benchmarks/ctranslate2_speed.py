"""The exported SavedModel beside CTranslate2, on the same weights: beam-4
throughput and single-sentence latency, strings in and strings out.

    python -m benchmarks ctranslate2                       # small and base
    python -m benchmarks ctranslate2 --configs small --rounds 3

For each preset (with the bench vocabulary, `bench_config`), one model with
random weights is exported twice: as the SavedModel (`export_translator`,
beam 4, alpha 0.6, extra length 10) and as CTranslate2 model directories
(`export_ctranslate2`, float32 and int8). The SavedModel's `serving_default`
(graph) and `translate_xla` (the same search compiled by XLA) are timed in
this process, with `translate_xla` of a second export whose decoder weights
are in `--xla-column-blocks` column blocks (default 2, as `kt-export
--xla-column-blocks`), named `translate_xla_column_blocks`; CTranslate2 in
a process of its own that imports neither TensorFlow nor this package
(ctranslate2 and sentencepiece only), with
`intra_threads` = the cores. Both sides tokenize and detokenize inside the
timing. Rounds alternate between the two processes (the order flips every
round) so that the machine's drift falls on both; each figure is the median
over rounds, each ratio the median of per-round ratios.

Shapes (`bench_config.TRANSLATE_SHAPE`): the 32 test sentences nearest 20
source tokens (eos included) for throughput, each of the first `--singles`
of them alone for latency (p50, p95); beam 4. Random weights rarely produce
eos, so searches run to the length limit: the SavedModel's is each
sentence's source tokens + 10; CTranslate2 takes one `max_decoding_length`
per batch, the batch's longest source + 10. CTranslate2's length penalty is
`length ** 0.6` normalisation where the SavedModel's is GNMT's; on a search
that runs to the limit the two do the same work.

The result goes to `benchmarks/results/<cpu>_<date>_<commit>_ctranslate2-speed.json`.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf

from benchmarks import harness
from benchmarks.bench_config import TRANSLATE_SHAPE, make_config
from benchmarks.savedmodel_speed import time_batches, time_singles
from benchmarks.speed import bench_tokenizer_and_sentences

SIGNATURES = ("serving_default", "translate_xla")
BLOCKS_ENGINE = "translate_xla_column_blocks"
QUANTIZATIONS = ("float32", "int8")

# Runs in a fresh process: CTranslate2 alone, strings in and strings out.
ENGINE_SCRIPT = r"""
import json, sys, time
import ctranslate2, sentencepiece

request = json.loads(sys.stdin.read())
spm = sentencepiece.SentencePieceProcessor(model_file=request["sentencepiece"])
extra, beam, alpha = request["extra_length"], request["beam_size"], request["alpha"]


def run(translator, texts):
    pieces = [spm.encode(t, out_type=str) for t in texts]
    limit = max(len(p) for p in pieces) + 1 + extra  # + eos, as the SavedModel counts
    results = translator.translate_batch(
        pieces, beam_size=beam, length_penalty=alpha, max_decoding_length=limit,
        max_batch_size=len(pieces), min_decoding_length=0)
    return [spm.decode(r.hypotheses[0]) for r in results]


out = {}
for name, directory in request["models"].items():
    translator = ctranslate2.Translator(directory, device="cpu",
                                        compute_type=request["compute_types"][name],
                                        intra_threads=request["threads"], inter_threads=1)
    batch, singles = request["batch"], request["singles"]
    run(translator, batch)
    for text in singles[:3]:
        run(translator, [text])
    start = time.perf_counter()
    for _ in range(request["repeats"]):
        run(translator, batch)
    seconds = time.perf_counter() - start
    latencies = []
    for text in singles:
        start = time.perf_counter()
        run(translator, [text])
        latencies.append(time.perf_counter() - start)
    out[name] = {"sentences_per_s": request["repeats"] * len(batch) / seconds,
                 "latencies_s": latencies, "compute_type": translator.compute_type}
print(json.dumps(out))
"""


def build(config_name, work_dir, batch_size, column_blocks=1):
    """Exports one random model of `config_name`; returns `(SavedModel
    path, SavedModel path with `column_blocks` column blocks or None,
    {quantization: CTranslate2 directory}, SentencePiece file,
    sentences)`."""
    import keras

    import keras_transformer as kt
    from keras_transformer.export import Translator, export_translator
    from keras_transformer.export.ctranslate2 import (
        SHARED_SENTENCEPIECE,
        export_ctranslate2,
    )

    config = make_config(config_name)
    tokenizer, sentences = bench_tokenizer_and_sentences(config.vocab_size, batch_size)
    keras.utils.set_random_seed(0)
    config = config.replace(vocab_size=tokenizer.vocab_size, dropout=0.0)
    model = kt.Transformer(config)
    model.build()
    search = {name: TRANSLATE_SHAPE[name] for name in ("beam_size", "alpha", "extra_length")}
    saved_model = export_translator(Translator(model, tokenizer, **search), work_dir,
                                    name=config_name)
    blocked = None
    if column_blocks > 1:
        blocked = export_translator(
            Translator(model, tokenizer, xla_column_blocks=column_blocks, **search),
            work_dir, name=f"{config_name}_blocks")
    engines = {}
    for quantization in QUANTIZATIONS:
        engines[quantization] = export_ctranslate2(
            model, tokenizer, tokenizer, os.path.join(work_dir, f"{config_name}_{quantization}"),
            quantization=quantization)
    spm = os.path.join(engines["float32"], SHARED_SENTENCEPIECE)
    return saved_model, blocked, engines, spm, sentences


def time_saved_model(serve, batch, singles, repeats):
    """`(sentences/s over `repeats` batches, latencies in s)`."""
    seconds = time_batches(serve, [batch] * repeats)
    return repeats * len(batch) / seconds, time_singles(serve, singles)


def time_ctranslate2(engines, spm, batch, singles, repeats, threads):
    request = {"models": engines, "sentencepiece": spm, "batch": batch, "singles": singles,
               "repeats": repeats, "threads": threads,
               "compute_types": {"float32": "float32", "int8": "int8"},
               "beam_size": TRANSLATE_SHAPE["beam_size"], "alpha": TRANSLATE_SHAPE["alpha"],
               "extra_length": TRANSLATE_SHAPE["extra_length"]}
    done = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT], input=json.dumps(request),
                          capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"the CTranslate2 process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(config_name, args):
    with tempfile.TemporaryDirectory() as work_dir:
        saved_model, blocked, engines, spm, sentences = build(
            config_name, work_dir, TRANSLATE_SHAPE["batch"], args.xla_column_blocks)
        import tensorflow_text  # noqa: F401  (the SentencePiece ops, for loading)

        loaded = tf.saved_model.load(saved_model)
        serves = {name: loaded.signatures[name] for name in SIGNATURES}
        if blocked is not None:
            serves[BLOCKS_ENGINE] = tf.saved_model.load(blocked).signatures["translate_xla"]
        singles = sentences[:args.singles]
        for serve in serves.values():  # XLA compiles each shape bucket once
            serve(text=tf.constant(sentences))
            for text in singles:
                serve(text=tf.constant([text]))
        rounds = []
        for r, order in harness.flipped(("ours", "theirs"), args.rounds):
            this_round = {}
            for side in order:
                if side == "ours":
                    for name, serve in serves.items():
                        this_round[name] = time_saved_model(serve, sentences, singles,
                                                            args.repeats)
                    continue
                timed = time_ctranslate2(engines, spm, sentences, singles, args.repeats,
                                         args.threads)
                for quantization, result in timed.items():
                    this_round[f"ctranslate2_{quantization}"] = (
                        result["sentences_per_s"], result["latencies_s"])
            rounds.append(this_round)
            print(f"  {config_name} round {r}: " + ", ".join(
                f"{name} {v[0]:.1f}/s p50 {1000 * np.median(v[1]):.1f} ms"
                for name, v in this_round.items()), flush=True)
    return summarize(rounds, sentences, singles)


def summarize(rounds, sentences, singles):
    engines = list(rounds[0])
    figures = {}
    for name in engines:
        latencies = [s for r in rounds for s in r[name][1]]
        figures[name] = {
            "sentences_per_s": round(statistics.median(r[name][0] for r in rounds), 2),
            "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
            "p95_ms": round(1000 * float(np.percentile(latencies, 95)), 1),
        }

    def ratio(ours, theirs, index, invert):
        values = []
        for r in rounds:
            a = r[ours][index] if index == 0 else float(np.median(r[ours][index]))
            b = r[theirs][index] if index == 0 else float(np.median(r[theirs][index]))
            values.append(b / a if invert else a / b)
        return {"median": round(statistics.median(values), 3),
                "range": [round(min(values), 3), round(max(values), 3)]}

    # Above 1: the SavedModel is faster.
    figures["ratios"] = {
        "xla_p50_vs_ctranslate2_float32_p50": ratio("translate_xla", "ctranslate2_float32",
                                                     1, invert=True),
        "xla_throughput_vs_ctranslate2_int8": ratio("translate_xla", "ctranslate2_int8", 0,
                                                    invert=False),
        "xla_throughput_vs_ctranslate2_float32": ratio("translate_xla",
                                                       "ctranslate2_float32", 0, invert=False),
        "serving_default_p50_vs_ctranslate2_float32_p50": ratio(
            "serving_default", "ctranslate2_float32", 1, invert=True),
    }
    if BLOCKS_ENGINE in rounds[0]:
        figures["ratios"].update({
            "xla_column_blocks_p50_vs_ctranslate2_float32_p50": ratio(
                BLOCKS_ENGINE, "ctranslate2_float32", 1, invert=True),
            "xla_column_blocks_throughput_vs_ctranslate2_int8": ratio(
                BLOCKS_ENGINE, "ctranslate2_int8", 0, invert=False),
            "xla_column_blocks_p50_vs_xla_p50": ratio(BLOCKS_ENGINE, "translate_xla", 1,
                                                      invert=True),
            "xla_column_blocks_throughput_vs_xla": ratio(BLOCKS_ENGINE, "translate_xla", 0,
                                                         invert=False),
        })
    figures["batch_sentences"] = len(sentences)
    figures["single_sentences"] = len(singles)
    return figures


def main(argv=None):
    parser = harness.parser(__doc__, prog="python -m benchmarks ctranslate2")
    parser.add_argument("--configs", nargs="+", default=["small", "base"],
                        help="presets, with the bench vocabulary (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--repeats", type=int, default=2,
                        help="32-sentence batches per round and engine")
    parser.add_argument("--singles", type=int, default=20,
                        help="single-sentence requests per round and engine")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="CTranslate2's intra_threads (default: the cores)")
    parser.add_argument("--xla-column-blocks", type=int, default=2, metavar="N",
                        help="also time translate_xla of a SavedModel exported with N column "
                        "blocks (kt-export --xla-column-blocks); 1: not (default: %(default)s)")
    parser.add_argument("--json", help="result file (default: benchmarks/results/...)")
    args = parser.parse_args(argv)
    harness.at_least(parser, args, ["xla_column_blocks"])
    report = harness.record()
    report["shape"] = dict(TRANSLATE_SHAPE, singles=args.singles, repeats=args.repeats,
                           rounds=args.rounds, ctranslate2_threads=args.threads,
                           xla_column_blocks=args.xla_column_blocks)
    report["results"] = {}
    for name in args.configs:
        report["results"][name] = measure(name, args)
        print(json.dumps({name: report["results"][name]}, indent=1), flush=True)
    harness.write_result(report, report, "ctranslate2-speed", args.json)
    return 0
