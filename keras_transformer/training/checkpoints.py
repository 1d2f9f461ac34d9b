"""Step checkpoints that resume exactly, and checkpoint averaging.

A checkpoint is `tf.train.Checkpoint(model=..., optimizer=...)`: the model's
weights, the optimizer's slots and its iteration counter, so a restored run
continues the learning-rate schedule at the step it reached. Checkpoints are
numbered by the optimizer step (updates, not micro-batches).
"""

import os
import shutil

import keras
import numpy as np
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


def average_checkpoints(run_dir, num_checkpoints, checkpoints=None, allow_fewer=False):
    """Averages the weights of the last `num_checkpoints` checkpoints of a
    run (paper 6.1: the last 5 for base, 20 for big) and writes the result to
    `run_dir/averaged/ckpt-<last step>` (model only, no optimizer).

    Args:
        run_dir: a run directory (path or `RunDirectory`).
        num_checkpoints: how many of the newest checkpoints to average.
        checkpoints: explicit checkpoint prefixes instead (newest last).
        allow_fewer: when the run keeps fewer than `num_checkpoints`, average
            all it keeps instead of raising (a wall-time budget on a slow
            machine may save fewer than planned).

    Returns: `(output prefix, averaged prefixes)`. Floating-point weights are
    averaged in float64 and cast back; integer variables (e.g. dropout seed
    state) are taken from the newest checkpoint.
    """
    from keras_transformer.transformer import Transformer

    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
    if checkpoints is None:
        state = tf.train.get_checkpoint_state(run.checkpoint_dir)
        available = list(state.all_model_checkpoint_paths) if state else []
        if not available:
            raise FileNotFoundError(f"No checkpoints in {run.checkpoint_dir} to average.")
        if num_checkpoints < 1:
            raise ValueError(f"`num_checkpoints` must be >= 1, received {num_checkpoints}.")
        if num_checkpoints > len(available) and not allow_fewer:
            raise ValueError(
                f"Asked to average {num_checkpoints} checkpoints but {run.checkpoint_dir} "
                f"keeps only {len(available)}: {[os.path.basename(p) for p in available]}. "
                "Train with a larger --keep-checkpoints or average fewer."
            )
        checkpoints = available[-num_checkpoints:]  # all of them when fewer are kept
    checkpoints = [p if os.path.isabs(p) else os.path.join(run.checkpoint_dir, p)
                   for p in checkpoints]
    model = Transformer(run.load_config())
    model.build()
    holder = tf.train.Checkpoint(model=model)
    sums = None
    for prefix in checkpoints:
        holder.restore(prefix).expect_partial().assert_existing_objects_matched()
        values = [np.asarray(keras.ops.convert_to_numpy(v)) for v in model.weights]
        if sums is None:
            sums = [v.astype(np.float64) if np.issubdtype(v.dtype, np.floating) else v
                    for v in values]
        else:
            sums = [s + v if np.issubdtype(v.dtype, np.floating) else v
                    for s, v in zip(sums, values)]
    for variable, total in zip(model.weights, sums):
        if np.issubdtype(total.dtype, np.floating):
            total = total / len(checkpoints)
        variable.assign(total.astype(variable.dtype))
    step = int(os.path.basename(checkpoints[-1]).rsplit("-", 1)[-1])
    manager = tf.train.CheckpointManager(holder, run.averaged_dir, max_to_keep=1,
                                         checkpoint_name="ckpt")
    return manager.save(checkpoint_number=step), checkpoints
