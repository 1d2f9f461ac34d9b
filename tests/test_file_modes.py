"""What the package writes through temporary names gets the mode the umask
gives a new file or directory (0644 / 0755 under umask 022), so TF Serving
under another uid can load an export and a teammate can read a run
directory; a stricter umask is kept."""

import os
import stat

import pytest

import keras_transformer as kt
from keras_transformer.files import current_umask, write_atomically
from keras_transformer.run_directory import RunDirectory


@pytest.fixture
def umask():
    previous = []

    def set_umask(mask):
        previous.append(os.umask(mask))

    yield set_umask
    if previous:
        os.umask(previous[0])


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def assert_tree_modes(root, mask):
    assert mode(root) == 0o777 & ~mask, root
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            assert mode(os.path.join(directory, name)) == 0o777 & ~mask, name
        for name in files:
            assert mode(os.path.join(directory, name)) == 0o666 & ~mask, name


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_writes_take_the_umask_s_mode(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    write_atomically(str(tmp_path / "file"), b"x")
    assert mode(tmp_path / "file") == 0o666 & ~mask


def test_exports_and_run_files_are_readable_by_others_under_umask_022(tmp_path, umask):
    umask(0o022)
    tok = kt.SubwordTokenizer.train([f"a fish {i} swims" for i in range(100)], vocab_size=400)
    config = kt.get_config("tiny", tokenizer=tok)
    model = kt.Transformer(config)
    model.build()
    run = RunDirectory(str(tmp_path / "run"))
    run.save_tokenizers(tok)
    run.save_config(config)
    assert_tree_modes(str(tmp_path / "run"), 0o022)
    export = kt.export_saved_model(kt.Translator(model, tok), tmp_path / "sm" / "fish")
    assert_tree_modes(export, 0o022)
    pytest.importorskip("ctranslate2", reason="ctranslate2 (the ctranslate2 extra) is absent")
    from keras_transformer.export.ctranslate2 import export_ctranslate2

    exported = export_ctranslate2(model, tok, tok, str(tmp_path / "ct2"))
    assert_tree_modes(exported, 0o022)
