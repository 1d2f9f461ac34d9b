"""Training and beam-search throughput with KERAS_BACKEND=jax: for hosts (GPUs)
that have JAX but no TensorFlow. Companion to `python -m benchmarks speed`
(TensorFlow, with the Model Garden reference); no TensorFlow is imported.
KERAS_BACKEND defaults to jax for this subcommand; the library is imported
from the checkout where it is not installed.

    python -m benchmarks jax
    python -m benchmarks jax --config bench,base \\
        --precision float32,mixed_bfloat16 --train-shapes 64x32x32,384x64x64

Measures, for each config x precision (each in a fresh process, so memory
figures are its own):
  train      target tokens/s of the step `model.fit` runs (Keras's JAX
             trainer: `train_step` under `jax.jit`, state donated), driven
             without `fit`'s per-step callbacks, and model FLOP/s as a
             fraction of a matmul peak measured here in the same dtype and
             default matmul precision (on NVIDIA GPUs JAX's default runs
             float32 matmuls as TF32; the peak is measured the same way);
  translate  beam-search sentences/s under `jax.jit` (untrained weights,
             so every beam runs to the maximum length);
  memory     the device's peak bytes in use (`memory_stats`, where the
             platform reports it).

Shapes are BATCHxSOURCExTARGET (training) and BATCHxSOURCE (translation).
The defaults are the shared bench shapes (`benchmarks/bench_config.py`); on a
GPU add larger ones (e.g. 384x64x64, ~25k target tokens a batch as in the
paper's section 5.1) to fill the device.
"""

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import harness
from benchmarks.bench_config import (
    TRAIN_SHAPE,
    TRANSLATE_SHAPE,
    make_config,
    peak_dtype,
    random_ids,
    training_flops,
)

TRANSLATE = {key: TRANSLATE_SHAPE[key] for key in ("beam_size", "alpha", "extra_length")}


def parse_shapes(text, dims):
    shapes = []
    for item in filter(None, text.split(",")):
        parts = item.split("x")
        if len(parts) != dims or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(
                f"shape {item!r}: expected {dims} positive integers joined by 'x'")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def matmul_peak(dtype, size, repeats=10):
    """TFLOP/s of a chain of `size`-square matmuls in `dtype` on the default
    device, at JAX's default matmul precision (what the model's matmuls get).
    Random operands: zeros can run faster than real data."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
    scale = jnp.asarray(1.0 / size**0.5, dtype)

    @jax.jit
    def chain(x):
        for _ in range(repeats):
            x = (x @ a) * scale
        return x

    chain(a).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        chain(a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * size**3 * repeats / min(times) / 1e12


def device_peak_bytes():
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def bench_train(model, config, shape, steps, rounds, profile_dir=None):
    """Times `rounds` runs of `steps` training steps of the jitted step that
    `model.fit` uses, carrying the (donated) state between steps as `fit`
    does. Returns seconds per step per round and the first (compiling)
    step's seconds."""
    import jax

    batch, source_length, target_length = shape
    source = random_ids(config, batch, source_length, 0)
    target = random_ids(config, batch, target_length + 1, 1)
    x, y = (source, target[:, :-1]), target[:, 1:]
    start = time.perf_counter()
    # Builds the optimizer and metrics and compiles `model.train_function`
    # (`jax.jit(model.train_step, donate_argnums=0)`), as `fit` would.
    first_loss = float(model.train_on_batch(x, y))
    compile_s = time.perf_counter() - start
    variables = (model.trainable_variables, model.non_trainable_variables,
                 model.optimizer.variables, model.metrics_variables)
    state = tuple([v.value for v in group] for group in variables)
    data = jax.device_put((x, y, None))

    def run(n):
        nonlocal state
        for _ in range(n):
            logs, state = model.train_function(state, iter([data]))
        jax.block_until_ready(state)
        return logs

    run(3)  # warm
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        logs = run(steps)
        seconds.append((time.perf_counter() - start) / steps)
    last_loss = float(logs["loss"])
    if profile_dir:  # a trace of 5 more steps, for TensorBoard / xprof
        with jax.profiler.trace(os.path.join(profile_dir, "x".join(map(str, shape)))):
            run(5)
    for group, values in zip(variables, state):
        for variable, value in zip(group, values):
            variable.assign(value)
    per_step = statistics.median(seconds)
    step_flops = training_flops(config, batch, source_length, target_length)
    return {"shape": "x".join(map(str, shape)),
            "target_tokens_per_s": batch * target_length / per_step,
            "ms_per_step": per_step * 1000,
            "model_tflops_per_s": step_flops / per_step / 1e12,
            "rounds_ms_per_step": [s * 1000 for s in seconds],
            "first_step_s": compile_s,
            "loss_first_step": first_loss, "loss_after": last_loss}


def bench_translate(model, config, shape, repeats, rounds):
    """Beam-4 sentences/s of `beam_search_translate` under `jax.jit`, the
    weights passed in as arguments (not baked in as constants)."""
    import jax
    import keras

    from keras_transformer.decoding import beam_search_translate

    batch, source_length = shape
    source = random_ids(config, batch, source_length, 2)
    variables = model.trainable_variables + model.non_trainable_variables

    @jax.jit
    def translate(values, source):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return beam_search_translate(model, source, **TRANSLATE)[0]

    values = [v.value for v in variables]
    start = time.perf_counter()
    out = translate(values, source).block_until_ready()
    compile_s = time.perf_counter() - start
    if out.shape[:2] != (batch, TRANSLATE["beam_size"]):
        raise RuntimeError(f"beam search returned shape {out.shape}")
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            out = translate(values, source)
        out.block_until_ready()
        seconds.append((time.perf_counter() - start) / repeats)
    per_batch = statistics.median(seconds)
    return {"shape": "x".join(map(str, shape)), "sentences_per_s": batch / per_batch,
            "ms_per_batch": per_batch * 1000, "rounds_ms_per_batch": [s * 1000 for s in seconds],
            "first_call_s": compile_s}


def run_one(config_name, precision, args):
    """One config x precision in this process; returns its report."""
    import jax
    import keras

    import keras_transformer as kt

    if keras.backend.backend() != "jax":
        raise SystemExit(f"KERAS_BACKEND is {keras.backend.backend()!r}; this benchmark "
                         "needs 'jax' (set KERAS_BACKEND=jax before Python starts)")
    device = jax.devices()[0]
    report = {"config": config_name, "precision": precision, "platform": device.platform,
              "device": device.device_kind, "jax": jax.__version__, "keras": keras.__version__}
    config = make_config(config_name, args.set)
    report["overrides"] = args.set
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(precision)
    model = kt.Transformer(config)
    model.build()
    model.compile(optimizer=kt.transformer_adam(config.d_model),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id))
    keras.config.set_dtype_policy("float32")
    if "train" in args.what:
        dtype = peak_dtype(precision)
        size = args.peak_size or (8192 if device.platform == "gpu" else 2048)
        peak = matmul_peak(dtype, size)
        report["matmul_peak_tflops"] = {dtype: peak, "size": size}
        report["train"] = []
        for shape in args.train_shapes:
            result = bench_train(model, config, shape, args.train_steps, args.rounds,
                                 args.profile)
            result["fraction_of_matmul_peak"] = result["model_tflops_per_s"] / peak
            report["train"].append(result)
    if "translate" in args.what:
        report["translate"] = [bench_translate(model, config, shape, args.translate_repeats,
                                               args.rounds)
                               for shape in args.translate_shapes]
    report["parameters"] = model.count_params()
    report["tensorflow_imported"] = "tensorflow" in sys.modules
    peak_bytes = device_peak_bytes()
    report["device_peak_mb"] = peak_bytes / 2**20 if peak_bytes is not None else None
    return report


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--config", default="bench",
                        help="comma-separated: 'bench' (the shared bench configuration) "
                             "and/or preset names (base, big, ...)")
    parser.add_argument("--precision", default="float32",
                        help="comma-separated: float32, mixed_bfloat16")
    parser.add_argument("--what", default="train,translate")
    parser.add_argument("--train-shapes", default="{batch}x{source_length}x{target_length}"
                        .format(**TRAIN_SHAPE),
                        type=lambda s: parse_shapes(s, 3), help="BATCHxSOURCExTARGET,...")
    parser.add_argument("--translate-shapes", default="{batch}x{source_length}"
                        .format(**TRANSLATE_SHAPE),
                        type=lambda s: parse_shapes(s, 2), help="BATCHxSOURCE,...")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--translate-repeats", type=int, default=3)
    parser.add_argument("--peak-size", type=int, default=None,
                        help="matmul size for the peak (default 8192 on GPU, 2048 else)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set dropout=0.0 (repeatable)")
    parser.add_argument("--profile", metavar="DIR",
                        help="also trace 5 training steps per shape into DIR (xprof)")
    parser.add_argument("--json", help="also write the reports to this file")
    parser.add_argument("--in-process", action="store_true",
                        help="run one config and precision in this process, print JSON")
    args = parser.parse_args(argv)
    args.what = harness.parts(parser, args.what, ["train", "translate"])
    configs, precisions = args.config.split(","), args.precision.split(",")
    harness.parts(parser, args.precision, harness.PRECISIONS, "--precision")
    if args.in_process:
        if len(configs) != 1 or len(precisions) != 1:
            parser.error("--in-process takes one --config and one --precision")
        print(json.dumps(run_one(configs[0], precisions[0], args)))
        return None
    reports = []
    passthrough = list(argv if argv is not None else sys.argv[1:])
    for config_name in configs:
        for precision in precisions:
            reports.append(harness.subcommand_json(
                "jax", *passthrough, "--config", config_name, "--precision", precision,
                "--in-process"))
            _print(reports[-1])
            sys.stdout.flush()
            # After each run: a later one may be cut off.
            harness.write_json({"date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:],
                                "reports": reports}, args.json)
    return reports


def _print(r):
    peak = r.get("matmul_peak_tflops", {})
    overrides = f" ({', '.join(r['overrides'])})" if r["overrides"] else ""
    print(f"\n{r['config']}{overrides} {r['precision']} on {r['device']} ({r['platform']}; "
          f"jax {r['jax']}, keras {r['keras']}); {r['parameters']:,} parameters")
    if "train" in r:
        dtype = peak_dtype(r["precision"])
        print(f"  {dtype} matmul peak {peak[dtype]:.1f} TFLOP/s ({peak['size']}^3)")
        for t in r["train"]:
            print(f"  train {t['shape']:>10s}: {t['target_tokens_per_s']:11,.0f} target tokens/s"
                  f"  {t['ms_per_step']:7.2f} ms/step  {t['model_tflops_per_s']:7.2f} TFLOP/s"
                  f"  MFU {100 * t['fraction_of_matmul_peak']:5.1f}%  "
                  f"(first step {t['first_step_s']:.1f} s; loss {t['loss_first_step']:.2f}"
                  f" -> {t['loss_after']:.2f})")
    for t in r.get("translate", []):
        print(f"  beam-{TRANSLATE['beam_size']} {t['shape']:>9s}: "
              f"{t['sentences_per_s']:9.1f} sentences/s  "
              f"{t['ms_per_batch']:8.1f} ms/batch (first call {t['first_call_s']:.1f} s)")
    if r.get("device_peak_mb") is not None:
        print(f"  device peak memory {r['device_peak_mb']:,.0f} MB")

