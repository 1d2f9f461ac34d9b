"""`pip install` of this package, not editable, into a fresh virtualenv, then
the console commands run from a directory outside the checkout: train a tiny
model, average, export and translate.

Nothing is downloaded: the wheel is built with this environment's setuptools
(no build isolation) from a copy of the package's files, installed without
its dependencies, and the new environment sees this one's packages (TensorFlow
and the rest) through a .pth file that lists their site-packages."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig

from support.processes import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["Ein Mann fährt mit dem Fahrrad.", "", "the dog sees a cat"]
# TensorFlow's start-up lines, which the commands hide unless asked.
START_UP_NOISE = ("failed call to cuInit", "Could not find cuda drivers",
                  "oneDNN custom operations are on", "oneDNN supports DT_INT64",
                  "absl::InitializeLog()", "cpu_feature_guard")


def run(command, **kwargs):
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert out.returncode == 0, f"{command}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def install(tmp_path):
    """Returns the new virtualenv's directory."""
    source = tmp_path / "source"
    source.mkdir()
    shutil.copytree(os.path.join(ROOT, "keras_transformer"), source / "keras_transformer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--wheel-dir", str(wheels), str(source)])
    (wheel,) = wheels.iterdir()
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
         "--no-index", str(wheel)])
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # After the install, so that pip saw an empty environment.
    with open(os.path.join(purelib.stdout.strip(), "dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_installed_commands_train_export_and_translate(tmp_path):
    venv = install(tmp_path)
    bin_dir = str(venv / "bin")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "KT_VERBOSE")}
    env.update(PATH=bin_dir + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=str(venv))

    def command(*args, **kwargs):
        out = run(list(args), cwd=work, env=env, **kwargs)
        for noise in START_UP_NOISE:
            assert noise not in out.stderr, f"{args[0]}: {out.stderr[-3000:]}"
        return out

    # A library import is TensorFlow's as usual (only the commands quiet it).
    where = run([os.path.join(bin_dir, "python"), "-c",
                 "import keras_transformer; print(keras_transformer.__file__)"], cwd=work, env=env)
    installed = os.path.realpath(where.stdout.strip())
    assert installed.startswith(os.path.realpath(venv) + os.sep), installed
    assert not installed.startswith(os.path.realpath(ROOT) + os.sep)
    for name in ("kt-train", "kt-evaluate", "kt-translate", "kt-export", "kt-average",
                 "kt-visualize", "kt-demo"):
        with open(os.path.join(bin_dir, name)) as f:
            assert f.readline().strip() == "#!" + os.path.join(bin_dir, "python"), name

    write_corpus(str(work))  # train.{en,de}, val.{en,de} in the current directory
    out = command("kt-train", "--run-dir", "run", "--data", "text:.", "--src-lang", "en",
                  "--tgt-lang", "de", "--config", "tiny", "--vocab-size", "400",
                  "--train-steps", "4", "--steps-per-epoch", "2", "--checkpoint-every", "0",
                  "--warmup-steps", "4", "--batch-tokens", "256", "--max-length", "32",
                  "--shuffle-buffer", "50", "--valid-split", "", "--bleu-sentences", "0",
                  "--verbose", "2")
    assert re.search(r"Training finished at step 4; weights sha256 [0-9a-f]{64};", out.stdout)
    assert os.path.isfile(work / "run" / "checkpoints" / "ckpt-4.index")

    out = command("kt-average", "--run-dir", "run", "--num", "1")
    assert out.stdout.startswith("Averaged 1 checkpoints (ckpt-4) into ")

    out = command("kt-export", "--run-dir", "run", "--name", "tiny", "--output-dir", "models",
                  "--beam-size", "2", "--extra-length", "3")
    assert os.path.realpath(out.stdout.strip()) == os.path.realpath(work / "models" / "tiny" / "1")
    assert os.path.isfile(work / "models" / "tiny" / "1" / "saved_model.pb")

    out = command("kt-translate", "--saved-model", "models/tiny", "--scores",
                  input="\n".join(SOURCES) + "\n")
    lines = out.stdout.split("\n")
    assert len(lines) == len(SOURCES) + 1 and lines[-1] == ""
    assert lines[1] == "0.0000\t"  # an empty line translates to an empty line
    assert all(re.fullmatch(r"-?\d+\.\d{4}\t.*", line) for line in lines[:-1])
