"""Nothing on disk is lost or misread: atomic writes survive a failure
mid-write, a UTF-8 byte-order mark is not read as text, a missing best/
index never deletes a checkpoint, and a second training process on a run
directory stops at once, as does kt-average while one trains."""

import contextlib
import os
import subprocess
import sys

import pytest

import keras_transformer as kt
from keras_transformer import files
from keras_transformer.cli.common import read_lines
from keras_transformer.data import sources
from keras_transformer.run_directory import RunDirectory
from keras_transformer.training.selection import BestCheckpoints
from support.processes import ENV, ROOT

BOM = "\ufeff"


def test_an_atomic_write_that_fails_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    files.write_atomically(str(path), b"old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomically(str(path), b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["config.json"]  # no temporary file left


def test_atomic_path_renames_on_success_and_cleans_up_on_error(tmp_path):
    import re

    import keras_transformer.files

    example = re.search(r"```python\n(.*?)```", keras_transformer.files.atomic_path.__doc__,
                        re.S).group(1)
    exec(textwrap_dedent(example), {})  # the docstring's Example runs
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="midway"):
        with files.atomic_path(str(path)) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("midway")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def textwrap_dedent(text):
    import textwrap

    return textwrap.dedent(text)


def test_a_byte_order_mark_is_not_text(tmp_path):
    (tmp_path / "a.en").write_text(BOM + "a dog\na cat\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("ein Hund\neine Katze\n", encoding="utf-8")
    (tmp_path / "a.tsv").write_text(BOM + "a dog\tein Hund\n", encoding="utf-8")
    pairs = sources.pairs_from_paths(source=str(tmp_path / "a.en"),
                                     target=str(tmp_path / "a.de"))
    assert [s.decode() for s, _ in pairs.as_numpy_iterator()] == ["a dog", "a cat"]
    tsv = sources.pairs_from_paths(tsv=str(tmp_path / "a.tsv"))
    assert [(s.decode(), t.decode()) for s, t in tsv.as_numpy_iterator()] == [
        ("a dog", "ein Hund")]
    assert read_lines(str(tmp_path / "a.en")) == [b"a dog", b"a cat"]


def test_a_missing_best_index_deletes_nothing(tmp_path):
    run = RunDirectory(str(tmp_path / "run"))
    os.makedirs(run.best_dir)
    kept = [os.path.join(run.best_dir, name) for name in ("ckpt-5.index",
                                                           "ckpt-5.data-00000-of-00001")]
    for path in kept:
        open(path, "wb").close()
    model = kt.Transformer(kt.get_config("tiny", vocab_size=40))
    with pytest.raises(ValueError, match=r"holds 1 checkpoint\(s\) but no index\.json.*"
                                         r"nothing was deleted"):
        BestCheckpoints(model, run, metric="loss", keep=2)
    assert all(os.path.exists(path) for path in kept)


@contextlib.contextmanager
def lock_held_elsewhere(run_dir):
    """A second process that holds `run_dir`'s lock until the block ends;
    yields its `Popen`."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from keras_transformer.run_directory import RunDirectory; "
         f"RunDirectory({run_dir!r}).lock(); print('locked', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_second_training_process_on_a_run_directory_stops(tmp_path):
    run_dir = str(tmp_path / "run")
    with lock_held_elsewhere(run_dir) as holder:
        with pytest.raises(ValueError, match=rf"run is in use by another training process "
                                             rf"\(pid {holder.pid}\)"):
            RunDirectory(run_dir).lock()
        out = subprocess.run(
            [sys.executable, os.path.join(ROOT, "training", "train.py"), "--run-dir", run_dir,
             "--data", "builtin", "--src-lang", "en", "--tgt-lang", "synth"],
            capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
        assert out.returncode == 2, out.stderr[-2000:]
        assert f"in use by another training process (pid {holder.pid})" in out.stderr
    RunDirectory(run_dir).lock()  # free again once the holder ended


def test_kt_average_waits_for_training_to_end(tmp_path, capsys):
    from keras_transformer.cli import average

    run_dir = str(tmp_path / "run")
    with lock_held_elsewhere(run_dir) as holder:
        assert average.main(["--run-dir", run_dir]) == 2
        assert capsys.readouterr().err == (
            f"error: {run_dir} is in use by another training process (pid {holder.pid}), "
            f"which holds {run_dir}/.lock: wait for it to end before averaging.\n")
    assert not os.path.exists(os.path.join(run_dir, "averaged"))
    # Free again: on to the averaging, which finds nothing to average here.
    assert average.main(["--run-dir", run_dir]) == 2
    assert "No checkpoints in" in capsys.readouterr().err
    assert not os.path.exists(str(tmp_path / "missing"))
    assert average.main(["--run-dir", str(tmp_path / "missing")]) == 2
    assert not os.path.exists(str(tmp_path / "missing"))  # not created by the lock
