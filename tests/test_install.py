"""`pip install` of this package, not editable, into a fresh virtualenv, then
the console commands run from a directory outside the checkout (train a tiny
model, average, export and translate), and so does every program of
examples/ that imports the package, and the README's library program, with
the installed package.

Nothing is downloaded: the wheel is built with this environment's setuptools
(no build isolation) from a copy of the package's files, installed without
its dependencies, and the new environment sees this one's packages (TensorFlow
and the rest) through a .pth file that lists their site-packages."""

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from support.processes import kill_after_checkpoint, write_corpus

# A pip install and the commands and examples it brings, each in its own
# process: the end-to-end tier (docs/testing.md#tiers).
pytestmark = pytest.mark.e2e

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


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return install(tmp_path_factory.mktemp("install"))


def installed_env(venv):
    """The environment of a user's shell with the virtualenv activated."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "KT_VERBOSE")}
    env.update(PATH=str(venv / "bin") + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=str(venv))
    return env


def test_installed_commands_train_export_and_translate(venv, tmp_path):
    bin_dir = str(venv / "bin")
    work = tmp_path / "work"
    work.mkdir()
    env = installed_env(venv)

    def command(*args, **kwargs):
        out = run(list(args), cwd=work, env=env, **kwargs)
        for noise in START_UP_NOISE:
            assert noise not in out.stderr, f"{args[0]}: {out.stderr[-3000:]}"
        return out

    # Where the package resolves from, without importing it (TensorFlow):
    # the commands below import it.
    probe = "import importlib.util; print(importlib.util.find_spec('keras_transformer').origin)"
    where = run([os.path.join(bin_dir, "python"), "-c", probe], cwd=work, env=env)
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
                  "--verbose", "2", "--set", "num_layers=1")
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


EXAMPLES = os.path.join(ROOT, "examples")
DIGEST = re.compile(r"weights sha256 ([0-9a-f]{64})")


def write_tsv_corpus(directory, train=200, valid=20):
    """`train.tsv` and `dev.tsv` of the built-in generated corpus."""
    from keras_transformer.data.synthetic import generate_corpus

    corpus = generate_corpus(seed=0, num_train=train, num_val=valid, num_test=1)
    for split, name in (("train", "train.tsv"), ("val", "dev.tsv")):
        sources, targets = corpus[split]
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{t}\n" for s, t in zip(sources, targets))


def test_examples_run_with_the_installed_package(venv, tmp_path):
    """examples/train_with_fit.py, killed after a checkpoint and rerun, ends
    with the weights of an uninterrupted run; its export has every signature
    and, served by kt-serve, translates through
    examples/tf_serving/rest_client.py; examples/encoder_classifier.py learns
    its task."""
    env = {**installed_env(venv), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    python = str(venv / "bin" / "python")
    script = [python, os.path.join(EXAMPLES, "train_with_fit.py"), "--train", "train.tsv",
              "--valid", "dev.tsv", "--vocab-size", "400", "--steps", "8",
              "--steps-per-epoch", "4", "--checkpoint-every", "2", "--batch-tokens", "256"]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    for work in (killed, whole):
        work.mkdir()
        write_tsv_corpus(str(work))
    # One after the other, as a user would run them.
    out = run(script, cwd=whole, env=env).stdout
    assert "Starting at step 0 (a new run)" in out
    first = subprocess.Popen(script, cwd=killed, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    kill_after_checkpoint(first, str(killed / "runs" / "fit" / "checkpoints"), 2, timeout=300)
    resumed = run(script, cwd=killed, env=env)
    start = re.search(r"Starting at step (\d+) \((\S+)\)", resumed.stdout)
    assert start and 2 <= int(start.group(1)) < 8, resumed.stdout[-3000:]
    assert start.group(2).endswith(f"ckpt-{start.group(1)}")
    vocabulary = os.path.join("runs", "fit", "vocab.model")
    assert (killed / vocabulary).read_bytes() == (whole / vocabulary).read_bytes()
    # On a mismatch, both logs (losses per epoch, where it resumed) say
    # where the runs parted.
    assert DIGEST.search(resumed.stdout).group(1) == DIGEST.search(out).group(1), (
        f"uninterrupted:\n{out[-2500:]}\nresumed:\n{resumed.stdout[-2500:]}")
    export = killed / "saved_models" / "fit" / "1"
    assert (export / "saved_model.pb").is_file()
    assert "Trained to step 8;" in resumed.stdout

    # The export has every signature. examples/saved_model_predict.py, which
    # calls them, uses TensorFlow only (not this package): it runs in
    # tests/test_examples_serving.py.
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((export / "saved_model.pb").read_bytes())
    assert set(saved.meta_graphs[0].signature_def) >= {
        "serving_default", "translate_with_options", "translate_xla", "translate_nbest",
        "translate_sample", "translate_explain", "translate_ids"}

    server = subprocess.Popen(
        [str(venv / "bin" / "kt-serve"), "--model-name", "fit", "--model-base-path",
         str(export.parent), "--rest-api-port", "0"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = re.search(r"at (http://\S+)", server.stdout.readline())
        assert ready, "kt-serve did not start"
        served = run([python, os.path.join(EXAMPLES, "tf_serving", "rest_client.py"),
                      "--url", ready.group(1), "--model", "fit", "the dog sees a cat"],
                     cwd=tmp_path, env=env)
        assert "'the dog sees a cat' -> " in served.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)

    learned = run([python, os.path.join(EXAMPLES, "encoder_classifier.py"), "--steps", "300"],
                  cwd=tmp_path, env=env)
    before, after = map(float, re.search(
        r"held-out accuracy: ([0-9.]+) before training, ([0-9.]+) after",
        learned.stdout).groups())
    assert after >= 0.9 and after > before + 0.2


def readme_program():
    """The Python block of the README's "Use it as a library" section."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Use it as a library", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_library_program_runs_with_the_installed_package(venv, tmp_path):
    code = readme_program()
    names = "PRESET, VOCAB_SIZE, STEPS, STEPS_PER_EPOCH, BATCH_TOKENS = "
    sizes = names + '"small", 8000, 20_000, 1000, 4096'
    assert sizes in code  # the slice below replaces exactly this line
    code = code.replace(sizes, names + '"tiny", 400, 4, 2, 256')
    ast.parse(code)
    names = {node.attr for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and node.value.id == "kt"}
    import keras_transformer as kt

    assert names <= set(kt.__all__), names - set(kt.__all__)  # public names only
    write_tsv_corpus(str(tmp_path))
    (tmp_path / "program.py").write_text(code)
    env = {**installed_env(venv), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    out = run([str(venv / "bin" / "python"), "program.py"], cwd=tmp_path, env=env)
    assert out.stdout.strip().endswith(os.path.join("saved_models", "mine", "1"))
    assert (tmp_path / "saved_models" / "mine" / "1" / "saved_model.pb").is_file()
    assert (tmp_path / "runs" / "mine" / "checkpoints" / "ckpt-4.index").is_file()
