"""The run directory: everything a training run leaves behind, enough to
resume, evaluate, translate or export later. TensorFlow-only module.

Layout::

    <run_dir>/
        config.json          TransformerConfig (ids filled from the tokenizer)
        vocab.model          SentencePiece model proto (shared vocabulary)
        train_args.json      the command-line arguments of the run (optional)
        checkpoints/         tf.train.CheckpointManager: ckpt-<step>.*, `checkpoint`
        averaged/            checkpoint averaging output: ckpt-<step>.*, `checkpoint`
        logs/                TensorBoard

Checkpoints are `tf.train.Checkpoint(model=..., optimizer=...)` objects keyed
by the optimizer step; TensorFlow writes their data files first and the
`checkpoint` index last through a rename, so a `kill -9` mid-save leaves the
previous checkpoint as the latest. Every other file here is written with
`write_atomically`.
"""

import json
import os

import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.tokenizer import SubwordTokenizer, write_atomically
from keras_transformer.transformer import Transformer

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.model"
ARGS_FILE = "train_args.json"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
LOGS = "logs"


class RunDirectory:
    """Paths and readers/writers of one run directory."""

    def __init__(self, path):
        self.path = os.path.abspath(path)

    def __repr__(self):
        return f"RunDirectory({self.path!r})"

    def file(self, name):
        return os.path.join(self.path, name)

    @property
    def checkpoint_dir(self):
        return self.file(CHECKPOINTS)

    @property
    def averaged_dir(self):
        return self.file(AVERAGED)

    @property
    def log_dir(self):
        return self.file(LOGS)

    def exists(self):
        return os.path.exists(self.file(CONFIG_FILE)) and os.path.exists(self.file(VOCAB_FILE))

    # Config, vocabulary, arguments -----------------------------------------

    def save_config(self, config):
        write_atomically(self.file(CONFIG_FILE), config.to_json().encode("utf-8"))

    def load_config(self):
        self._require(CONFIG_FILE)
        with open(self.file(CONFIG_FILE), encoding="utf-8") as f:
            return TransformerConfig.from_json(f.read())

    def save_tokenizer(self, tokenizer):
        tokenizer.save(self.file(VOCAB_FILE))

    def load_tokenizer(self):
        self._require(VOCAB_FILE)
        return SubwordTokenizer.from_file(self.file(VOCAB_FILE))

    def save_args(self, args):
        write_atomically(
            self.file(ARGS_FILE), json.dumps(args, indent=2, sort_keys=True).encode("utf-8")
        )

    def load_args(self):
        if not os.path.exists(self.file(ARGS_FILE)):
            return {}
        with open(self.file(ARGS_FILE), encoding="utf-8") as f:
            return json.load(f)

    # Checkpoints -----------------------------------------------------------

    def latest_checkpoint(self, prefer_averaged=True):
        """The averaged checkpoint if there is one (and `prefer_averaged`),
        else the latest training checkpoint, else None."""
        candidates = [self.averaged_dir, self.checkpoint_dir]
        if not prefer_averaged:
            candidates = candidates[1:]
        for directory in candidates:
            if os.path.isdir(directory):
                latest = tf.train.latest_checkpoint(directory)
                if latest:
                    return latest
        return None

    def load_model(self, checkpoint=None, config=None):
        """Builds the model from `config.json` and restores its weights.

        Args:
            checkpoint: a checkpoint prefix (`.../ckpt-1200`); default
                `latest_checkpoint()`.
            config: overrides `config.json` (e.g. to change dropout).

        Returns: a built `Transformer`.
        """
        config = config or self.load_config()
        checkpoint = checkpoint or self.latest_checkpoint()
        if checkpoint is None:
            raise FileNotFoundError(
                f"No checkpoint in {self.checkpoint_dir} or {self.averaged_dir}; "
                "train first (training/train.py) or pass a checkpoint prefix."
            )
        model = Transformer(config)
        model.build()
        # expect_partial: optimizer slots in the checkpoint are not needed here.
        tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
        return model

    def _require(self, name):
        if not os.path.exists(self.file(name)):
            raise FileNotFoundError(
                f"{self.file(name)} not found: {self.path} is not a run directory "
                f"(expected {CONFIG_FILE} and {VOCAB_FILE}, written by training/train.py)."
            )
