"""kt-train (keras_transformer/cli/train.py, run here as its script form
training/train.py) end to end: kill -9 after a checkpoint, rerun, resume;
SIGTERM saves, exits 0 and resumes."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from support.processes import (
    ENV,
    ROOT,
    kill_after_checkpoint,
    signal_after_checkpoint,
    write_corpus,
)


def test_help_is_usable():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "training", "train.py"), "--help"],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0
    assert out.stdout.startswith("usage: kt-train ")
    for flag in ("--strategy", "--precision", "--accumulation-steps", "--checkpoint-every",
                 "--batch-tokens", "--data", "examples:", "--tf-verbose", "--system-malloc"):
        assert flag in out.stdout


def assert_same_checkpoints(resumed_prefix, straight_prefix):
    """Every value saved in the two checkpoints (weights, Adam's moments,
    step, dropout seeds, data position) is the same, floats up to float32
    rounding."""
    resumed = tf.train.load_checkpoint(resumed_prefix)
    straight = tf.train.load_checkpoint(straight_prefix)
    names = [n for n, _ in tf.train.list_variables(straight_prefix)
             if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert len(names) > 50 and "data_position/.ATTRIBUTES/VARIABLE_VALUE" in names
    largest = 0.0
    for name in names:
        a, b = resumed.get_tensor(name), straight.get_tensor(name)
        if a.dtype.kind == "f":
            largest = max(largest, float(np.abs(a - b).max()))
            # Same operations on the same machine: equal up to float32
            # rounding (a few ulps of the weights' scale).
            bound = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(b).max()))
            assert np.abs(a - b).max() <= bound, (name, np.abs(a - b).max())
        else:
            assert (a == b).all(), name
    print(f"resumed vs uninterrupted, largest difference of any saved value: {largest!r}")


def tiny_training(tmp_path, *flags):
    """The kt-train command line of a `tiny` model on `write_corpus`'s
    corpus (written under `tmp_path`), without validation, with `flags`;
    `--run-dir` is `tmp_path/run`."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    write_corpus(str(data))
    return [sys.executable, os.path.join(ROOT, "training", "train.py"),
            "--run-dir", str(tmp_path / "run"), "--data", f"text:{data}", "--src-lang", "en",
            "--tgt-lang", "de", "--config", "tiny", "--vocab-size", "400",
            "--batch-tokens", "128", "--max-length", "64", "--shuffle-buffer", "50",
            "--valid-split", "", *flags]


@pytest.mark.e2e
def test_resumes_after_sigkill_at_the_step_reached(tmp_path, capsys):
    run = tmp_path / "run"
    command = tiny_training(tmp_path, "--train-steps", "60", "--steps-per-epoch", "30",
                            "--checkpoint-every", "3", "--keep-checkpoints", "3",
                            "--warmup-steps", "50", "--verbose", "2")
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=ENV, cwd=ROOT)
    kill_after_checkpoint(first, str(run / "checkpoints"), 6)
    latest = tf.train.latest_checkpoint(str(run / "checkpoints"))
    reached = int(latest.rsplit("-", 1)[1])
    assert 6 <= reached < 60
    vocab = (run / "vocab.model").read_bytes()

    second = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=ROOT,
                            timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    match = re.search(r"Resumed from (\S+) at step (\d+); learning rate (\S+)", second.stdout)
    assert match, second.stdout[-3000:]
    assert match.group(1) == latest and int(match.group(2)) == reached
    assert f"Skipping the {reached} micro-batches already trained on" in second.stdout
    schedule = kt.TransformerSchedule(64, warmup_steps=50)
    assert abs(float(match.group(3)) - float(schedule(reached))) <= 1e-6 * float(schedule(reached))
    assert "Training finished at step 60;" in second.stdout
    assert tf.train.latest_checkpoint(str(run / "checkpoints")).endswith("ckpt-60")
    assert (run / "vocab.model").read_bytes() == vocab  # not retrained
    assert "Training a" not in second.stdout
    leftovers = [n for n in os.listdir(run) if n.startswith(".tmp")]
    assert not leftovers

    # Exact resume: the killed-and-resumed run ends with the weights of an
    # uninterrupted run (same batches, same dropout draws, same updates).
    whole = tmp_path / "whole"
    uninterrupted = [str(whole) if part == str(run) else part for part in command]
    third = subprocess.run(uninterrupted, capture_output=True, text=True, env=ENV, cwd=ROOT,
                           timeout=300)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert_same_checkpoints(str(run / "checkpoints" / "ckpt-60"),
                            str(whole / "checkpoints" / "ckpt-60"))

    # A different corpus or model on the same run directory is refused
    # (in this process: the refusal comes before any training).
    from keras_transformer.cli import train as trainer

    changed = command[:command.index("--config") + 1] + ["small"] + command[command.index("--config") + 2:]
    capsys.readouterr()
    assert trainer.main(changed[2:]) == 2
    assert "'config': ('tiny', 'small')" in capsys.readouterr().err


@pytest.mark.slow  # three kt-train processes; tests/test_training_run.py covers the stop
def test_sigterm_saves_at_the_next_update_exits_0_and_resumes_exactly(tmp_path):
    # A preempted machine (spot VM, Kubernetes eviction) gets SIGTERM.
    run = tmp_path / "run"
    command = tiny_training(tmp_path, "--train-steps", "24", "--steps-per-epoch", "24",
                            "--checkpoint-every", "2", "--warmup-steps", "20",
                            "--input-autotune", "off", "--verbose", "0")
    # The uninterrupted run alongside, on the other core.
    whole = tmp_path / "whole"
    straight = subprocess.Popen([str(whole) if part == str(run) else part for part in command],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=ENV, cwd=ROOT)
    try:
        first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=ENV, cwd=ROOT)
        signal_after_checkpoint(first, str(run / "checkpoints"), 2, signal.SIGTERM,
                                timeout=600)
        out = first.stdout.read()
        assert first.returncode == 0, out[-3000:]
        match = re.search(r"Stopping at step (\d+) on SIGTERM, with the checkpoint (\S+):",
                          out)
        assert match, out[-3000:]
        reached = int(match.group(1))
        assert 2 <= reached < 24
        latest = tf.train.latest_checkpoint(str(run / "checkpoints"))
        assert latest == match.group(2) and latest.endswith(f"ckpt-{reached}")
        assert f"Training stopped by SIGTERM at step {reached};" in out

        second = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=ROOT,
                                timeout=300)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert f"Resumed from {latest} at step {reached};" in second.stdout
        assert straight.wait(timeout=300) == 0, straight.stdout.read()[-3000:]
    finally:
        if straight.poll() is None:
            straight.kill()
    assert_same_checkpoints(str(run / "checkpoints" / "ckpt-24"),
                            str(whole / "checkpoints" / "ckpt-24"))


def test_max_minutes_stops_fit_after_the_time_budget():
    import numpy as np

    from keras_transformer.training.callbacks import StopAfterTime

    ticks = iter(range(0, 10_000, 10))  # every look at the clock: 10 more seconds
    stop = StopAfterTime(25, clock=lambda: next(ticks))
    config = kt.get_config("tiny", vocab_size=30, dropout=0.0)
    model = kt.Transformer(config)
    model.compile(optimizer="adam", loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=0))
    ids = np.random.default_rng(0).integers(3, 30, size=(16, 6)).astype("int32")
    model.fit((ids, ids), ids, batch_size=4, epochs=5, verbose=0, callbacks=[stop])
    # begin at 0 s; updates end at 10, 20, 30 s: the third reaches 25 s.
    assert int(model.optimizer.iterations.numpy()) == 3
    assert stop.stopped_at_step == 3


def test_max_minutes_and_jit_compile_are_validated():
    from keras_transformer.cli import train as trainer

    base = ["--run-dir", "r", "--data", "builtin", "--src-lang", "en", "--tgt-lang", "synth"]
    for extra, message in ((["--max-minutes", "0"], "--max-minutes must be positive"),
                           (["--max-minutes", "5", "--strategy", "multi_worker_mirrored"],
                            "workers could stop at different steps"),
                           (["--jit-compile", "--strategy", "mirrored"],
                            "--jit-compile needs one device")):
        args = trainer.build_parser().parse_args(base + extra)
        try:
            trainer.training_config(args).validate()
        except ValueError as e:
            assert message in str(e)
        else:
            raise AssertionError(f"{extra} was accepted")


def test_jit_compile_trains_with_xla_on_one_shape_per_bucket(tmp_path, monkeypatch):
    import numpy as np

    from keras_transformer.cli import train as trainer

    from support.common import record_token_batches

    data = tmp_path / "data"
    data.mkdir()
    write_corpus(str(data))
    calls = record_token_batches(monkeypatch)
    args = trainer.build_parser().parse_args([
        "--run-dir", str(tmp_path / "run"), "--data", f"text:{data}", "--src-lang", "en",
        "--tgt-lang", "de", "--config", "tiny", "--vocab-size", "400", "--train-steps", "2",
        "--steps-per-epoch", "2", "--checkpoint-every", "0", "--warmup-steps", "4",
        "--batch-tokens", "256", "--max-length", "10", "--shuffle-buffer", "50",
        "--valid-split", "val", "--bleu-sentences", "0", "--verbose", "0", "--jit-compile"])
    model = trainer.train(args)
    assert model.jit_compile is True  # Keras's default under a strategy is False
    # Training and validation batches: one shape per bucket.
    assert [c.get("fixed_shapes") for c in calls] == [True, True]
    assert int(model.optimizer.iterations.numpy()) == 2
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_input_autotune_off_reaches_the_training_stream(tmp_path, monkeypatch):
    # Stops once the training stream is asked for: kt-demo trains a whole
    # run with autotuning off (tests/test_demo.py).
    from keras_transformer.cli import train as trainer

    from support.common import record_token_batches

    class Built(Exception):
        pass

    data = tmp_path / "data"
    data.mkdir()
    write_corpus(str(data))
    calls = record_token_batches(monkeypatch, stop=Built)
    common = ["--data", f"text:{data}", "--src-lang", "en", "--tgt-lang", "de", "--config",
              "tiny", "--vocab-size", "400", "--train-steps", "1", "--steps-per-epoch", "1",
              "--checkpoint-every", "0", "--warmup-steps", "4", "--batch-tokens", "256",
              "--max-length", "10", "--valid-split", "", "--verbose", "0"]
    for run, extra, expected in (("on", [], True), ("off", ["--input-autotune", "off"], False)):
        calls.clear()
        args = trainer.build_parser().parse_args(["--run-dir", str(tmp_path / run), *common,
                                                  *extra])
        with pytest.raises(Built):
            trainer.train(args)
        assert [c.get("autotune") for c in calls] == [expected]
