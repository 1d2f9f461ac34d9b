"""The harness every benchmark shares: its parser, alternating rounds and
their ratios, servers run as subprocesses, and the result file with where
it was measured: the CPU (model, cores, the instruction sets that choose
TensorFlow's kernels), the kernels TensorFlow multiplies float32 with, the
commit and the command. No TensorFlow at import."""

import argparse
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Flags that decide which kernels TensorFlow takes and whether bfloat16 is native.
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "fma")
PRECISIONS = ["float32", "mixed_bfloat16", "mixed_float16"]


# Arguments -------------------------------------------------------------------


def parser(doc, **kwargs):
    """A subcommand's parser: `doc` (its module's docstring) shown as
    written, abbreviated flags refused unless `allow_abbrev=True`."""
    return argparse.ArgumentParser(**{"allow_abbrev": False, **kwargs}, description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def at_least(parser, args, names, minimum=1):
    """`parser.error` unless each of `args`' `names` is at least `minimum`."""
    for name in names:
        value = getattr(args, name)
        if value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be at least {minimum}, got {value}")


def parts(parser, text, known, flag="--what"):
    """The set of comma-separated `text`, each one of `known`, else `parser.error`."""
    chosen = set(text.split(","))
    if not chosen or chosen - set(known):
        parser.error(f"unknown {flag} {sorted(chosen - set(known))}; {flag} takes "
                     f"{', '.join(known)}")
    return chosen


def subcommand_json(name, *args):
    """Runs `python -m benchmarks <name> <args>` in a fresh process with
    this interpreter, from any working directory (the repository root leads
    PYTHONPATH, so `benchmarks` and, without an install, the library are
    found). Returns its last stdout line parsed as JSON; exits with the
    tail of its stderr if it fails."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": ROOT + (os.pathsep + path if path else "")}
    done = subprocess.run([sys.executable, "-m", "benchmarks", name, *args],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"python -m benchmarks {name} {' '.join(args)} failed "
                         f"(exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


# Rounds ------------------------------------------------------------------------


def time_rounds(callables, rounds, warmup, repeats):
    """Alternates `callables` (name -> fn) `rounds` times; each timing is
    `repeats` calls after `warmup` untimed ones. Returns name -> [seconds per
    call, one per round]."""
    for fn in callables.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in callables}
    for _ in range(rounds):
        for name, fn in callables.items():
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[name].append((time.perf_counter() - start) / repeats)
    return times


def flipped(names, rounds):
    """`(round, names in that round's order)`: the order flips every round,
    so that the machine's drift falls on all alike."""
    names = list(names)
    for r in range(rounds):
        yield r, names if r % 2 == 0 else names[::-1]


def ratios(numerators, denominators):
    """`{"median", "rounds"}` of the per-round ratios."""
    values = [a / b for a, b in zip(numerators, denominators)]
    return {"median": statistics.median(values), "rounds": values}


def seconds_each(fn, items):
    """Seconds of `fn(item)` for each of `items`, in order."""
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    return times


def status_mib(field, pid="self"):
    """`VmRSS`, `VmHWM`, ... of a process from /proc/<pid>/status, in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


# Inputs ------------------------------------------------------------------------


def read_text(path):
    """The lines of a text file (.gz ok) as str."""
    from keras_transformer.cli.common import read_lines

    return [line.decode("utf-8", "replace") for line in read_lines(path)]


def held_out(count=None):
    """`(sources, references)`: the first `count` (None: all) of the
    built-in corpus's held-out test pairs, what kt-demo scores on."""
    from keras_transformer.data.synthetic import generate_corpus

    sources, targets = generate_corpus()["test"]
    return sources[:count], targets[:count]


def extract_package(revision, directory):
    """`keras_transformer/` at git `revision` of this repository, extracted
    under `directory` (`git archive`)."""
    import io
    import tarfile

    archive = subprocess.run(["git", "archive", revision, "keras_transformer"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    return os.path.join(directory, "keras_transformer")


# Servers -----------------------------------------------------------------------


def start_process(command, ready, timeout=120, env=None, on_line=None):
    """Starts `command` (from the repository root, the CPU only, TensorFlow's
    info lines off, `env` added) and waits for a stdout line matching the
    regex `ready`, draining stdout for the life of the process.

    Returns: `(process, match)`. `process.stderr_path` is a file holding
    its stderr until `stop_process`; `on_line(line)` sees every line
    before the ready one. Raises `RuntimeError` with its stderr if it exits
    or stays silent for `timeout` seconds."""
    with tempfile.NamedTemporaryFile(prefix="benchmark-server-", suffix=".log",
                                     delete=False) as stderr:
        process = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                    "CUDA_VISIBLE_DEVICES": "", **(env or {})},
            stdout=subprocess.PIPE, stderr=stderr, text=True)
    process.stderr_path = stderr.name
    lines = queue.Queue()

    def read():
        # Drains stdout for the life of the process, so it never blocks on
        # a full pipe.
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is not None:
            match = ready.search(line)
            if match:
                return process, match
            if on_line is not None:
                on_line(line)
            continue
        stop_process(process)
        raise RuntimeError(f"{' '.join(command)} did not become ready within {timeout} s "
                           f"(exit status {process.returncode}):\n"
                           f"{process.stderr_text[-4000:]}")


def stop_process(process, timeout=15):
    """Stops a process `start_process` started: SIGTERM (a server's
    graceful shutdown), SIGKILL after `timeout` seconds. Moves its stderr
    from the file into `process.stderr_text`. Returns the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    path = getattr(process, "stderr_path", None)
    if path is not None and os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            process.stderr_text = f.read()
        os.remove(path)
    return process.returncode


# Provenance and the result file ------------------------------------------------


def cpu(cpuinfo="/proc/cpuinfo"):
    """`{"model", "cores", "flags"}` of this machine's CPU (flags limited to
    `NOTABLE_FLAGS`); the model is `platform.processor()` where there is no
    `/proc/cpuinfo`."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(),
            "flags": [flag for flag in NOTABLE_FLAGS if flag in flags]}


def commit():
    """The checkout's commit, with "+changes" when the tree differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def matmul_kernels():
    """"onednn", "eigen" or "gpu": what TensorFlow multiplies float32 with here."""
    from keras_transformer.kernels import platform as tf_platform

    if tf_platform.has_gpu():
        return "gpu"
    return "onednn" if tf_platform.tensorflow_uses_onednn() else "eigen"


def record(command=None):
    """The provenance fields of a result file."""
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu(), "commit": commit(),
            "command": command or " ".join(sys.argv)}


def cpu_kind(cpu_fields):
    """The results files' CPU prefix: "avx512" or "avx2" by the widest
    vector instructions of `cpu()`'s fields (a Zen 3 AVX2 host is written
    "zen3-avx2" by hand)."""
    flags = set(cpu_fields["flags"])
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "cpu"


def result_path(fields, kind, directory=None):
    """`<cpu kind>_<date>_<commit>_<kind>.json` in `directory` (default
    `benchmarks/results/`) for a result whose provenance is `fields`
    (`record()`). A file already there is not overwritten: the next result
    of the same kind, commit and day gets `-2`, `-3`, ... before `.json`."""
    directory = directory or os.path.join(ROOT, "benchmarks", "results")
    stem = os.path.join(directory, f"{cpu_kind(fields['cpu'])}_{time.strftime('%Y-%m-%d')}_"
                                   f"{fields['commit'].split('+')[0]}_{kind}")
    path, n = f"{stem}.json", 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}.json"
    return path


def write_json(document, path, indent=2):
    """Writes `document` as JSON to `path` (nothing when `path` is None)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=indent)
            f.write("\n")


def write_result(document, fields, kind, path=None, indent=2):
    """Writes `document` as JSON to `path`, by default `result_path(fields,
    kind)` (`fields`: `record()`'s); prints and returns the path."""
    path = path or result_path(fields, kind)
    write_json(document, path, indent)
    print(f"wrote {path}")
    return path
