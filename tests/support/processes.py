"""For tests that run the project's commands in fresh processes: the
repository root, their environment, and a small parallel corpus to train on."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The CPU only, TensorFlow's info and warning lines off.
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def write_corpus(directory, n=120):
    """Writes `train.{en,de}` (`n` sentences) and `val.{en,de}` (16) into
    `directory`: a few words in a fixed pattern, the German side the English
    reversed character by character."""
    words = "the a dog cat man woman sees likes big small red house boat".split()
    rows = [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(3 + i % 6))
            for i in range(n)]
    for split, part in (("train", rows), ("val", rows[:16])):
        for lang, text in (("en", part), ("de", [r[::-1] for r in part])):
            with open(os.path.join(directory, f"{split}.{lang}"), "w") as f:
                f.write("\n".join(text) + "\n")


def signal_after_checkpoint(process, checkpoint_dir, min_step, number, timeout=240):
    """Sends signal `number` to `process` (a `Popen` training into
    `checkpoint_dir`) as soon as the directory's latest complete checkpoint
    (the one its `checkpoint` state file names, written last) is of step
    `min_step` or later, and waits for the process to end. Fails the test if
    it ended by itself first (nothing was interrupted)."""
    import time

    import tensorflow as tf

    deadline = time.time() + timeout
    try:
        reached = False
        while time.time() < deadline and process.poll() is None and not reached:
            latest = (tf.train.latest_checkpoint(checkpoint_dir)
                      if os.path.isdir(checkpoint_dir) else None)
            reached = bool(latest) and int(latest.rsplit("-", 1)[1]) >= min_step
            if not reached:
                time.sleep(0.05)
        assert process.poll() is None, "the run ended before it could be signalled"
        assert reached, f"no checkpoint of step {min_step} or later within {timeout} s"
        process.send_signal(number)
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()


def kill_after_checkpoint(process, checkpoint_dir, min_step, timeout=240):
    """`signal_after_checkpoint` with SIGKILL, which the process must die of."""
    import signal

    signal_after_checkpoint(process, checkpoint_dir, min_step, signal.SIGKILL, timeout)
    assert process.returncode == -signal.SIGKILL
