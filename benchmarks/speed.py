"""Throughput of this package's Transformer, optionally beside TF Model Garden's
`Seq2SeqTransformer` built with the same shapes, in the same process.

    python -m benchmarks speed                          # bench config, float32
    python -m benchmarks speed --reference model_garden --what train,translate
    python -m benchmarks speed --precision mixed_bfloat16 --reference model_garden
    python -m benchmarks speed --config base --what train

Measures (each `--what`):
  train      training target tokens/s and model FLOP/s as a fraction of the
             matmul peak this script measures itself on this machine;
  translate  beam-search translation sentences/s (untrained weights, so every
             beam runs to the maximum length: per-step cost is what is timed);
  latency    single-sentence p50/p95 latency of the exported SavedModel
             (strings in, strings out);
  memory     per implementation and phase (train, translate), in a fresh
             process each: resident memory after imports and build, the
             phase's peak, and the difference (what the phase allocates).

Machines drift (other processes, clocks), so implementations are timed in
alternating rounds and the ratio is taken per round; the median is reported.

Precision: `--precision` is ours, `--reference-precision` Model Garden's
(default float32: its mixed_bfloat16 path fails with a dtype error in
`TransformerDecoderBlock`). XLA (`--xla auto`): what the trainer and the
exported `translate_xla` signature run, i.e. our training step without XLA
(each batch shape would compile, and XLA:CPU's matmuls do not beat oneDNN's;
docs/performance.md) and our beam search with it; Model Garden always runs
without XLA (its XLA training is slower, and its beam search grows shapes).
"""

import argparse
import json
import os
import resource
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness, model_garden_reference
from benchmarks.bench_config import (
    TRAIN_SHAPE,
    TRANSLATE_SHAPE,
    compiled_model,
    make_config,
    peak_dtype,
    random_ids,
    training_flops,
)
from benchmarks.harness import time_rounds


def random_batch(config, batch, length, seed):
    return tf.constant(random_ids(config, batch, length, seed))


def peak_sizes(size):
    """The square sizes `matmul_peak` tries: `size` and 15/16 of it. Where
    TensorFlow multiplies with Eigen rather than oneDNN, rows a multiple of
    2,048 floats long run markedly slower (keras_transformer/kernels/
    eigen_slices.py), which a power-of-two size alone would take for the
    machine's peak."""
    return (size, max(1, size * 15 // 16))


def matmul_peak(dtype, size=2048, repeats=20):
    """GFLOP/s of a square matmul chain on this machine, in `dtype`: the
    best over `peak_sizes(size)`."""
    return max(_matmul_chain(dtype, n, repeats) for n in peak_sizes(size))


def _matmul_chain(dtype, size, repeats):
    a = tf.random.normal((size, size), dtype=tf.float32)
    a = tf.cast(a, dtype)

    @tf.function
    def chain(x):
        for _ in range(repeats):
            x = tf.matmul(x, a) * tf.cast(0.01, dtype)
        return x

    chain(a).numpy()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        chain(a).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 * repeats / best / 1e9


# Implementations ------------------------------------------------------------


class Ours:
    name = "keras_transformer"

    def __init__(self, config, precision, xla):
        self.precision = precision
        self.train_xla, self.translate_xla = {"auto": (False, True), "on": (True, True),
                                              "off": (False, False)}[xla]
        self.config = config
        self.model = compiled_model(config, precision, jit_compile=self.train_xla)

    def train_step(self, source, target_in, target_out):
        return self.model.train_on_batch((source, target_in), target_out)

    def translator(self, beam_size, alpha, extra_length):
        from keras_transformer.decoding import beam_search_translate

        # The fixed-shape search compiles with XLA (in-process use; exported
        # serving signatures stay XLA-free for TF Serving).
        @tf.function(jit_compile=self.translate_xla)
        def translate(source):
            return beam_search_translate(self.model, source, beam_size=beam_size, alpha=alpha,
                                         extra_length=extra_length)[0]

        return translate


class ModelGarden:
    name = "model_garden"

    def __init__(self, config, precision, xla):
        self.precision = precision
        self.config = config
        self.model, self.optimizer = model_garden_reference.build(
            config, beam_size=TRANSLATE_SHAPE["beam_size"], alpha=TRANSLATE_SHAPE["alpha"],
            extra_decode_length=TRANSLATE_SHAPE["extra_length"], precision=precision,
        )
        self.step = model_garden_reference.train_step_fn(
            self.model, self.optimizer, config.label_smoothing, config.pad_id
        )
        # Model Garden runs without XLA: its XLA training is slower on CPU and
        # its beam search (growing shapes) does not compile.

    def train_step(self, source, target_in, target_out):
        return self.step(source, target_in, target_out).numpy()

    def translator(self, beam_size, alpha, extra_length):
        return model_garden_reference.translate_fn(self.model)


IMPLEMENTATIONS = {"ours": Ours, "model_garden": ModelGarden}


# Measurements -----------------------------------------------------------------


def train_batch(config):
    """The bench training batch, `((source, target_in), target_out)`: random
    ids of `TRAIN_SHAPE`, the same for every implementation and run."""
    shape = TRAIN_SHAPE
    source = random_batch(config, shape["batch"], shape["source_length"], 0)
    target = random_batch(config, shape["batch"], shape["target_length"] + 1, 1)
    return (source, target[:, :-1]), target[:, 1:]


def bench_train(impls, config, args, peaks):
    """Training throughput; `peaks`: matmul GFLOP/s by dtype name (None: no
    utilisation figures)."""
    shape = TRAIN_SHAPE
    (source, target_in), target_out = train_batch(config)
    calls = {impl.name: (lambda impl=impl: impl.train_step(source, target_in, target_out))
             for impl in impls}
    times = time_rounds(calls, args.rounds, warmup=3, repeats=args.train_steps)
    step_flops = training_flops(config, shape["batch"], shape["source_length"],
                                      shape["target_length"])
    tokens = shape["batch"] * shape["target_length"]
    results = {}
    for impl in impls:
        seconds = times[impl.name]
        per_step = statistics.median(seconds)
        peak = (peaks or {}).get(peak_dtype(impl.precision))
        results[impl.name] = {
            "precision": impl.precision,
            "target_tokens_per_s": tokens / per_step,
            "model_tflops_per_s": step_flops / per_step / 1e12,
            "fraction_of_matmul_peak": (step_flops / per_step / 1e9 / peak) if peak else None,
            "rounds_s_per_step": seconds,
        }
    return results, times


def bench_translate(impls, config, args):
    shape = TRANSLATE_SHAPE
    source = random_batch(config, shape["batch"], shape["source_length"], 2)
    calls = {}
    for impl in impls:
        translate = impl.translator(shape["beam_size"], shape["alpha"], shape["extra_length"])
        calls[impl.name] = lambda translate=translate: np.asarray(translate(source))
    times = time_rounds(calls, args.rounds, warmup=1, repeats=args.translate_repeats)
    results = {name: {"sentences_per_s": shape["batch"] / statistics.median(seconds),
                      "rounds_s_per_batch": seconds}
               for name, seconds in times.items()}
    return results, times


LATENCY_SIGNATURES = ("serving_default", "translate_xla")


def bench_latency(config, args):
    """p50/p95 of one sentence through our exported SavedModel, for its
    XLA-free `serving_default` and its `translate_xla` signature."""
    import keras_transformer as kt
    from keras_transformer.export.saved_model import export_translator
    from keras_transformer.export.translator import Translator

    tokenizer, (sentence,) = bench_tokenizer_and_sentences(config.vocab_size, 1)
    config = config.replace(vocab_size=tokenizer.vocab_size)
    model = kt.Transformer(config)
    model.build()
    with tempfile.TemporaryDirectory() as tmp:
        translator = Translator(model, tokenizer, beam_size=TRANSLATE_SHAPE["beam_size"],
                                alpha=TRANSLATE_SHAPE["alpha"],
                                extra_length=TRANSLATE_SHAPE["extra_length"])
        path = export_translator(translator, tmp, name="bench")
        loaded = tf.saved_model.load(path)
        text = sentence
        sentence = tf.constant([text])
        first_ms, latencies, outputs = {}, {}, {}
        for name in LATENCY_SIGNATURES:
            served = loaded.signatures[name]
            start = time.perf_counter()
            outputs[name] = served(text=sentence)["translation"].numpy().tolist()
            first_ms[name] = (time.perf_counter() - start) * 1000  # XLA: compiles
            for _ in range(2):
                served(text=sentence)
            latencies[name] = []
        # Alternating blocks of requests: drift hits both signatures alike,
        # and each block runs warm (switching on every request slows the
        # graph path by evicting its caches).
        blocks = 5
        for block in range(blocks):
            for name in LATENCY_SIGNATURES:
                served = loaded.signatures[name]
                for _ in range(len(range(block, args.latency_requests, blocks))):
                    start = time.perf_counter()
                    served(text=sentence)["translation"].numpy()
                    latencies[name].append((time.perf_counter() - start) * 1000)
    if outputs["translate_xla"] != outputs["serving_default"]:
        raise RuntimeError(f"translate_xla and serving_default disagree: {outputs}")
    return {name: {"p50_ms": float(np.percentile(latencies[name], 50)),
                   "p95_ms": float(np.percentile(latencies[name], 95)),
                   "first_request_ms": first_ms[name]}
            for name in LATENCY_SIGNATURES} | {
        "sentence": text, "requests": args.latency_requests,
        "source_tokens": int(tokenizer.tokenize(sentence).row_lengths()[0]),
        "vocab_size": tokenizer.vocab_size}


MULTI30K = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                        "shared", "data", "multi30k")
LATENCY_SOURCE_TOKENS = TRANSLATE_SHAPE["source_length"]


def bench_tokenizer_and_sentences(vocab_size, count):
    """A shared vocabulary of (up to) `vocab_size` pieces and the `count`
    test sentences whose length is nearest `LATENCY_SOURCE_TOKENS` tokens
    (eos included). The vocabulary size sets the cost of the output
    projection and of the beam's top-k over `beam * vocab` candidates, so it
    is trained on Multi30k (`../shared/data/multi30k`, real text that
    reaches 8,192 pieces) when present, else on the built-in corpus (whose
    ~1,400 pieces make the latency look better than it is; the report says
    which)."""
    from keras_transformer.data.synthetic import generate_corpus
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

    if os.path.isdir(MULTI30K):
        train = [line for lang in ("en", "de")
                 for line in harness.read_text(os.path.join(MULTI30K, f"train.{lang}.gz"))]
        candidates = harness.read_text(os.path.join(MULTI30K, "test_2016_flickr.en.gz"))
    else:
        corpus = generate_corpus(seed=0, num_train=5000, num_val=10, num_test=50)
        train = corpus["train"][0] + corpus["train"][1]
        candidates = corpus["test"][0]
    tokenizer = SubwordTokenizer(train_sentencepiece(train, vocab_size=vocab_size))
    lengths = tokenizer.tokenize(tf.constant(candidates)).row_lengths().numpy() + 1  # + eos
    nearest = np.argsort(np.abs(lengths - LATENCY_SOURCE_TOKENS), kind="stable")[:count]
    return tokenizer, [candidates[int(i)] for i in nearest]


def _reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux: "5" > /proc/self/clear_refs),
    so the next peak is the phase's own, not the import's or the build's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def bench_memory(args):
    """Memory of each implementation for each of training and translation,
    each in a fresh process: resident memory after imports and model build
    (`baseline_mb`), the phase's peak (`peak_mb`) and their difference
    (`phase_mb`: activations, gradients, optimizer slots, decoding cache;
    what the implementation decides)."""
    results = {}
    for name in ["ours"] + ([args.reference] if args.reference else []):
        results[name] = {}
        for phase in ("train", "translate"):
            precision = args.precision if name == "ours" else args.reference_precision
            results[name][phase] = harness.subcommand_json(
                "speed", "--config", args.config, "--precision", precision, "--what", phase,
                "--xla", args.xla, "--rounds", "1", "--train-steps", "3",
                "--translate-repeats", "1", "--only", name, "--report-peak-memory")
    return results


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--config", default="bench",
                        help="'bench' (the shared bench configuration) or a preset name")
    parser.add_argument("--precision", default="float32", choices=harness.PRECISIONS,
                        help="our precision policy")
    parser.add_argument("--reference-precision", default="float32", choices=harness.PRECISIONS,
                        help="the reference's precision policy (Model Garden's "
                             "mixed_bfloat16 fails with a dtype error)")
    parser.add_argument("--reference", choices=["model_garden"], default=None,
                        help="also time TF Model Garden's Seq2SeqTransformer, alternating")
    parser.add_argument("--what", default="train,translate,latency,memory",
                        help="comma-separated subset of train,translate,latency,memory")
    parser.add_argument("--xla", default="auto", choices=["auto", "on", "off"],
                        help="XLA for our training step and beam search: auto = training "
                             "without, search with (what the trainer and translate_xla "
                             "run); Model Garden always runs without")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--translate-repeats", type=int, default=2)
    parser.add_argument("--latency-requests", type=int, default=100)
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="square matmul size for the measured peak, also tried "
                             "at 15/16 of it (smaller: a quicker, lower peak; the "
                             "tests use 256)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--report-peak-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    what = harness.parts(parser, args.what, ["train", "translate", "latency", "memory"])
    if args.reference == "model_garden" and not model_garden_reference.available():
        parser.error("Model Garden is not installed: bash benchmarks/install_model_garden.sh")

    config = make_config(args.config)
    names = [args.only] if args.only else ["ours"] + ([args.reference] if args.reference else [])
    precision_of = {"ours": args.precision, args.reference: args.reference_precision}
    if args.only:
        precision_of[args.only] = args.precision
    impls = [IMPLEMENTATIONS[n](config, precision_of[n], args.xla) for n in names]
    if args.report_peak_memory:
        # One phase of one implementation in this fresh process: resident
        # memory now (imports, model built) and the phase's own peak.
        baseline = harness.status_mib("VmRSS")
        peak_reset = _reset_peak_rss()
        if "train" in what:
            bench_train(impls, config, args, peaks=None)
        if "translate" in what:
            bench_translate(impls, config, args)
        peak = harness.status_mib("VmHWM") if peak_reset else (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps({"baseline_mb": baseline, "peak_mb": peak,
                          "phase_mb": peak - baseline, "peak_reset": peak_reset}))
        return None
    report = {**harness.record(), "matmul_kernels": harness.matmul_kernels(),
              "config": args.config,
              "precision": {impl.name: impl.precision for impl in impls}, "xla": args.xla}
    if "train" in what:
        dtypes = sorted({peak_dtype(impl.precision) for impl in impls})
        report["matmul_peak_gflops"] = {d: matmul_peak(tf.as_dtype(d), args.peak_size)
                                        for d in dtypes}
        report["matmul_peak_sizes"] = list(peak_sizes(args.peak_size))
        report["train"], times = bench_train(impls, config, args, report["matmul_peak_gflops"])
        _ratio(report, "train", times)
    if "translate" in what:
        report["translate"], times = bench_translate(impls, config, args)
        _ratio(report, "translate", times)
    if "latency" in what and not args.only:
        report["latency"] = bench_latency(config, args)
    if "memory" in what and not args.only:
        report["memory_mb"] = bench_memory(args)
    _print(report)
    harness.write_json(report, args.json)
    return report


def _ratio(report, key, times):
    """Per-round ratio ours / reference (time_ref / time_ours), median."""
    names = list(times)
    if len(names) == 2:
        report[key]["speedup_vs_" + names[1]] = harness.ratios(times[names[1]], times[names[0]])


def _print(report):
    precision = ", ".join(f"{k} {v}" for k, v in report["precision"].items())
    print(f"\nconfig={report['config']} precision: {precision}; xla={report['xla']} "
          f"date={report['date']}")
    if "train" in report:
        sizes = " and ".join(f"{n}^2" for n in report["matmul_peak_sizes"])
        print(f"matmul peak (best of {sizes} chains, GFLOP/s): "
              f"{report['matmul_peak_gflops']}")
        for name, r in report["train"].items():
            if name.startswith("speedup"):
                print(f"  train speedup {name[11:]}: {r['median']:.2f}x "
                      f"(rounds {', '.join(f'{x:.2f}' for x in r['rounds'])})")
            else:
                print(f"  train {name:18s} {r['target_tokens_per_s']:9.0f} target tokens/s  "
                      f"{r['model_tflops_per_s'] * 1000:6.1f} GFLOP/s  "
                      f"({100 * r['fraction_of_matmul_peak']:.0f}% of the "
                      f"{peak_dtype(r['precision'])} matmul peak)")
    if "translate" in report:
        for name, r in report["translate"].items():
            if name.startswith("speedup"):
                print(f"  translate speedup {name[11:]}: {r['median']:.2f}x "
                      f"(rounds {', '.join(f'{x:.2f}' for x in r['rounds'])})")
            else:
                print(f"  translate {name:14s} {r['sentences_per_s']:9.1f} sentences/s (beam 4)")
    if "latency" in report:
        r = report["latency"]
        print(f"  SavedModel latency, one sentence of {r['source_tokens']} tokens "
              f"(vocabulary {r['vocab_size']}), {r['requests']} requests each:")
        for name in LATENCY_SIGNATURES:
            print(f"    {name:16s} p50 {r[name]['p50_ms']:6.1f} ms, p95 "
                  f"{r[name]['p95_ms']:6.1f} ms "
                  f"(first request {r[name]['first_request_ms']:.0f} ms)")
    if "memory_mb" in report:
        for name, phases in report["memory_mb"].items():
            for phase, m in phases.items():
                print(f"  memory {phase:9s} {name:18s} +{m['phase_mb']:6.0f} MB over "
                      f"{m['baseline_mb']:.0f} MB after build (peak {m['peak_mb']:.0f} MB)")

