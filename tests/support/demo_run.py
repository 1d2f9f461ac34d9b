"""The short kt-demo run that several test files need: tests/test_demo.py
checks the run itself, tests/test_playground.py serves its export. It runs
once per pytest run, across pytest-xdist workers: the first test to ask
runs it under a file lock, the others wait for it and read its result."""

import fcntl
import json
import os
import subprocess
import sys

from support.processes import ROOT

# The console script, installed beside this Python (scripts/venv.sh).
KT_DEMO = os.path.join(os.path.dirname(sys.executable), "kt-demo")
# Every step of the main job, with a tiny model and a few updates.
TINY_DEMO_FLAGS = ("--config", "tiny", "--train-steps", "12", "--test-sentences", "8",
                   "--average", "2")


def run_demo(directory, *extra, timeout):
    """Runs `kt-demo --run-dir <directory>/run --saved-models
    <directory>/sm <extra>` as a user's shell would (no TensorFlow log level
    set; the tests' conftest sets one). Returns the `CompletedProcess`."""
    command = [KT_DEMO, "--run-dir", os.path.join(directory, "run"),
               "--saved-models", os.path.join(directory, "sm"), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KT_VERBOSE")}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


def _run_directory(tmp_path_factory):
    """A directory every pytest-xdist worker of one pytest run shares: each
    worker's base temporary directory is a child of the run's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def tiny_demo(tmp_path_factory, timeout=900):
    """The pytest run's tiny kt-demo run (`TINY_DEMO_FLAGS`), run on first use.

    Returns: a dict with `returncode`, `stdout`, `stderr`, `run_dir` and
    `saved_models` (the `--saved-models` directory; the export is
    `<saved_models>/demo/1`).
    """
    shared = _run_directory(tmp_path_factory)
    directory = shared / "tiny-demo"
    result_file = directory / "result.json"
    with open(shared / "tiny-demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result_file.exists():
            directory.mkdir(exist_ok=True)
            done = run_demo(str(directory), *TINY_DEMO_FLAGS, timeout=timeout)
            result_file.write_text(json.dumps({
                "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "run_dir": str(directory / "run"), "saved_models": str(directory / "sm")}))
        return json.loads(result_file.read_text())
