"""Step checkpoints that resume exactly, and checkpoint averaging (of the
last K training checkpoints or of the best K validated ones, see
`selection.py`).

A checkpoint is `tf.train.Checkpoint(model=..., optimizer=...)`: the model's
weights, the optimizer's slots and its iteration counter, so a restored run
continues the learning-rate schedule at the step it reached. Checkpoints are
numbered by the optimizer step (updates, not micro-batches).

`average_checkpoints` is the averaging itself; it takes a `RunDirectory` for
where the checkpoints are and where the average goes, and `RunDirectory`
calls it for the `best:K` and `last:K` selectors (so this module does not
import `run_directory`).
"""

import glob
import json
import os
import re
import shutil
import signal
import tempfile
import threading

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.files import honour_umask, replace_directory, write_atomically
from keras_transformer.run_directory import checkpoint_step
from keras_transformer.training.strategy import is_chief, worker_id
from keras_transformer.transformer import Transformer


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


# What a preempted machine (spot VM, Kubernetes eviction) and Ctrl-C send.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves every `every_steps` optimizer updates and at the end of training,
    and stops training with a checkpoint on one of `stop_signals`.

    With `stop_signals` (e.g. `STOP_SIGNALS`), `fit` installs handlers for
    them as it begins, when it runs in the main thread (the only one that
    may; elsewhere it installs none). A handler only notes the signal and
    puts back the handlers that were there before, so a second signal gets
    the old behaviour (by default SIGTERM ends the process and SIGINT raises
    `KeyboardInterrupt`). At the next update boundary (the first batch end
    at which the optimizer step has moved) the callback saves through the
    writer and sets `model.stop_training`: `fit` returns, nothing trained is
    lost, and a rerun resumes exactly. The earlier handlers are back when
    `fit` ends (if `fit` raises instead, call `restore_signal_handlers`).

    Args:
        writer: a `CheckpointWriter`.
        every_steps: checkpoint interval in updates (0: only at the end).
        stop_signals: signal numbers to stop on (empty: none handled).

    Attributes: `stopped_by`, the name of the signal that stopped training
    (e.g. "SIGTERM"), else None; `stopped_at`, the checkpoint it saved.
    """

    def __init__(self, writer, every_steps, stop_signals=()):
        super().__init__()
        if every_steps < 0:
            raise ValueError(f"`every_steps` must be >= 0, received {every_steps}.")
        self.writer = writer
        self.every_steps = every_steps
        self.stop_signals = tuple(stop_signals)
        self.last_saved = None
        self.last_step = None
        self.received = None
        self.stopped_by = None
        self.stopped_at = None
        self._previous_handlers = {}

    def on_train_begin(self, logs=None):
        self.last_saved = self.last_step = optimizer_step(self.writer.optimizer)
        self.received = self.stopped_by = self.stopped_at = None
        if self.stop_signals and threading.current_thread() is threading.main_thread():
            for number in self.stop_signals:
                self._previous_handlers[number] = signal.signal(number, self._note_signal)

    def _note_signal(self, number, frame):
        self.received = number
        self.restore_signal_handlers()

    def restore_signal_handlers(self):
        """Puts back the handlers `fit` found (a no-op when none are ours)."""
        while self._previous_handlers:
            number, handler = self._previous_handlers.popitem()
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(number, signal.SIG_DFL if handler is None else handler)

    def _save(self):
        step = optimizer_step(self.writer.optimizer)
        if step != self.last_saved:
            path = self.writer.save()
            self.last_saved = step
            if path and self.writer.chief:
                print(f"\nSaved checkpoint {path}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.writer.optimizer)
        if self.every_steps and step % self.every_steps == 0:
            self._save()
        moved, self.last_step = step != self.last_step, step
        if self.received is not None and moved and self.stopped_by is None:
            self._save()
            self.model.stop_training = True
            self.stopped_by = signal.Signals(self.received).name
            self.stopped_at = self.writer.manager.latest_checkpoint
            print(f"\nStopping at step {step} on {self.stopped_by}, with the checkpoint "
                  f"{self.stopped_at}: run again to resume.", flush=True)

    def on_train_end(self, logs=None):
        self._save()
        self.restore_signal_handlers()


def averaged_if_asked(run, selector):
    """`selector` for `RunDirectory.resolve_checkpoint` and `load_model`,
    after the averaging a `best:K` or `last:K` selector asks for: those
    average the best / last K checkpoints now into `averaged/` (replacing
    what is there; `average_checkpoints`) and become "averaged". Other
    selectors come back unchanged. The run directory only says where
    checkpoints are; what writes one is here.

    Raises ValueError for K < 1."""
    match = re.fullmatch(r"(best|last):(\d+)", selector or "")
    if not match:
        return selector
    count = int(match.group(2))
    if count < 1:
        raise ValueError(f"--checkpoint {selector}: K must be >= 1.")
    average_checkpoints(run, count, source=match.group(1))
    return "averaged"


def average_checkpoints(run_dir, num_checkpoints, checkpoints=None, allow_fewer=False,
                        source="last"):
    """Averages the weights of `num_checkpoints` checkpoints of a run (paper
    6.1: the last 5 for base, 20 for big) and writes the result to
    `run_dir/averaged/ckpt-<newest averaged step>` (model only, no
    optimizer), with `averaged/sources.json`.

    Args:
        run_dir: the run's `keras_transformer.run_directory.RunDirectory`
            (for a path, pass `RunDirectory(path)`).
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
    with later training checkpoints to tell a stale average.

    The new `averaged/` is built whole under a temporary name in the run
    directory (`.tmp-averaged-*`, which readers ignore and the next
    averaging removes) and swapped in by rename (`files.replace_directory`),
    so a crash or an error leaves the previous `averaged/` as it was, never a
    mix of the two or a checkpoint that `sources.json` does not describe.

    Returns: `(output prefix, averaged prefixes)`. Floating-point weights are
    averaged in float64 and cast back; integer variables (e.g. dropout seed
    state) are taken from the last prefix.

    Raises: TypeError for a path instead of a `RunDirectory`; ValueError for
    a bad `source` or `num_checkpoints`, or fewer kept checkpoints than asked
    for without `allow_fewer`; FileNotFoundError when there is nothing to
    average.
    """
    if isinstance(run_dir, (str, bytes, os.PathLike)):
        raise TypeError(
            f"average_checkpoints takes a RunDirectory, received the path {run_dir!r}: "
            f"pass keras_transformer.run_directory.RunDirectory({run_dir!r})."
        )
    run = run_dir
    checkpoints, chosen, best = _choose_checkpoints(run, num_checkpoints, checkpoints,
                                                    allow_fewer, source)
    model = Transformer(run.load_config())
    model.build()
    holder = tf.train.Checkpoint(model=model)
    _assign_mean(model, holder, checkpoints)
    temporary = f".tmp-{os.path.basename(run.averaged_dir)}-"
    # Left by a process killed while averaging.
    for stale in glob.glob(os.path.join(glob.escape(run.path), temporary + "*")):
        shutil.rmtree(stale, ignore_errors=True)
    building = tempfile.mkdtemp(prefix=temporary, dir=run.path)
    try:
        honour_umask(building)  # mkdtemp's 0700 would hide averaged/ from other users
        # The manager's `checkpoint` file names the checkpoint relative to its
        # directory, so it stays right after the rename.
        manager = tf.train.CheckpointManager(holder, building, max_to_keep=1,
                                             checkpoint_name="ckpt")
        saved = manager.save(checkpoint_number=checkpoint_step(checkpoints[-1]))
        output = os.path.join(run.averaged_dir, os.path.basename(saved))
        record = _sources_record(run, output, chosen, checkpoints, best)
        write_atomically(os.path.join(building, os.path.basename(run.averaged_sources_path)),
                         (json.dumps(record, indent=2) + "\n").encode("utf-8"))
        replace_directory(building, run.averaged_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return output, checkpoints


def _choose_checkpoints(run, num_checkpoints, checkpoints, allow_fewer, source):
    """`average_checkpoints`'s inputs: `(absolute prefixes, chosen, best)`,
    `best` the run's best-checkpoint list when `source` is "best" (else None)."""
    if source not in ("last", "best"):
        raise ValueError(f"`source` must be 'last' or 'best', received {source!r}.")
    best = None
    if checkpoints is not None:
        chosen = "explicit"
        if not checkpoints:
            raise ValueError("No checkpoints named to average: give at least one prefix.")
    else:
        chosen = source
        if source == "last":
            available = [p for p, _ in run.training_checkpoints()]
            where, flag = run.checkpoint_dir, "--keep-checkpoints"
        else:
            best = run.best_checkpoints()
            available = [p for p, _, _ in best]
            where, flag = run.best_dir, "--keep-best"
        if not available:
            if source == "last":
                raise FileNotFoundError(f"No checkpoints in {run.checkpoint_dir} to average.")
            raise FileNotFoundError(
                f"No best checkpoints in {run.best_dir} to average (best/index.json is "
                "missing or lists none): train with --keep-best K and a --valid-split.")
        if num_checkpoints < 1:
            raise ValueError(f"`num_checkpoints` must be >= 1, received {num_checkpoints}.")
        if num_checkpoints > len(available) and not allow_fewer:
            raise ValueError(
                f"Asked to average {num_checkpoints} checkpoints but {where} "
                f"keeps only {len(available)}: {[os.path.basename(p) for p in available]}. "
                f"Train with a larger {flag} or average fewer."
            )
        if source == "last":
            checkpoints = available[-num_checkpoints:]  # all of them when fewer are kept
        else:
            checkpoints = sorted(available[:num_checkpoints], key=checkpoint_step)
    checkpoints = [p if os.path.isabs(p) else os.path.join(run.checkpoint_dir, p)
                   for p in checkpoints]
    return checkpoints, chosen, best


def _assign_mean(model, holder, checkpoints):
    """Sets `model`'s weights to the mean over `checkpoints` (restored through
    `holder`), summed in float64; integer variables keep the last one's."""
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


def _sources_record(run, output, chosen, checkpoints, best):
    """The contents of `averaged/sources.json` (see `average_checkpoints`)."""
    latest = run.latest_training_checkpoint()
    entries = []
    for prefix in checkpoints:
        entry = {"prefix": run.display(prefix), "step": checkpoint_step(prefix)}
        if best is not None:
            rank = [os.path.abspath(p) for p, _, _ in best].index(os.path.abspath(prefix))
            entry.update(value=best[rank][2], rank=rank + 1)
        entries.append(entry)
    record = {
        "output": os.path.basename(output),
        "chosen": chosen,
        "num": len(checkpoints),
        "sources": entries,
        "newest_training_step": latest[1] if latest else None,
    }
    if best is not None:
        record["metric"] = best.metric
    return record
