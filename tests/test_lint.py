"""The package passes `ruff check` with the configuration in pyproject.toml
(pycodestyle, pyflakes, import order, bugbear)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ruff():
    """The ruff beside this Python (the `test` extra installs it), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "ruff")
    return beside if os.path.exists(beside) else shutil.which("ruff")


def test_ruff_check_passes_on_the_package():
    if ruff() is None:
        pytest.skip("ruff is not installed (pip install '.[test]' installs it)")
    out = subprocess.run([ruff(), "check", "--no-cache", "keras_transformer", "examples"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]


def test_ruff_finds_what_it_is_configured_to_find(tmp_path):
    if ruff() is None:
        pytest.skip("ruff is not installed (pip install '.[test]' installs it)")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    out = subprocess.run([ruff(), "check", "--no-cache", "--config",
                          os.path.join(ROOT, "pyproject.toml"), str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "F401" in out.stdout
