"""Choosing the checkpoint to ship while training runs: validation BLEU, the
best K validated checkpoints in `RUN_DIR/best/`, and early stopping.

Both callbacks act at `on_epoch_end`, right after Keras has validated
(`logs["val_loss"]`). Put `ValidationBleu` before `BestCheckpoints` in the
callback list: Keras hands every callback the same `logs` dict, and
`ValidationBleu` adds `val_bleu` to it.

`best/` layout::

    best/
        ckpt-<step>.index, ckpt-<step>.data-*   tf.train.Checkpoint(model=model)
        index.json

`index.json`::

    {"metric": "bleu" | "loss", "keep": K,
     "history": [{"step": 1000, "loss": 2.31, "bleu": 17.4}, ...],   # every validation
     "best": [{"name": "ckpt-3000", "step": 3000, "value": 37.2}, ...]}  # best first

A checkpoint's files are written before the index that lists it, and a
checkpoint dropping out of the best K is deleted after the index that no
longer lists it, so after a crash the index lists only complete checkpoints;
files it does not list are ignored (and removed by the next run's chief).
"""

import glob
import json
import os
import re
import shutil

import keras
import tensorflow as tf

from keras_transformer.files import write_atomically
from keras_transformer.run_directory import (
    BEST_INDEX_FILE,
    RunDirectory,
    format_metric,
    metric_label,
)
from keras_transformer.training.checkpoints import optimizer_step
from keras_transformer.training.strategy import is_chief, worker_id

METRICS = ("bleu", "loss")
_LOG_KEYS = {"bleu": "val_bleu", "loss": "val_loss"}


class ValidationBleu(keras.callbacks.Callback):
    """Corpus BLEU (sacreBLEU) of the model on held-out sentences at every
    validation.

    At `on_epoch_end` it translates `sources` with `translate_fn`, stores the
    score in `logs["val_bleu"]` (the dict later callbacks receive), writes it
    to TensorBoard as `validation/bleu` when `log_dir` is given, and prints
    `Step N: validation BLEU x (n sentences)`.

    Args:
        translate_fn: `translate_fn(list of source str) -> list of str`, e.g.
            beam search over the model being trained.
        sources, references: aligned lists of `str`.
        log_dir: TensorBoard directory, or None.

    Attributes:
        history: `[(step, bleu)]`, one per validation of this process.
    """

    def __init__(self, translate_fn, sources, references, log_dir=None):
        super().__init__()
        if len(sources) != len(references):
            raise ValueError(
                f"{len(sources)} sources but {len(references)} references; they must align."
            )
        if not sources:
            raise ValueError("ValidationBleu needs at least one sentence (--bleu-sentences).")
        self.translate_fn = translate_fn
        self.sources = list(sources)
        self.references = list(references)
        self.writer = tf.summary.create_file_writer(log_dir) if log_dir else None
        self.history = []

    def evaluate(self):
        """Translates `sources` and returns corpus BLEU against `references`."""
        import sacrebleu

        hypotheses = list(self.translate_fn(self.sources))
        if len(hypotheses) != len(self.sources):
            raise ValueError(
                f"`translate_fn` returned {len(hypotheses)} translations for "
                f"{len(self.sources)} sources."
            )
        return float(sacrebleu.corpus_bleu(hypotheses, [self.references]).score)

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model.optimizer)
        bleu = self.evaluate()
        if logs is not None:
            logs["val_bleu"] = bleu
        self.history.append((step, bleu))
        print(f"\nStep {step}: validation BLEU {bleu:.2f} ({len(self.sources)} sentences)",
              flush=True)
        if self.writer is not None:
            with self.writer.as_default(step=step):
                tf.summary.scalar("validation/bleu", bleu)
            self.writer.flush()


def _better(metric, a, b):
    """True when value `a` is strictly better than `b` under `metric`."""
    return a > b if metric == "bleu" else a < b


def _rank_key(metric):
    # Best first; among equal values the earlier step first.
    if metric == "bleu":
        return lambda entry: (-entry["value"], entry["step"])
    return lambda entry: (entry["value"], entry["step"])


def validations_without_improvement(history, metric):
    """How many validations in a row at the end of `history` (a list of
    `{"step", metric: value}`, in the order they ran) did not improve on the
    best value before them."""
    best = None
    since = 0
    for entry in history:
        value = entry.get(metric)
        if value is None:
            continue
        if best is None or _better(metric, value, best):
            best, since = value, 0
        else:
            since += 1
    return since


class BestCheckpoints(keras.callbacks.Callback):
    """Keeps the best `keep` validated checkpoints in `run.best_dir` and
    optionally stops training early.

    At each `on_epoch_end` it reads `logs["val_bleu"]` (metric "bleu", higher
    is better; set by `ValidationBleu`) or `logs["val_loss"]` (metric "loss",
    lower is better), appends `{"step", "loss", "bleu"}` to the history in
    `best/index.json`, and when the value is strictly better than the worst of
    the best `keep` (or fewer than `keep` are kept) saves the model's weights
    to `best/ckpt-<step>` (`tf.train.Checkpoint(model=model)`), rewrites the
    index, then deletes the checkpoint that dropped out.

    Multi-worker: every worker must run it (saving may need collectives, and
    every worker must stop at the same validation), with the same logs: with
    metric "bleu" every worker must run `ValidationBleu` too. Only the chief
    writes `best/`; the others save to a temporary directory removed straight
    away, and keep the same state in memory.

    A new process on the same run directory continues from `best/index.json`:
    the same best set, and the patience count derived from its history.

    Args:
        model: the model being trained (its optimizer's step numbers the
            checkpoints).
        run: a `RunDirectory` (or its path).
        metric: "bleu" or "loss".
        keep: how many best checkpoints to keep (K >= 1).
        patience: stop after this many validations in a row without
            improvement over the best value (None: never).
        strategy: the training strategy (None: single worker).

    Attributes:
        stopped_at_step: the step at which it stopped training, or None.
    """

    def __init__(self, model, run, metric="bleu", keep=1, patience=None, strategy=None):
        super().__init__()
        if metric not in METRICS:
            raise ValueError(f"`metric` must be one of {METRICS}, received {metric!r}.")
        if keep < 1:
            raise ValueError(f"`keep` (--keep-best) must be >= 1, received {keep}.")
        if patience is not None and patience < 1:
            raise ValueError(
                f"`patience` (--early-stopping-patience) must be >= 1, received {patience}.")
        self.target_model = model
        self.run = run if isinstance(run, RunDirectory) else RunDirectory(run)
        self.metric = metric
        self.keep = keep
        self.patience = patience
        self.chief = strategy is None or is_chief(strategy)
        self.scratch = None
        if not self.chief:
            self.scratch = os.path.join(self.run.best_dir, f".worker-{worker_id(strategy)}-tmp")
        self.history, self.best = self._load()
        # A run that already stopped early (read from the index) stays stopped.
        self.stopped_at_step = self.history[-1]["step"] if self.should_stop() else None

    # State ---------------------------------------------------------------

    def _load(self):
        index = self.run.best_index()
        if index is None:
            kept = glob.glob(os.path.join(self.run.best_dir, "ckpt-*.index"))
            if kept:
                # Without the index nothing says which of them are the best:
                # refuse rather than delete them as leftovers.
                raise ValueError(
                    f"{self.run.best_dir} holds {len(kept)} checkpoint(s) but no "
                    f"{BEST_INDEX_FILE}: restore the index, or move the directory away to "
                    "start a new selection; nothing was deleted.")
            history, best = [], []
        else:
            if index.get("metric") != self.metric:
                raise ValueError(
                    f"{os.path.join(self.run.best_dir, BEST_INDEX_FILE)} ranks checkpoints by "
                    f"{metric_label(index.get('metric'))}, not {metric_label(self.metric)}: "
                    f"resume with --best-metric {index.get('metric')}, or move "
                    f"{self.run.best_dir} away to start a new selection."
                )
            history, best = list(index["history"]), list(index["best"])
        if self.chief:
            self._remove_unlisted(best)
        return history, best

    def _remove_unlisted(self, best):
        """Deletes `best/ckpt-*` files the index does not list: leftovers of
        a save or a deletion that a crash interrupted."""
        listed = {entry["name"] for entry in best}
        for path in glob.glob(os.path.join(self.run.best_dir, "ckpt-*")):
            match = re.fullmatch(r"(ckpt-\d+)\..*", os.path.basename(path))
            if match and match.group(1) not in listed:
                os.remove(path)

    def _write_index(self):
        index = {"metric": self.metric, "keep": self.keep, "history": self.history,
                 "best": self.best}
        write_atomically(os.path.join(self.run.best_dir, BEST_INDEX_FILE),
                         (json.dumps(index, indent=2) + "\n").encode("utf-8"))

    def _delete(self, name):
        for path in glob.glob(os.path.join(self.run.best_dir, glob.escape(name) + ".*")):
            os.remove(path)

    def _save(self, name):
        directory = self.run.best_dir if self.chief else self.scratch
        os.makedirs(directory, exist_ok=True)
        checkpoint = tf.train.Checkpoint(model=self.target_model)
        # `write` skips a save counter that does not exist yet, and restoring
        # with `assert_existing_objects_matched` (RunDirectory.load_model)
        # then finds it unmatched: create it first.
        checkpoint.save_counter  # noqa: B018
        checkpoint.write(os.path.join(directory, name))
        if not self.chief:
            shutil.rmtree(self.scratch, ignore_errors=True)

    # Queries -------------------------------------------------------------

    @property
    def validations_without_improvement(self):
        """Validations in a row, at the end of the history, without
        improvement over the best value."""
        return validations_without_improvement(self.history, self.metric)

    def should_stop(self):
        """True when `patience` is set and the history already ends with
        `patience` validations without improvement: a resumed run that
        stopped early has nothing left to do."""
        return (self.patience is not None
                and self.validations_without_improvement >= self.patience)

    def best_value(self):
        """`(step, value)` of the best validation so far, or None."""
        return (self.best[0]["step"], self.best[0]["value"]) if self.best else None

    def summary(self):
        """A sentence for the end of training: the best step and value, how
        many validations, whether training stopped early."""
        label = metric_label(self.metric)
        if not self.history:
            return f"No validation yet, so no best checkpoint by {label} in {self.run.best_dir}."
        step, value = self.best_value()
        kept = ", ".join(entry["name"] for entry in self.best)
        sentence = (f"Best {label} {format_metric(self.metric, value)} at step {step} after "
                    f"{len(self.history)} validations; best/ keeps {kept}.")
        if self.stopped_at_step is not None:
            sentence += (f" Stopped early at step {self.stopped_at_step}: "
                         f"{self.patience} validations without improvement "
                         f"(--early-stopping-patience {self.patience}).")
        return sentence

    # Callback ------------------------------------------------------------

    def on_train_begin(self, logs=None):
        if self.history and self.chief:
            step, value = self.best_value() if self.best else (None, None)
            best = (f"best {format_metric(self.metric, value)} at step {step}"
                    if self.best else "none kept")
            print(f"Resuming best-checkpoint selection from "
                  f"{os.path.join(self.run.best_dir, BEST_INDEX_FILE)}: "
                  f"{len(self.history)} validations, {best}, "
                  f"{self.validations_without_improvement} since without improvement.",
                  flush=True)

    def _value(self, logs):
        key = _LOG_KEYS[self.metric]
        if key not in logs:
            if self.metric == "bleu":
                hint = ("validation BLEU is computed only with a --valid-split and "
                        "--bleu-sentences N > 0 (ValidationBleu before BestCheckpoints), or "
                        "choose --best-metric loss")
            else:
                hint = "validation loss needs a --valid-split"
            raise ValueError(
                f"BestCheckpoints ranks by {metric_label(self.metric)} but the validation "
                f"logs have no {key!r} (they have {sorted(logs)}): {hint}."
            )
        return float(logs[key])

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        value = self._value(logs)
        step = optimizer_step(self.target_model.optimizer)
        name = f"ckpt-{step}"
        record = {"step": step, "loss": None, "bleu": None}
        for metric, key in _LOG_KEYS.items():
            if key in logs:
                record[metric] = float(logs[key])
        # The same step validated again (a resume from an older checkpoint):
        # the new validation replaces the old one.
        self.history = [e for e in self.history if e["step"] != step] + [record]
        candidates = [e for e in self.best if e["step"] != step]
        candidates.append({"name": name, "step": step, "value": value})
        candidates.sort(key=_rank_key(self.metric))
        kept = candidates[:self.keep]
        # Includes this step's name when it did not make it, so files of an
        # earlier validation of the same step go too.
        dropped = [e["name"] for e in candidates[self.keep:]]
        if any(e["step"] == step for e in kept):
            if any(e["step"] == step for e in self.best) and self.chief:
                # Unlist the old files of this step before overwriting them.
                self.best = [e for e in self.best if e["step"] != step]
                self._write_index()
            self._save(name)
        self.best = kept
        if self.chief:
            self._write_index()
            for dropped_name in dropped:
                self._delete(dropped_name)
        if self.should_stop():
            self.target_model.stop_training = True
            self.stopped_at_step = step
            best_step, best_value = self.best_value()
            if self.chief:
                print(f"\nStopping early at step {step}: {metric_label(self.metric)} has not "
                      f"improved on {format_metric(self.metric, best_value)} (step {best_step}) "
                      f"for {self.patience} validations (--early-stopping-patience "
                      f"{self.patience}).", flush=True)
