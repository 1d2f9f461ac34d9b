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
