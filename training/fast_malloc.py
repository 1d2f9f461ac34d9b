"""glibc malloc settings for TensorFlow on CPU, applied by re-executing the
script before TensorFlow is imported (glibc reads them only at start-up).

Why: TensorFlow's CPU allocator takes tensor memory from malloc. By default
glibc serves every large block with a fresh `mmap` and returns it with
`munmap` on free, so each training step faults in (and the kernel zeroes)
its activations and logits again. With token-bucketed batches, whose shapes
change every step, that took 38% of the CPU time of a Multi30k training run
on this project's 2-core machine (`/proc/<pid>/stat`: 6.8 s system vs 11.2 s
user time in 10 s). Keeping freed memory in the heap instead (no mmap, no
trimming, one arena) cut the system time to ~2% and the page faults of the
bench training step by 4.4x (README, "Benchmarks").

The cost: the process keeps its peak heap until it exits (it does not
shrink between steps), which is what a training or translation job wants.
Values already in the environment win; `KT_FAST_MALLOC=0` turns this off.
"""

import os
import sys

SETTINGS = {
    "MALLOC_MMAP_MAX_": "0",                      # no mmap for large blocks
    "MALLOC_TRIM_THRESHOLD_": str(16 * 1024**3),  # never give the heap back
    "MALLOC_ARENA_MAX": "1",                      # one heap to reuse from
}


def apply():
    """Re-executes this process with `SETTINGS` in its environment unless
    they are there already (or on a platform without glibc's malloc)."""
    if os.environ.get("KT_FAST_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return
    if all(name in os.environ for name in SETTINGS):
        return
    env = {**SETTINGS, **os.environ}
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv keeps the interpreter's own flags (python -u ...).
    os.execve(sys.executable, list(sys.orig_argv), env)
