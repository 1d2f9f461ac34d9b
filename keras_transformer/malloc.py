"""glibc malloc settings for TensorFlow on CPU, which the kt-* commands apply
at start-up (`--system-malloc` or `KT_FAST_MALLOC=0` leaves malloc alone).

TensorFlow's CPU allocator takes tensor memory from malloc. By default glibc
serves every large block with a fresh `mmap` and unmaps it on free, so each
training step faults in (and the kernel zeroes) its activations and logits
again; with token-bucketed batches, whose shapes change every step, glibc's
adaptive mmap threshold never settles. These settings keep freed memory in
the heap for the next step instead:

    no mmap for large blocks        M_MMAP_MAX 0          MALLOC_MMAP_MAX_=0
    no trimming of the heap's top   M_TRIM_THRESHOLD -1   MALLOC_TRIM_THRESHOLD_=17179869184
    one heap to reuse from          M_ARENA_MAX 1         MALLOC_ARENA_MAX=1

The cost: the process keeps its peak heap until it exits, which a training
or translation job wants. docs/performance.md has the measured effect.

`apply()` sets them in the running process with mallopt(3); glibc reads the
MALLOC_* variables (`ENVIRONMENT`) only when a process starts, so they are
the form for processes not started yet (scripts/venv.sh exports them). The
two differ only in trimming: mallopt's -1 never trims, the variable trims
once more than 16 GiB at the top of the heap is free. A variable already in
the environment wins: glibc applied it at start-up and `apply()` leaves that
parameter as it is.
"""

import ctypes
import ctypes.util
import os
import sys

# Environment form: the variables glibc reads at start-up, and their values.
ENVIRONMENT = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(16 * 1024**3),
    "MALLOC_ARENA_MAX": "1",
}

# mallopt(3) form: variable -> (parameter number from glibc's <malloc.h>, value).
# M_TRIM_THRESHOLD takes an int; -1 turns trimming off.
MALLOPT = {
    "MALLOC_MMAP_MAX_": (-4, 0),         # M_MMAP_MAX
    "MALLOC_TRIM_THRESHOLD_": (-1, -1),  # M_TRIM_THRESHOLD
    "MALLOC_ARENA_MAX": (-8, 1),         # M_ARENA_MAX
}


def _glibc():
    """glibc's C library, or None where malloc is not glibc's (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def apply(environ=None):
    """Sets `MALLOPT` in this process with mallopt(3), except the parameters
    whose MALLOC_* variable is in `environ` (default: `os.environ`). Call it
    before TensorFlow is imported, while the process has one thread: glibc
    fixes its arena limit when threads first need arenas.

    Returns: `{variable: value}` of what it set (empty where malloc is not
    glibc's).
    """
    environ = os.environ if environ is None else environ
    libc = _glibc()
    if libc is None:
        return {}
    applied = {}
    for name, (parameter, value) in MALLOPT.items():
        if name in environ:
            continue
        if libc.mallopt(parameter, value) != 1:
            raise OSError(f"mallopt({parameter}, {value}) failed")
        applied[name] = value
    return applied
