"""training/fast_malloc.py: scripts re-execute themselves with glibc malloc
settings before TensorFlow loads (see its docstring for the measurement)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = f"""
import sys
sys.path.insert(0, {os.path.join(ROOT, "training")!r})
import fast_malloc
fast_malloc.apply()
import json, os
print(json.dumps({{name: os.environ.get(name) for name in fast_malloc.SETTINGS}}))
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def probe(tmp_path, **env):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k != "KT_FAST_MALLOC"}
    out = subprocess.run([sys.executable, "-u", str(script)], capture_output=True, text=True,
                         env={**base, **env}, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_script_runs_again_with_the_settings(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "training"))
    try:
        import fast_malloc
    finally:
        sys.path.pop(0)
    assert probe(tmp_path) == fast_malloc.SETTINGS


def test_values_already_set_win_and_it_can_be_turned_off(tmp_path):
    assert probe(tmp_path, MALLOC_ARENA_MAX="4")["MALLOC_ARENA_MAX"] == "4"
    assert set(probe(tmp_path, KT_FAST_MALLOC="0").values()) == {None}


def test_every_entry_point_applies_it_before_importing_tensorflow():
    scripts = ["training/train.py", "training/demo.py", "training/evaluate.py",
               "training/translate.py", "training/benchmark.py",
               "training/benchmark_translation.py", "benchmarks/benchmark.py"]
    for path in scripts:
        text = open(os.path.join(ROOT, path)).read()
        assert "fast_malloc.apply()" in text, path
        first_tf = min(i for i in (text.find("import tensorflow"), text.find("from keras"),
                                   text.find("import keras"), text.find("from keras_transformer"))
                       if i >= 0)
        assert text.index("fast_malloc.apply()") < first_tf, path
