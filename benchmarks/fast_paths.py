"""What each TensorFlow-only fast path (`keras_transformer/dispatch.py`)
gains on a training step, on this machine.

For every fast path that the step takes here (given the precision and the
kernels TensorFlow multiplies with), the step is built twice, with every
path and with all but that one, and the two are timed in alternating
rounds in this process. The gain is the per-round ratio of step times,
without / with (above 1: the path pays); the median and the range are
reported. Run it once per CPU kind: with `TF_ENABLE_ONEDNN_OPTS=0` a CPU
that TensorFlow gives oneDNN multiplies with Eigen instead.

    python -m benchmarks fast-paths
    python -m benchmarks fast-paths --precision mixed_bfloat16
    TF_ENABLE_ONEDNN_OPTS=0 python -m benchmarks fast-paths --json benchmarks/results/X.json
"""

import statistics

from benchmarks import harness
from benchmarks.bench_config import compiled_model, make_config
from benchmarks.harness import time_rounds
from benchmarks.speed import train_batch
from keras_transformer import dispatch

FLOAT32_ONLY = {"eigen_slices", "compiled_attention"}
EIGEN_ONLY = {"eigen_slices", "compiled_attention"}


def paths_taken(config, precision):
    """The fast paths a training step of `config` in `precision` takes here."""
    taken = []
    for name in dispatch.FAST_PATHS:
        if not dispatch.enabled(name):
            continue
        if name in FLOAT32_ONLY and precision != "float32":
            continue
        if name in EIGEN_ONLY and not dispatch.multiplies_with_eigen():
            continue
        if name == "philox_dropout" and not config.dropout:
            continue
        if name == "eigen_slices" and not any(dispatch.slices_pay(width) for width in (
                config.vocab_size, config.d_ff)):
            continue
        if name == "compiled_attention" and config.attention_dropout:
            continue
        taken.append(name)
    return taken


def build_step(config, precision, disabled, batch):
    """A compiled model's training step, traced with `disabled` paths off."""
    with dispatch.configured(disabled=disabled):
        model = compiled_model(config, precision)
        step = lambda: model.train_on_batch(*batch)  # noqa: E731
        step()  # traced here, with the switches above
    return step


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--config", default="bench",
                        help="'bench' (the shared bench configuration) or a preset name")
    parser.add_argument("--precision", default="float32", choices=harness.PRECISIONS)
    parser.add_argument("--paths", help="comma-separated fast paths to measure "
                                        "(default: every one the step takes here)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    harness.at_least(parser, args, ["rounds", "train_steps"])
    config = make_config(args.config)
    paths = args.paths.split(",") if args.paths else paths_taken(config, args.precision)
    unknown = sorted(set(paths) - set(dispatch.FAST_PATHS))
    if unknown:
        parser.error(f"unknown --paths {unknown}; the fast paths are {list(dispatch.FAST_PATHS)}")
    batch = train_batch(config)
    steps = {"all": build_step(config, args.precision, (), batch)}
    for name in paths:
        steps[name] = build_step(config, args.precision, {name}, batch)
    times = time_rounds(steps, args.rounds, warmup=2, repeats=args.train_steps)
    report = {**harness.record(), "matmul_kernels": harness.matmul_kernels(),
              "config": args.config, "precision": args.precision,
              "step_s_all_paths": times["all"], "gain": {}}
    print(f"{report['cpu']['model']} ({', '.join(report['cpu']['flags'])}), "
          f"TensorFlow multiplies with {report['matmul_kernels']}; {args.config}, "
          f"{args.precision}; step with every path: {statistics.median(times['all']):.3f} s")
    for name in paths:
        gain = report["gain"][name] = harness.ratios(times[name], times["all"])
        print(f"  {name:20s} {gain['median']:.3f}x "
              f"({min(gain['rounds']):.3f}-{max(gain['rounds']):.3f})")
    harness.write_json(report, args.json)
    return report
