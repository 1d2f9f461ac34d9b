"""Step checkpoints that resume exactly, and checkpoint averaging (of the
last K training checkpoints or of the best K validated ones, see
`selection.py`).

A checkpoint is `tf.train.Checkpoint(model=..., optimizer=...)`: the model's
weights, the optimizer's slots and its iteration counter, so a restored run
continues the learning-rate schedule at the step it reached. Checkpoints are
numbered by the optimizer step (updates, not micro-batches).
"""

import os
import shutil

import keras
import tensorflow as tf

from keras_transformer.run_directory import RunDirectory
from keras_transformer.training.strategy import is_chief, worker_id


def optimizer_step(optimizer):
    """The number of applied updates (micro-batches // accumulation steps)."""
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def build_for_restore(model, optimizer):
    """Creates every variable (model weights, optimizer slots) so that a
    restore fills them now rather than lazily, and restores exactly."""
    if not model.built:
        model.build()
    if not optimizer.built:
        optimizer.build(model.trainable_variables)


class CheckpointWriter:
    """A `tf.train.CheckpointManager` over `checkpoint_dir`, multi-worker safe.

    Every worker must call `save` (variables may need collectives); only the
    chief's copy lands in `checkpoint_dir`, the others write to a temporary
    directory that is removed straight away.

    Args:
        model, optimizer: what is saved.
        checkpoint_dir: e.g. `RunDirectory.checkpoint_dir`.
        max_to_keep: keep the last K checkpoints.
        strategy: the training strategy (None: single worker).
    """

    def __init__(self, model, optimizer, checkpoint_dir, max_to_keep=5, strategy=None):
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self.optimizer = optimizer
        self.chief = strategy is None or is_chief(strategy)
        directory = checkpoint_dir
        if not self.chief:
            directory = os.path.join(checkpoint_dir, f".worker-{worker_id(strategy)}-tmp")
        self.directory = directory
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, directory, max_to_keep=max_to_keep, checkpoint_name="ckpt"
        )
        # Read the chief's directory when resuming, whoever we are.
        self.read_manager = tf.train.CheckpointManager(
            self.checkpoint, checkpoint_dir, max_to_keep=max_to_keep, checkpoint_name="ckpt"
        ) if not self.chief else self.manager

    def restore_latest(self):
        """Restores the latest checkpoint; returns its path or None."""
        latest = self.read_manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        return latest

    def save(self):
        """Saves at the current optimizer step; returns the path (chief)."""
        step = optimizer_step(self.optimizer)
        path = self.manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self.directory, ignore_errors=True)
        return path


class StepCheckpoint(keras.callbacks.Callback):
    """Saves every `every_steps` optimizer updates and at the end of training.

    Args:
        writer: a `CheckpointWriter`.
        every_steps: checkpoint interval in updates (0: only at the end).
    """

    def __init__(self, writer, every_steps):
        super().__init__()
        if every_steps < 0:
            raise ValueError(f"`every_steps` must be >= 0, received {every_steps}.")
        self.writer = writer
        self.every_steps = every_steps
        self.last_saved = None

    def on_train_begin(self, logs=None):
        self.last_saved = optimizer_step(self.writer.optimizer)

    def _save(self):
        step = optimizer_step(self.writer.optimizer)
        if step != self.last_saved:
            path = self.writer.save()
            self.last_saved = step
            if path and self.writer.chief:
                print(f"\nSaved checkpoint {path}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if self.every_steps:
            step = optimizer_step(self.writer.optimizer)
            if step % self.every_steps == 0:
                self._save()

    def on_train_end(self, logs=None):
        self._save()


def average_checkpoints(run_dir, num_checkpoints, checkpoints=None, allow_fewer=False,
                        source="last"):
    """Averages the weights of `num_checkpoints` checkpoints of a run (paper
    6.1: the last 5 for base, 20 for big) and writes the result to
    `run_dir/averaged/ckpt-<newest averaged step>` (model only, no
    optimizer), then `averaged/sources.json`.

    Args:
        run_dir: a run directory (path or `RunDirectory`).
        num_checkpoints: how many checkpoints to average.
        checkpoints: explicit checkpoint prefixes instead (newest last;
            relative ones are under `checkpoints/`).
        allow_fewer: when the run keeps fewer than `num_checkpoints`, average
            all it keeps instead of raising (a wall-time budget on a slow
            machine may save fewer than planned).
        source: "last" (the newest training checkpoints) or "best" (the best
            by the validation metric, from `best/`, averaged oldest first).

    `sources.json` holds `output` (the averaged checkpoint's name), `chosen`
    ("last", "best" or "explicit"), `num`, `sources` (`prefix` relative to the
    run directory when inside it, `step`; for "best" also `value` and `rank`),
    `metric` (for "best") and `newest_training_step` (the newest training
    checkpoint when averaging, None without one): `RunDirectory` compares it
    with later training checkpoints to tell a stale average. The old
    `sources.json` is removed before the new checkpoint is written, so a crash
    in between leaves an average with no record (treated as unknown), never a
    wrong record.

    Returns: `(output prefix, averaged prefixes)`. Floating-point weights are
    averaged in float64 and cast back; integer variables (e.g. dropout seed
    state) are taken from the last prefix.
    """
    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
    return run.average_checkpoints(num_checkpoints, checkpoints, allow_fewer=allow_fewer,
                                   source=source)
