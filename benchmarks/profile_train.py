"""Where a training step spends its time on CPU: per kind of TensorFlow op and
XLA thunk, from a `tf.profiler` trace of the step `python -m benchmarks speed
--what train` times.

    python -m benchmarks profile-train                       # bench config, float32
    python -m benchmarks profile-train --precision mixed_bfloat16
    python -m benchmarks profile-train --config base --batch 32

Runs `--steps` steps of the bench training batch (64 sentences x 32 source
and 32 target tokens) unprofiled, then the same number under the profiler,
and splits the thread time of the trace into self times (an event's duration
less that of the events nested in it on its thread):

  matmul   TensorFlow's product ops (`MatMul`, `_FusedMatMul`, `BatchMatMulV3`,
           oneDNN's `_Mkl...MatMul...`) and XLA's dot thunks;
  ops      every other TensorFlow op (by type: `Transpose`, `BiasAddGrad`,
           `ResourceApplyAdam`, ...);
  xla      every other thunk of the XLA clusters (the loss, the dropout and
           attention clusters: `subtract_exponential_fusion`, `copy`, ...);
  runtime  the executors' own events (scheduling, waiting for a cluster).

Times are per step and add up over threads: the executor runs up to two ops
at once here and the thunks of a cluster run on the intra-op pool, so the
total exceeds the wall time, and an op that waited for the cores while
another ran counts that wait as its own. Compare kinds within one run, and a
kind across runs only as a hint; a change is measured by an A/B run of the
step (docs/performance.md).
"""

import collections
import re

from benchmarks import harness
from benchmarks.bench_config import TRAIN_SHAPE, make_config
from benchmarks.harness import time_rounds
from benchmarks.profile_search import WRAPPERS, event_kind, profiled
from benchmarks.speed import Ours, random_batch

GROUPS = ("matmul", "ops", "xla", "runtime")
# A TensorFlow op's trace event is named "<op name>:<op type>"; the runtime's
# own events are "Class::Method", the search profile's thunk wrappers, or one
# of these names.
_RUNTIME = WRAPPERS + ("BlockUntilReady", "ParallelFor", "Await", "Execute")
_XLA_DOT = re.compile(r"^(dot|MatMul|BatchMatMul|convolution)")


def classify(name):
    """`(group, kind)` of one trace event name."""
    if "::" in name or name.startswith(_RUNTIME):
        return "runtime", event_kind(name.split(" ")[0])
    if ":" in name:
        op_type = name.rsplit(":", 1)[1]
        return ("matmul" if "MatMul" in op_type else "ops"), op_type
    kind = event_kind(name)  # an XLA thunk, named after its instruction
    return ("matmul" if _XLA_DOT.match(kind) else "xla"), kind


def self_times(events):
    """`[(event, self picoseconds)]` for one thread's events: each event's
    duration less that of the events directly nested in it."""
    ordered = sorted(events, key=lambda e: (e.offset_ps, -e.duration_ps))
    result, stack = [], []
    for event in ordered:
        while stack and stack[-1][0].offset_ps + stack[-1][0].duration_ps <= event.offset_ps:
            stack.pop()
        entry = [event, event.duration_ps]
        if stack:
            stack[-1][1] -= event.duration_ps
        stack.append(entry)
        result.append(entry)
    return result


def op_times(space, steps):
    """`{(group, kind): (ms per step, calls per step)}` from an XSpace, the
    CPU plane's threads but the Python one (whose events wrap the rest)."""
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name == "python":
                continue
            for event, ps in self_times(line.events):
                key = classify(names.get(event.metadata_id, "?"))
                total[key] += ps / 1e9 / steps
                count[key] += 1
    return {key: (ms, count[key] / steps) for key, ms in total.most_common()}


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--config", default="bench", help="'bench' or a preset name")
    parser.add_argument("--precision", default="float32", choices=harness.PRECISIONS)
    parser.add_argument("--xla", default="auto", choices=["auto", "on", "off"],
                        help="as speed's: auto and off train without XLA")
    parser.add_argument("--batch", type=int, default=TRAIN_SHAPE["batch"])
    parser.add_argument("--length", type=int, default=TRAIN_SHAPE["target_length"],
                        help="source and target tokens per sentence")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--top", type=int, default=30, help="kinds to print")
    args = parser.parse_args(argv)
    harness.at_least(parser, args, ["steps", "batch", "length"])

    config = make_config(args.config)
    model = Ours(config, args.precision, args.xla)
    source = random_batch(config, args.batch, args.length, 0)
    target = random_batch(config, args.batch, args.length + 1, 1)

    def step():
        return model.train_step(source, target[:, :-1], target[:, 1:])

    # Traced, compiled and warmed up by 3 untimed steps.
    (seconds,) = time_rounds({"step": step}, rounds=1, warmup=3,
                             repeats=args.steps)["step"]
    wall_ms = seconds * 1e3

    space, profiled_s = profiled(step, args.steps)
    profiled_ms = profiled_s * 1e3
    times = op_times(space, args.steps)

    by_group = collections.Counter()
    for (group, _), (ms, _) in times.items():
        by_group[group] += ms
    total = sum(by_group.values())
    print(f"{args.config}, {args.precision}, {args.batch} x {args.length} tokens: "
          f"{wall_ms:.1f} ms per step unprofiled, {profiled_ms:.1f} profiled; "
          f"thread time per step:")
    print(f"  all {total:9.1f} ms")
    for group in GROUPS:
        print(f"  {group:7s} {by_group[group]:9.1f} ms  {by_group[group] / total:6.1%}")
    print("by kind:")
    for (group, kind), (ms, calls) in list(times.items())[:args.top]:
        print(f"  {group:7s} {kind:36s} {ms:8.2f} ms  {calls:6.0f} calls  "
              f"{ms / calls * 1e3:8.1f} us each")

