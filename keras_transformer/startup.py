"""What every kt-* command does first, before TensorFlow is imported.

A command's `main()` called without arguments (as the console scripts and
`training/*.py` call it) runs `start()` before its other imports. Two
settings, each shown in `--help` and each with a switch, and two without:

- Quiet start-up. TensorFlow's C++ runtime writes to stderr on import and
  when it sets up devices, where nothing is wrong: "failed call to cuInit"
  (an error-level line on a machine without a GPU), "oneDNN custom
  operations are on", "Could not find cuda drivers", the CPU instructions
  the binary could use, absl's "All log messages before absl::InitializeLog()
  is called are written to STDERR", and while training "oneDNN supports
  DT_INT64 only on platforms with AVX-512". `start()` sets
  TF_CPP_MIN_LOG_LEVEL=3 (fatal errors only: level 2 still shows the cuInit
  line) unless the environment sets it, and imports TensorFlow with stderr
  captured: the lines TensorFlow writes before its logging is initialised
  ignore TF_CPP_MIN_LOG_LEVEL, so `start()` drops those below that level
  and passes every other line on. `--tf-verbose` or KT_VERBOSE=1 leaves
  TensorFlow's logging as the environment configures it, and prints what
  `start()` did to malloc; a command that dies at start-up without a word
  says why with it.
- Fast malloc: `malloc.apply()`, glibc's malloc tuned so that training
  steps reuse their memory instead of faulting it in again.
  `--system-malloc` or KT_FAST_MALLOC=0 leaves malloc alone.
- Keras without matplotlib: importing TensorFlow imports Keras, and
  Keras imports matplotlib (pyplot and patches) for its image galleries
  (`keras.visualization`) when matplotlib is installed (the `viz` extra).
  No command draws those, so `start()` imports TensorFlow with matplotlib
  held back (`matplotlib_held_back()`); `kt-visualize` and `kt-demo`
  import it when they draw. Always on: it changes no output.
- Fewer garbage collections: `collect_less()`. Tracing a model into a
  graph (an export, a `tf.function`) allocates millions of short-lived
  Python objects, and at Python's default first threshold (700) the cyclic
  collector runs after every few hundred of them, each time walking the
  young objects. A first threshold of 10,000 keeps the same proportions
  between the three generations. Left alone where the process has set its
  own thresholds (e.g. in a sitecustomize).

`main(argv)` with a list (a call from Python, e.g. a test or `kt-demo`
calling `kt-train`'s main) changes none of them: they are settings of the
process, which the caller owns.
"""

import contextlib
import gc
import os
import re
import sys
import tempfile

from keras_transformer import malloc

VERBOSE_FLAG = "--tf-verbose"
SYSTEM_MALLOC_FLAG = "--system-malloc"
# The console scripts (setup.cfg) and the checkout's scripts that run them
# (training/*.py), by the name a process started as one has in sys.argv[0].
COMMANDS = ("kt-train", "kt-evaluate", "kt-translate", "kt-export", "kt-average",
            "kt-visualize", "kt-demo", "kt-serve")
CHECKOUT_SCRIPTS = ("train.py", "evaluate.py", "translate.py", "export.py",
                    "average_checkpoints.py", "visualize.py", "demo.py", "serve.py")
_CHECKOUT_TRAINING = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training")

# gc.get_threshold() of an interpreter nobody has tuned, and what
# `collect_less()` sets instead.
PYTHON_GC_THRESHOLDS = (700, 10, 10)
GC_THRESHOLDS = (10_000, 10, 10)

_started = False


def launched_as_command(argv0=None, orig_argv=None):
    """Whether this process was started as one of the kt-* commands: a
    console script of `COMMANDS`, `python -m keras_transformer.cli.NAME`, or
    one of the checkout's `training/` scripts that run them."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    if "-m" in orig_argv[:-1]:
        # While `python -m` imports the module's packages, sys.argv[0] is "-m".
        return orig_argv[orig_argv.index("-m") + 1].startswith("keras_transformer.cli.")
    name = os.path.basename(argv0)
    if name in COMMANDS:
        return True
    return (name in CHECKOUT_SCRIPTS
            and os.path.dirname(os.path.abspath(argv0)) == _CHECKOUT_TRAINING)


def start_if_command():
    """`start()` in a process started as a kt-* command; nothing otherwise.
    The package's `__init__` calls it before it imports TensorFlow, since
    importing a command's module imports the package first."""
    if launched_as_command():
        start()


def add_arguments(parser):
    """Declares the start-up flags (read by `start()` before parsing)."""
    group = parser.add_argument_group("start-up")
    group.add_argument(
        VERBOSE_FLAG, action="store_true",
        help="show TensorFlow's C++ start-up logs (CUDA, oneDNN and CPU notices, which "
             "are not faults); hidden by default with TF_CPP_MIN_LOG_LEVEL=3 unless the "
             "environment sets that variable. Same as KT_VERBOSE=1")
    group.add_argument(
        SYSTEM_MALLOC_FLAG, action="store_true",
        help="leave glibc's malloc at its defaults. By default the command keeps freed "
             "memory in one heap (mallopt: M_MMAP_MAX 0, M_TRIM_THRESHOLD -1, "
             "M_ARENA_MAX 1, each unless its MALLOC_* variable is set), so training "
             "steps do not fault their tensors in again; the process keeps its peak "
             "memory until it exits. Same as KT_FAST_MALLOC=0")
    return parser


def _given(args, flag):
    """Whether `args` holds `flag` (the commands never abbreviate flags:
    `allow_abbrev=False`)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == flag:
            return True
    return False


def verbose(args=None):
    """Whether TensorFlow's logs are wanted (`--tf-verbose` or KT_VERBOSE)."""
    args = sys.argv[1:] if args is None else args
    return _given(args, VERBOSE_FLAG) or os.environ.get("KT_VERBOSE", "0") not in ("", "0")


def start(argv=None):
    """Applies the start-up settings when `argv` is None (a command run from
    the shell, whose arguments are `sys.argv[1:]`), once per process."""
    global _started
    if argv is not None or _started:
        return
    _started = True
    args = sys.argv[1:]
    loud = verbose(args)
    if _given(args, SYSTEM_MALLOC_FLAG) or os.environ.get("KT_FAST_MALLOC", "1") == "0":
        if loud:
            print("kt: glibc malloc left at its defaults", file=sys.stderr)
    else:
        applied = malloc.apply()
        if loud:
            kept = {name: os.environ[name] for name in malloc.MALLOPT if name in os.environ}
            print(f"kt: glibc malloc tuned with mallopt {applied or '(nothing)'}; from the "
                  f"environment {kept or '(nothing)'} (--system-malloc or KT_FAST_MALLOC=0 "
                  "to leave it alone)", file=sys.stderr)
    thresholds = collect_less()
    if loud:
        print(f"kt: garbage collector thresholds {thresholds}", file=sys.stderr)
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with matplotlib_held_back():
        if loud:
            import tensorflow  # noqa: F401
        else:
            import_tensorflow_quietly()


@contextlib.contextmanager
def matplotlib_held_back():
    """Within the block, importing matplotlib or any of its modules raises
    ImportError (a None entry in `sys.modules`), so a module that treats
    matplotlib as optional (Keras's image galleries) goes without it;
    afterwards it imports as usual. Nothing is held back when matplotlib is
    imported already."""
    if "matplotlib" in sys.modules:
        yield
        return
    sys.modules["matplotlib"] = None
    try:
        yield
    finally:
        if sys.modules.get("matplotlib", False) is None:
            del sys.modules["matplotlib"]


def collect_less():
    """Sets the cyclic garbage collector's thresholds to `GC_THRESHOLDS`
    when they are Python's defaults (`PYTHON_GC_THRESHOLDS`); leaves
    thresholds the process chose alone. Returns the thresholds in force."""
    if gc.get_threshold() == PYTHON_GC_THRESHOLDS:
        gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_threshold()


# A line of TensorFlow's C++ log (absl's format): severity letter, date, time,
# thread, file:line].
_LOG_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
_ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called"
_SEVERITIES = "IWEF"


def filter_log_lines(text, min_level):
    """`text` without TensorFlow's log lines of a severity below `min_level`
    (TF_CPP_MIN_LOG_LEVEL: 0 info, 1 warning, 2 error, 3 fatal) and, when
    `min_level` is positive, without absl's banner. Other lines pass."""
    if min_level <= 0:
        return text
    kept = []
    for line in text.splitlines(keepends=True):
        if line.startswith(_ABSL_BANNER):
            continue
        if _LOG_LINE.match(line) and _SEVERITIES.index(line[0]) < min_level:
            continue
        kept.append(line)
    return "".join(kept)


def import_tensorflow_quietly():
    """Imports TensorFlow with file descriptor 2 sent to a temporary file,
    then writes what it caught to stderr through `filter_log_lines` with
    TF_CPP_MIN_LOG_LEVEL. No-op when TensorFlow is imported already."""
    if "tensorflow" in sys.modules:
        return
    try:
        min_level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        min_level = 0
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", "replace")
            sys.stderr.write(filter_log_lines(text, min_level))
            sys.stderr.flush()
