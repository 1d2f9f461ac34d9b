"""Where an XLA beam search spends its time on CPU: per kind of XLA thunk
(matmul, each fusion kind, copy, ...), from a `tf.profiler` trace.

    python -m benchmarks profile-search                   # the bench batch
    python -m benchmarks profile-search --config base --extra-length 50
    python -m benchmarks profile-search --batch 1 --source-length 24   # a latency request

Translates the bench translation batch (32 sentences of 20 tokens, beam 4,
alpha 0.6, untrained weights: every beam runs to full length) `--searches`
times under the profiler, then prints each thunk kind's total time and count
per search. XLA names a thunk after its HLO instruction (`MatMul.1173`,
`bitcast_select_fusion.21`); the kind is that name without the number.
XLA:CPU runs thunks on TensorFlow's Eigen pool and some on the calling
thread, inside its `ThunkExecutor`; with one intra-op thread
(`TF_NUM_INTRAOP_THREADS=1`) all run there. Thunk times on several threads
add up, so they can exceed the wall time.
"""

import bisect
import collections
import glob
import os
import re
import tempfile
import time

import numpy as np
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from benchmarks import harness
from benchmarks.bench_config import TRANSLATE_SHAPE, make_config
from benchmarks.harness import time_rounds
from benchmarks.speed import Ours, random_batch

# Trace events that wrap thunks rather than being one (executors, waits).
WRAPPERS = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "while", "end:")


def read_xspace(path):
    """The `tf.profiler` trace (an `XSpace`) in the `.xplane.pb` file `path`."""
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def profiled(fn, count):
    """`(trace, wall seconds per call)` of `count` calls of `fn` under
    `tf.profiler`, the trace an `XSpace`."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(count):
            fn()
        seconds = (time.perf_counter() - start) / count
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        return read_xspace(path), seconds


def event_kind(name):
    """A trace event's name without its instance number: XLA names a thunk
    after its HLO instruction (`MatMul.1173` -> `MatMul`)."""
    return re.sub(r"\.\d+$", "", name)


def thunk_times(space, searches):
    """`{kind: (ms per search, count per search)}` from an XSpace: the
    events of the Eigen pool's threads, and those of other threads that
    run inside a `ThunkExecutor` event of their thread, wrappers left out."""
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            inside = None if "Eigen" in line.name else _executor_spans(line, names)
            for event in line.events:
                kind = event_kind(names.get(event.metadata_id, "?"))
                if kind.startswith(WRAPPERS) or (inside is not None and not inside(event)):
                    continue
                total[kind] += event.duration_ps / 1e9 / searches
                count[kind] += 1
    return {kind: (ms, count[kind] / searches) for kind, ms in total.most_common()}


def _executor_spans(line, names):
    """A test of whether an event of `line` lies within one of the line's
    `ThunkExecutor` events (they nest: merged into disjoint spans)."""
    spans = []
    for start, end in sorted((e.offset_ps, e.offset_ps + e.duration_ps) for e in line.events
                             if names.get(e.metadata_id, "").startswith("ThunkExecutor")):
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    starts = [start for start, _ in spans]

    def inside(event):
        i = bisect.bisect_right(starts, event.offset_ps) - 1
        return i >= 0 and event.offset_ps + event.duration_ps <= spans[i][1]

    return inside


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--config", default="bench", help="'bench' or a preset name")
    parser.add_argument("--extra-length", type=int, default=TRANSLATE_SHAPE["extra_length"])
    parser.add_argument("--batch", type=int, default=TRANSLATE_SHAPE["batch"],
                        help="sentences per search (1: the shape of a latency request)")
    parser.add_argument("--source-length", type=int, default=TRANSLATE_SHAPE["source_length"])
    parser.add_argument("--searches", type=int, default=3)
    parser.add_argument("--top", type=int, default=25, help="thunk kinds to print")
    args = parser.parse_args(argv)

    shape = dict(TRANSLATE_SHAPE, batch=args.batch, source_length=args.source_length)
    config = make_config(args.config)
    # The search `speed --what translate` times (float32, XLA), on its batch.
    translate = Ours(config, "float32", "auto").translator(
        shape["beam_size"], shape["alpha"], args.extra_length)
    source = random_batch(config, shape["batch"], shape["source_length"], 2)

    # Compiled and warmed up by 3 untimed searches.
    (seconds,) = time_rounds({"search": lambda: np.asarray(translate(source))}, rounds=1,
                             warmup=3, repeats=args.searches)["search"]
    wall_ms = seconds * 1e3

    space, _ = profiled(lambda: np.asarray(translate(source)), args.searches)
    times = thunk_times(space, args.searches)

    print(f"{args.config}, {shape['batch']} sentences x {shape['source_length']} tokens, "
          f"beam {shape['beam_size']}, extra length {args.extra_length}: "
          f"{wall_ms:.1f} ms per search unprofiled; thunk time per search:")
    print(f"  all thunks {sum(ms for ms, _ in times.values()):8.1f} ms")
    for kind, (ms, calls) in list(times.items())[:args.top]:
        print(f"  {kind:32s} {ms:8.2f} ms  {calls:6.0f} calls  {ms / calls * 1e3:7.1f} us each")

