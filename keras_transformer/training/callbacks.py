"""Training callbacks: stop at a step or after a time, TensorBoard scalars
and throughput, and a per-update learning-rate schedule wrapper (validation
BLEU and checkpoint selection: `training/selection.py`)."""

import time

import keras
import tensorflow as tf

from keras_transformer.training.checkpoints import optimizer_step


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Sum):
    """Number of real (non-padding) target tokens seen, summed over replicas.

    Inputs: `y_true (batch, tgt_len)` ids; `y_pred` is ignored.
    """

    def __init__(self, pad_id=0, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred=None, sample_weight=None):
        real = keras.ops.cast(keras.ops.not_equal(y_true, self.pad_id), "float32")
        return super().update_state(keras.ops.sum(real))

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class PerUpdateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Evaluates `schedule` at the update count under gradient accumulation.

    Keras optimizers call the schedule with their micro-batch counter, which
    runs `accumulation_steps` times faster than the updates; the paper's
    schedule is per update.
    """

    def __init__(self, schedule, accumulation_steps):
        if isinstance(schedule, dict):
            schedule = keras.saving.deserialize_keras_object(schedule)
        self.schedule = schedule
        self.accumulation_steps = accumulation_steps

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.accumulation_steps))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "accumulation_steps": self.accumulation_steps}


class StopAtStep(keras.callbacks.Callback):
    """Stops `fit` once the optimizer has applied `train_steps` updates."""

    def __init__(self, train_steps):
        super().__init__()
        self.train_steps = train_steps

    def on_train_batch_end(self, batch, logs=None):
        if optimizer_step(self.model.optimizer) >= self.train_steps:
            self.model.stop_training = True


class StopAfterTime(keras.callbacks.Callback):
    """Stops `fit` once `seconds` of wall time have passed since training
    began (checked after each update, so the last one finishes). The
    checkpoint callback then saves at `on_train_end`."""

    def __init__(self, seconds, clock=time.monotonic):
        super().__init__()
        if seconds <= 0:
            raise ValueError(f"`seconds` must be positive, received {seconds}.")
        self.seconds = seconds
        self.clock = clock
        self.started = None
        self.stopped_at_step = None

    def on_train_begin(self, logs=None):
        self.started = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        if self.stopped_at_step is None and self.clock() - self.started >= self.seconds:
            self.model.stop_training = True
            self.stopped_at_step = optimizer_step(self.model.optimizer)
            print(f"\nStopping after {self.seconds / 60:.1f} minutes of training "
                  f"(--max-minutes) at step {self.stopped_at_step}.", flush=True)


class TrainingLogger(keras.callbacks.Callback):
    """Writes TensorBoard scalars keyed by the optimizer step (so a resumed
    run continues its curves): training loss, learning rate, target tokens/s
    every `every_steps` updates; validation metrics at each epoch end; and,
    when a `LengthFilter` is given, the pairs kept and dropped for length.

    Args:
        log_dir: TensorBoard directory (None: print only).
        every_steps: logging interval in updates.
        length_filter: the training pipeline's `LengthFilter`, or None.
        tokens_metric: name of the `TargetTokens` metric in the logs.
    """

    def __init__(self, log_dir, every_steps=100, length_filter=None,
                 tokens_metric="target_tokens"):
        super().__init__()
        self.writer = tf.summary.create_file_writer(log_dir) if log_dir else None
        self.every_steps = max(1, every_steps)
        self.length_filter = length_filter
        self.tokens_metric = tokens_metric
        self.last_step = None
        self.last_time = None
        self.last_tokens = 0.0
        self.tokens_per_second = None

    def _scalars(self, values, step):
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)
        self.writer.flush()

    def on_epoch_begin(self, epoch, logs=None):
        self.last_tokens = 0.0  # Keras resets metrics every epoch.
        self.last_time = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        step = optimizer_step(self.model.optimizer)
        if self.last_step is None:
            self.last_step = step
        if step - self.last_step < self.every_steps:
            return
        now = time.perf_counter()
        tokens = float(logs.get(self.tokens_metric, 0.0))
        values = {}
        if now > self.last_time and tokens >= self.last_tokens:
            self.tokens_per_second = (tokens - self.last_tokens) / (now - self.last_time)
            values["train/target_tokens_per_second"] = self.tokens_per_second
        self.last_step, self.last_time, self.last_tokens = step, now, tokens
        for name in ("loss", "accuracy"):
            if name in logs:
                values[f"train/{name}"] = float(logs[name])
        values["train/learning_rate"] = float(
            keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        if self.length_filter is not None:
            counts = self.length_filter.counts()
            values["data/pairs_kept"] = counts["kept"]
            values["data/pairs_dropped_too_long"] = counts["dropped"]
        self._scalars(values, step)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = optimizer_step(self.model.optimizer)
        values = {f"validation/{k[4:]}": float(v) for k, v in logs.items()
                  if k.startswith("val_") and k != f"val_{self.tokens_metric}"}
        self._scalars(values, step)
        if self.length_filter is not None:
            counts = self.length_filter.counts()
            total = counts["kept"] + counts["dropped"]
            print(f"\nStep {step}: dropped {counts['dropped']} of {total} training pairs read "
                  "so far for exceeding --max-length.", flush=True)
