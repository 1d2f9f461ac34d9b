"""The corpus pipeline on Apache Beam (`keras_transformer/beam.py`): two
text files through the SavedModel with RunInference on the DirectRunner,
2 workers in separate processes, give per file the shards kt-translate's
output splits into, line for line and byte for byte.

Beam pins an older protobuf than the main environment's, so the pipeline
runs under `KT_BEAM_PYTHON` (scripts/venv_beam.sh makes .venv-beam, the
main environment plus the `beam` extra) or this interpreter when it has
Beam; the test is skipped, naming why, when neither has it."""

import glob
import importlib.util
import os
import subprocess
import sys

import pytest

from support.processes import ENV, ROOT
from support.serving_model import export_tiny_model

# Another Python environment (.venv-beam) and Beam's worker processes: the
# end-to-end tier (docs/testing.md#tiers).
pytestmark = pytest.mark.e2e


def beam_python():
    if importlib.util.find_spec("apache_beam") is not None:
        return sys.executable
    candidate = os.environ.get("KT_BEAM_PYTHON")
    if candidate and subprocess.run([candidate, "-c", "import apache_beam"],
                                    capture_output=True).returncode == 0:
        return candidate
    pytest.skip("Apache Beam is not installed (the `beam` extra; scripts/venv_beam.sh "
                "sets KT_BEAM_PYTHON)")


def test_two_files_on_two_workers_equal_kt_translate(tmp_path):
    python = beam_python()
    from keras_transformer.cli import translate

    exported = os.path.dirname(export_tiny_model(tmp_path / "models"))
    inputs = tmp_path / "in"
    inputs.mkdir()
    words = "the dog sees a cat near the red house".split()
    (inputs / "short.txt").write_text("the dog sees a cat\n\na red house\n")
    (inputs / "long.txt").write_text("".join(
        " ".join(words[i % 9:i % 9 + 1 + i % 6]) + "\n" for i in range(23)))
    out = tmp_path / "out"
    done = subprocess.run(
        [python, "-m", "keras_transformer.beam", "--saved-model", exported,
         "--input", str(inputs / "*.txt"), "--output-dir", str(out), "--shard-lines", "10",
         "--max-batch-size", "8", "--runner", "DirectRunner", "--direct_num_workers", "2",
         "--direct_running_mode", "multi_processing"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(os.listdir(out)) == [
        "long.txt-00000-of-00003", "long.txt-00001-of-00003", "long.txt-00002-of-00003",
        "short.txt-00000-of-00001"]
    for name, lines in (("short.txt", 3), ("long.txt", 23)):
        shards = sorted(glob.glob(str(out / f"{name}-*")))
        joined = b"".join(open(shard, "rb").read() for shard in shards)
        expected = tmp_path / f"{name}.kt"
        translate.translate(["--saved-model", exported, "--input", str(inputs / name),
                             "--output", str(expected), "--quiet"], collect=False)
        assert joined == expected.read_bytes(), name
        assert joined.count(b"\n") == lines
        assert [open(s, "rb").read().count(b"\n") for s in shards] == \
            [min(10, lines - 10 * i) for i in range(len(shards))]
