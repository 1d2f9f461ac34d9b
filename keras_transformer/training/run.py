"""`TrainingRun`: a run directory that `model.fit` trains into and resumes
from exactly, from a user's script as from `kt-train`.

Exact resume restores four things from the latest checkpoint: the model's
weights, the optimizer (slots and step, so the schedule continues), the
dropout layers' random streams (Keras `SeedGenerator` states, which are not
weights) and the data position (the micro-batches taken from the training
stream, so a rebuilt pipeline skips them: `skip_batches`).
"""

import hashlib

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.run_directory import RunDirectory
from keras_transformer.training import callbacks as cb
from keras_transformer.training.checkpoints import (
    STOP_SIGNALS,
    CheckpointWriter,
    StepCheckpoint,
    build_for_restore,
    optimizer_step,
)
from keras_transformer.training.moving_average import (
    ValidateMovingAverage,
    moving_average_optimizer,
)
from keras_transformer.training.selection import BestCheckpoints, ValidationBleu
from keras_transformer.training.strategy import is_chief, one_worker, replicas_per_worker


def weights_digest(model):
    """sha256 over every weight's bytes: equal digests, equal models.

    Example:

    ```python
    import keras_transformer as kt

    model = kt.Transformer(kt.get_config("tiny", vocab_size=40))
    model.build()
    assert len(kt.weights_digest(model)) == 64
    ```
    """
    h = hashlib.sha256()
    for v in model.weights:
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


class DataPosition:
    """How many micro-batches the run has taken from its training stream,
    as a variable saved in every checkpoint, so a resumed run skips exactly
    those batches of the same stream (same seed) and goes on with the
    batches an uninterrupted run would have seen."""

    def __init__(self):
        with tf.device("/CPU:0"):
            self.variable = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="data_position")

    def value(self):
        return int(self.variable.numpy())

    def callback(self, batches_per_call):
        variable = self.variable

        class Count(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                variable.assign_add(batches_per_call)

        return Count()


def _translate_fn(translator):
    """`list of str -> list of str` from a callable or an engine whose
    `translate` returns `(translations, scores)`."""
    if hasattr(translator, "translate"):
        return lambda sentences: translator.translate(sentences)[0]
    return translator


class TrainingRun:
    """A run directory for `model.fit`: step checkpoints that resume exactly,
    the best validated checkpoints, validation BLEU and early stopping.

    Create it after `model.compile` (under `strategy.scope()` when training
    with a `tf.distribute` strategy, and after `keras.utils.set_random_seed`);
    it builds the model and optimizer and restores the latest checkpoint of
    `run_dir/checkpoints/` when there is one. Then build the training
    pipeline with `skip_batches=run.skip_batches`, and call `model.fit` with
    `initial_epoch=run.initial_epoch(steps_per_epoch)` and
    `callbacks=run.callbacks(...)`: a killed script rerun the same way ends
    with the weights of an uninterrupted run. SIGTERM or SIGINT (a preempted
    machine, Ctrl-C) during `fit` saves a checkpoint at the next update and
    stops `fit`, which returns (`interrupted` names the signal); a second
    one gets the handler of before (`StepCheckpoint`).

    One process at a time trains in a run directory: another one gets a
    `ValueError` naming it (`RunDirectory.lock`).

    With `tokenizer`, a new run directory also gets the model's config and
    the vocabulary, so the kt-* commands (kt-translate, kt-export,
    kt-average, kt-evaluate) take it as they take a kt-train run; an existing
    one must hold the same config.

    Args:
        run_dir: the run directory (created when missing).
        model: a compiled `Transformer`.
        tokenizer: the (source) `SubwordTokenizer`, or None.
        target_tokenizer: the target side's, with separate vocabularies.
        keep_checkpoints: keep the last K training checkpoints.
        strategy: the `tf.distribute` strategy (None: the current one).

    Attributes: `run` (a `RunDirectory`), `restored` (the checkpoint
    restored, or None), `step` (the optimizer step reached),
    `data_position` (micro-batches already taken), `skip_batches` (what this
    worker's pipeline skips), `selection` (the `BestCheckpoints`, once made),
    `interrupted` (the signal that stopped the last `fit`, or None).

    Example:

    ```python
    import tempfile

    import keras
    import keras_transformer as kt

    def compiled_model():
        model = kt.Transformer(kt.get_config("tiny", vocab_size=40))
        model.compile(optimizer=kt.transformer_adam(64),
                      loss=kt.LabelSmoothedCrossEntropy(pad_id=0))
        return model

    keras.utils.set_random_seed(1)
    model = compiled_model()
    run = kt.TrainingRun(tempfile.mkdtemp(), model)
    assert run.restored is None and run.step == 0 and run.skip_batches == 0
    ids = keras.random.randint((8, 6), 4, 40, seed=1)
    model.fit((ids, ids), ids, batch_size=4, epochs=1, verbose=0,
              callbacks=run.callbacks(checkpoint_every=1))
    again = kt.TrainingRun(run.run.path, compiled_model())  # a rerun resumes
    assert again.step == 2 and again.data_position == 2
    ```
    """

    def __init__(self, run_dir, model, tokenizer=None, target_tokenizer=None,
                 keep_checkpoints=20, strategy=None):
        if getattr(model, "optimizer", None) is None:
            raise ValueError("TrainingRun needs a compiled model (call model.compile first).")
        self.strategy = strategy or tf.distribute.get_strategy()
        self.chief = is_chief(self.strategy)
        # Outside any strategy scope, one pipeline feeds one device.
        self._replicas_per_worker = replicas_per_worker(self.strategy)
        self.run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
        if self.chief:
            self.run.lock()  # a second process on the directory stops here
        self.model = model
        if tokenizer is not None:
            self._write_run_files(tokenizer, target_tokenizer)
        self.position = DataPosition()
        optimizer = model.optimizer
        build_for_restore(model, optimizer)
        self.writer = CheckpointWriter(model, optimizer, self.run.checkpoint_dir,
                                       max_to_keep=keep_checkpoints, strategy=self.strategy)
        self.writer.checkpoint.data_position = self.position.variable
        # Dropout's random streams (SeedGenerator states), which are not
        # weights: restored, a resumed run draws the masks it would have.
        weights = {id(v) for v in model.weights}
        self.writer.checkpoint.random_states = [v for v in model.variables
                                                if id(v) not in weights]
        self.restored = self.writer.restore_latest()
        self.selection = None
        self.step_checkpoint = None

    def _write_run_files(self, tokenizer, target_tokenizer):
        config = self.model.config
        if self.run.exists():
            was, now = self.run.load_config().to_dict(), config.to_dict()
            if was != now:
                differ = {k: (v, now.get(k)) for k, v in was.items() if now.get(k) != v}
                raise ValueError(f"{self.run.path} holds a model with other settings: "
                                 f"{differ} (was, now); use a new run directory.")
            return
        if not self.chief:
            return
        shared = target_tokenizer is None or target_tokenizer is tokenizer
        for side, t in (("source", tokenizer), ("target", target_tokenizer or tokenizer)):
            size = config.vocab_size if side == "source" or shared else config.target_vocab_size
            if t.vocab_size != size:
                raise ValueError(f"The {side} tokenizer has {t.vocab_size} ids but the model's "
                                 f"config says {size}; build the config with "
                                 "kt.get_config(..., tokenizer=...).")
        self.run.save_tokenizers(tokenizer, None if shared else target_tokenizer)
        self.run.save_config(config)  # last: `run.exists()` means complete.

    @property
    def interrupted(self):
        """The name of the signal ("SIGTERM", "SIGINT") that stopped the
        last `fit` with a checkpoint, or None."""
        return self.step_checkpoint.stopped_by if self.step_checkpoint is not None else None

    @property
    def step(self):
        """The optimizer step (updates applied)."""
        return optimizer_step(self.model.optimizer)

    @property
    def data_position(self):
        """Micro-batches taken from the training stream so far."""
        return self.position.value()

    @property
    def skip_batches(self):
        """Batches this worker's pipeline skips to continue the stream: one
        per replica of this worker per micro-batch taken."""
        return self.data_position * self._replicas_per_worker

    def initial_epoch(self, steps_per_epoch):
        """`model.fit`'s `initial_epoch` at the step reached."""
        return self.step // steps_per_epoch

    def best_checkpoints(self, metric="bleu", keep=3, patience=None):
        """Makes (once) the `BestCheckpoints` that `callbacks` includes: the
        best `keep` validated checkpoints in `run_dir/best/` by `metric`
        ("bleu" or "loss"), stopping after `patience` validations without a
        new best."""
        if self.selection is None:
            self.selection = BestCheckpoints(self.model, self.run, metric=metric,
                                             keep=max(keep, 1), patience=patience,
                                             strategy=self.strategy)
        return self.selection

    def callbacks(self, train_steps=None, checkpoint_every=1000, max_minutes=None,
                  log_every=100, length_filter=None, steps_per_execution=1,
                  translator=None, bleu_sources=None, bleu_references=None,
                  keep_best=0, best_metric=None, patience=None, stop_on_signals=True):
        """The callbacks for `model.fit`, in the order they must run.

        Args:
            train_steps: stop at this optimizer step (None: when `fit` ends).
            checkpoint_every: save every this many updates (0: at the end only).
            max_minutes: also stop after this much wall time, with a checkpoint.
            log_every: TensorBoard interval in updates (`run_dir/logs/`).
            length_filter: the training pipeline's `LengthFilter`, logged.
            steps_per_execution: as given to `model.compile`.
            translator: a `Translator` (or any `list of str -> list of str`)
                for validation BLEU on `bleu_sources` against
                `bleu_references` at the end of every epoch.
            keep_best: keep the best K validated checkpoints (0: none).
            best_metric: "bleu" (default with a translator) or "loss".
            patience: stop after this many validations without a new best.
            stop_on_signals: on SIGTERM or SIGINT, save at the next update
                and stop `fit` (`StepCheckpoint`); not across several
                workers, which would have to save at one step together.

        With an optimizer made with `use_ema=True`, validation, validation
        BLEU and the best checkpoints see its moving average of the weights
        (`ValidateMovingAverage`, first and last in the list); callbacks
        added after the list see the training weights.

        Returns: a list of `keras.callbacks.Callback`.
        """
        log_dir = self.run.log_dir if self.chief else None
        signals = STOP_SIGNALS if stop_on_signals and one_worker(self.strategy) else ()
        self.step_checkpoint = StepCheckpoint(self.writer, checkpoint_every, signals)
        callbacks = [
            # Counted before the checkpoint callback saves it.
            self.position.callback(steps_per_execution),
            *([cb.StopAtStep(train_steps)] if train_steps else []),
            *([cb.StopAfterTime(max_minutes * 60)] if max_minutes else []),
            self.step_checkpoint,
            cb.TrainingLogger(log_dir, log_every, length_filter),
        ]
        if translator is not None:
            callbacks.append(ValidationBleu(_translate_fn(translator), bleu_sources,
                                            bleu_references, log_dir=log_dir))
        if self.selection is None and (keep_best or patience):
            self.best_checkpoints(best_metric or ("bleu" if translator else "loss"),
                                  keep_best, patience)
        if self.selection is not None:
            callbacks.append(self.selection)
        if moving_average_optimizer(self.model.optimizer) is not None:
            average = ValidateMovingAverage(self.model.optimizer)
            callbacks = [average, *callbacks, average.restore]
        return callbacks
