"""The run directory: everything a training run leaves behind, enough to
resume, evaluate, translate or export later. TensorFlow-only module.

Layout::

    <run_dir>/
        config.json          TransformerConfig (ids filled from the tokenizer)
        vocab.model          SentencePiece model proto (shared vocabulary), or
        src_vocab.model      the source and target SentencePiece models of a
        tgt_vocab.model      run with separate vocabularies
        train_args.json      the command-line arguments of the run (optional)
        checkpoints/         tf.train.CheckpointManager: ckpt-<step>.*, `checkpoint`
        averaged/            checkpoint averaging output: ckpt-<step>.*, `checkpoint`,
                             sources.json (what was averaged, see
                             training.checkpoints.average_checkpoints)
        best/                the best K validated checkpoints (model only):
                             ckpt-<step>.*, index.json (see training/selection.py)
        logs/                TensorBoard

Checkpoints are `tf.train.Checkpoint(model=..., optimizer=...)` objects keyed
by the optimizer step; TensorFlow writes their data files first and the
`checkpoint` index last through a rename, so a `kill -9` mid-save leaves the
previous checkpoint as the latest. Every other file here is written with
`write_atomically`.

`resolve_checkpoint(selector)` turns a `--checkpoint` selector (auto, last,
best, averaged, best:K, last:K or a prefix) into a prefix and a sentence
saying why; `load_model` prints that sentence. A `best:K` or `last:K`
selector asks for an averaging first, which its caller does
(`training.checkpoints.averaged_if_asked`): this module only says where
checkpoints are and what they are, and writes none.
"""

import fcntl
import json
import os
import re
import sys

import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.files import write_atomically
from keras_transformer.tokenizer import SubwordTokenizer
from keras_transformer.transformer import Transformer

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.model"
SOURCE_VOCAB_FILE = "src_vocab.model"
TARGET_VOCAB_FILE = "tgt_vocab.model"
ARGS_FILE = "train_args.json"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
SOURCES_FILE = "sources.json"
BEST = "best"
BEST_INDEX_FILE = "index.json"
LOGS = "logs"
LOCK_FILE = ".lock"
# The run directories this process holds locked: a POSIX lock is the
# process's, and closing any descriptor of the file would release it, so
# each lock file stays open until the process ends.
_LOCKED = {}


def checkpoint_step(prefix):
    """The step of a `.../ckpt-<step>` prefix. Raises ValueError otherwise."""
    match = re.fullmatch(r".*-(\d+)", os.path.basename(prefix))
    if not match:
        raise ValueError(f"{prefix} is not a checkpoint prefix of the form .../ckpt-<step>.")
    return int(match.group(1))


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
    def averaged_sources_path(self):
        """`averaged/sources.json`: what the averaged checkpoint averages."""
        return os.path.join(self.averaged_dir, SOURCES_FILE)

    @property
    def best_dir(self):
        return self.file(BEST)

    @property
    def log_dir(self):
        return self.file(LOGS)

    def lock(self, purpose="training"):
        """Locks the run directory for this process (a POSIX lock on
        `RUN_DIR/.lock`, which holds the pid and `purpose`), so that a
        second training process on it stops at once instead of interleaving
        checkpoints, and averaging does not read checkpoints that training
        is writing or deleting. Held until the process ends; asking again in
        the same process is a no-op. Raises `ValueError` naming the
        directory, the holder's pid and purpose and the lock file when
        another process holds it."""
        path = os.path.realpath(self.path)
        if path in _LOCKED:
            return
        os.makedirs(path, exist_ok=True)
        lock_file = os.path.join(path, LOCK_FILE)
        f = open(lock_file, "a+")
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            pid, _, held_for = f.read().strip().partition(" ")
            f.close()
            advice = (", or use another run directory" if purpose == "training"
                      else f" before {purpose}")
            raise ValueError(
                f"{self.path} is in use by another {held_for or 'training'} process"
                f"{f' (pid {pid})' if pid else ''}, which holds {lock_file}: wait for it "
                f"to end{advice}.") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()} {purpose}\n")
        f.flush()
        _LOCKED[path] = f

    def exists(self):
        """True when the run directory is complete: `config.json` (written
        last) plus either the shared `vocab.model` or both `src_vocab.model`
        and `tgt_vocab.model`."""
        if not os.path.exists(self.file(CONFIG_FILE)):
            return False
        return os.path.exists(self.file(VOCAB_FILE)) or self._has_separate_vocabularies()

    def _has_separate_vocabularies(self):
        return os.path.exists(self.file(SOURCE_VOCAB_FILE)) and os.path.exists(
            self.file(TARGET_VOCAB_FILE)
        )

    # Config, vocabulary, arguments -----------------------------------------

    def save_config(self, config):
        write_atomically(self.file(CONFIG_FILE), config.to_json().encode("utf-8"))

    def load_config(self):
        self._require(CONFIG_FILE)
        with open(self.file(CONFIG_FILE), encoding="utf-8") as f:
            return TransformerConfig.from_json(f.read())

    def save_tokenizer(self, tokenizer):
        """Writes a shared vocabulary (`vocab.model`)."""
        tokenizer.save(self.file(VOCAB_FILE))

    def save_tokenizers(self, source, target=None):
        """Writes the vocabularies of the run: `target=None` (or the same
        object as `source`) means one shared vocabulary in `vocab.model`;
        otherwise `src_vocab.model` and `tgt_vocab.model`."""
        if target is None or target is source:
            self.save_tokenizer(source)
            return
        source.save(self.file(SOURCE_VOCAB_FILE))
        target.save(self.file(TARGET_VOCAB_FILE))

    def shared_vocabulary(self):
        """True when the run has one vocabulary for both languages
        (`vocab.model`), False when it has `src_vocab.model` and
        `tgt_vocab.model`. Raises FileNotFoundError when it has neither."""
        if os.path.exists(self.file(VOCAB_FILE)):
            return True
        if self._has_separate_vocabularies():
            return False
        raise FileNotFoundError(
            f"No vocabulary in {self.path}: expected {VOCAB_FILE} (shared) or both "
            f"{SOURCE_VOCAB_FILE} and {TARGET_VOCAB_FILE}, written by kt-train."
        )

    def load_tokenizers(self):
        """Returns `(source_tokenizer, target_tokenizer)`; the same object
        twice when the vocabulary is shared."""
        if self.shared_vocabulary():
            tokenizer = SubwordTokenizer.from_file(self.file(VOCAB_FILE))
            return tokenizer, tokenizer
        return (
            SubwordTokenizer.from_file(self.file(SOURCE_VOCAB_FILE)),
            SubwordTokenizer.from_file(self.file(TARGET_VOCAB_FILE)),
        )

    def load_tokenizer(self):
        """The shared vocabulary (`vocab.model`). A run with separate source
        and target vocabularies raises ValueError: use `load_tokenizers()`."""
        if not os.path.exists(self.file(VOCAB_FILE)) and self._has_separate_vocabularies():
            raise ValueError(
                f"{self.path} has separate vocabularies ({SOURCE_VOCAB_FILE}, "
                f"{TARGET_VOCAB_FILE}), not a shared {VOCAB_FILE}: use "
                "RunDirectory.load_tokenizers() to get (source, target)."
            )
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

    def training_checkpoints(self):
        """The kept training checkpoints as `[(prefix, step)]`, oldest first
        (empty when there are none)."""
        if not os.path.isdir(self.checkpoint_dir):
            return []
        state = tf.train.get_checkpoint_state(self.checkpoint_dir)
        paths = list(state.all_model_checkpoint_paths) if state else []
        paths = [p if os.path.isabs(p) else os.path.join(self.checkpoint_dir, p) for p in paths]
        return [(p, checkpoint_step(p)) for p in paths]

    def latest_training_checkpoint(self):
        """`(prefix, step)` of the newest training checkpoint, or None."""
        kept = self.training_checkpoints()
        return kept[-1] if kept else None

    def averaged_checkpoint(self):
        """The prefix of the averaged checkpoint, or None."""
        if not os.path.isdir(self.averaged_dir):
            return None
        return tf.train.latest_checkpoint(self.averaged_dir)

    def averaged_sources(self):
        """The contents of `averaged/sources.json` (see
        `training.checkpoints.average_checkpoints`), or None when it is
        missing or describes another averaged checkpoint than the current one
        (left by an older version, which wrote the two in place)."""
        averaged = self.averaged_checkpoint()
        path = self.averaged_sources_path
        if averaged is None or not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            sources = json.load(f)
        if sources.get("output") != os.path.basename(averaged):
            return None
        return sources

    def averaged_staleness(self):
        """Whether training went on after the averaged checkpoint was made.

        Returns `(stale, newer)`: `stale` is False (fresh), True (a training
        checkpoint newer than every averaged source and than the newest
        training step at averaging time exists) or None (unknown: no
        `averaged/sources.json`, an older run); `newer` is `(prefix, step)` of
        the newest training checkpoint when it is newer than the averaged
        checkpoint's sources, else None. Raises FileNotFoundError without an
        averaged checkpoint."""
        averaged = self.averaged_checkpoint()
        if averaged is None:
            raise FileNotFoundError(
                f"No averaged checkpoint in {self.averaged_dir}: run kt-average --run-dir "
                f"{self.path} first."
            )
        latest = self.latest_training_checkpoint()
        sources = self.averaged_sources()
        if sources is None:
            newer = latest if latest and latest[1] > checkpoint_step(averaged) else None
            return None, newer
        # Best checkpoints may be older than the training checkpoints of the
        # same moment: compare with the newest training step at averaging time.
        reference = max([s["step"] for s in sources["sources"]]
                        + [sources.get("newest_training_step") or 0])
        if latest and latest[1] > reference:
            return True, latest
        return False, None

    def best_checkpoints(self):
        """The checkpoints kept in `best/` by `BestCheckpoints`, best first:
        a list of `(prefix, step, value)` whose `.metric` attribute is the
        metric they were chosen by ("bleu" or "loss"; None when `best/` has
        no index). Files that `best/index.json` does not list are ignored."""
        index = self.best_index()
        if index is None:
            return BestCheckpointList([], None)
        return BestCheckpointList(
            [(os.path.join(self.best_dir, entry["name"]), entry["step"], entry["value"])
             for entry in index["best"]],
            index["metric"],
        )

    def best_index(self):
        """The parsed `best/index.json`, or None when there is none."""
        path = os.path.join(self.best_dir, BEST_INDEX_FILE)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def latest_checkpoint(self, prefer_averaged=True):
        """The averaged checkpoint if there is one (and `prefer_averaged`),
        else the latest training checkpoint, else None. Ignores staleness:
        `resolve_checkpoint()` is what the commands use."""
        if prefer_averaged and self.averaged_checkpoint():
            return self.averaged_checkpoint()
        latest = self.latest_training_checkpoint()
        return latest[0] if latest else None

    def resolve_checkpoint(self, selector=None):
        """The checkpoint a `--checkpoint` selector names, and why.

        Selectors:
            None or "auto": `averaged/` when it exists and is not stale, else
                the best checkpoint when `best/` has one, else the latest
                training checkpoint. A stale `averaged/` (training went on
                after averaging, per `averaged/sources.json`) is a ValueError
                saying what to do; one without `sources.json` is used only
                when its step is at least the latest training step.
            "last", "best", "averaged": the latest training checkpoint, the
                best validated checkpoint, the averaged checkpoint (even when
                stale; the reason then says so).
            "best:K", "last:K": a ValueError; their caller averages first
                (`training.checkpoints.averaged_if_asked`, which turns them
                into "averaged").
            anything else: a checkpoint prefix (absolute, relative to the
                working directory, or relative to the run directory).

        Returns: `(prefix, reason)`, `reason` a sentence starting with the
        prefix as shown to users (relative to the run directory when inside
        it), e.g. "best/ckpt-3000: the best of 5 validations by validation
        BLEU (37.20 at step 3000)".

        Raises: FileNotFoundError naming what is missing; ValueError for a
        stale `averaged/` under "auto" or a malformed selector.
        """
        if selector is None or selector in ("", "auto"):
            return self._resolve_auto()
        if selector == "last":
            return self._resolve_last()
        if selector == "best":
            return self._resolve_best()
        if selector == "averaged":
            return self._resolve_averaged()
        if re.fullmatch(r"(best|last):\d+", selector):
            raise ValueError(
                f"--checkpoint {selector} averages checkpoints first: pass it through "
                "keras_transformer.training.checkpoints.averaged_if_asked(run, selector).")
        if re.fullmatch(r"[a-z]+:.*", selector) and not os.path.exists(selector + ".index"):
            raise ValueError(
                f"Unknown checkpoint selector {selector!r}: use auto, last, best, averaged, "
                "best:K, last:K or a checkpoint prefix."
            )
        return self._resolve_prefix(selector)

    def load_model(self, checkpoint=None, config=None, quiet=False):
        """Builds the model from `config.json` and restores its weights.

        Args:
            checkpoint: a selector or a checkpoint prefix, as
                `resolve_checkpoint` takes (default "auto").
            config: overrides `config.json` (e.g. to change dropout).
            quiet: do not print `Loaded <prefix>: <reason>` to stderr.

        Returns: a built `Transformer`.
        """
        config = config or self.load_config()
        prefix, reason = self.resolve_checkpoint(checkpoint)
        model = Transformer(config)
        model.build()
        # expect_partial: optimizer slots in the checkpoint are not needed here.
        tf.train.Checkpoint(model=model).restore(prefix).expect_partial().assert_existing_objects_matched()
        if not quiet:
            print(f"Loaded {reason}", file=sys.stderr, flush=True)
        return model

    # Selector resolution ---------------------------------------------------

    def display(self, prefix):
        """`prefix` relative to the run directory when inside it."""
        relative = os.path.relpath(os.path.abspath(prefix), self.path)
        return prefix if relative.startswith(os.pardir) else relative

    def _resolve_auto(self):
        averaged = self.averaged_checkpoint()
        skipped = ""
        if averaged is not None:
            stale, newer = self.averaged_staleness()
            if stale:
                raise ValueError(self._stale_message(averaged, newer))
            if stale is False or newer is None:
                return self._resolve_averaged()
            skipped = (f" ({self.display(averaged)} not used: it has no "
                       f"{AVERAGED}/{SOURCES_FILE} and is older than {self.display(newer[0])})")
        if self.best_checkpoints():
            prefix, reason = self._resolve_best()
        else:
            prefix, reason = self._resolve_last()
        return prefix, reason + skipped

    def _resolve_last(self):
        latest = self.latest_training_checkpoint()
        if latest is None:
            raise FileNotFoundError(
                f"No training checkpoint in {self.checkpoint_dir} (no `checkpoint` index "
                "there): train first with kt-train."
            )
        return latest[0], f"{self.display(latest[0])}: the latest training checkpoint"

    def _resolve_best(self):
        best = self.best_checkpoints()
        if not best:
            raise FileNotFoundError(
                f"No best checkpoint: {os.path.join(self.best_dir, BEST_INDEX_FILE)} is missing "
                "or lists none. kt-train writes best/ with --keep-best K and a --valid-split."
            )
        return best[0][0], self._best_reason(best, best[0])

    def _best_reason(self, best, entry):
        index = self.best_index()
        validations = len(index.get("history", []))
        rank = [e[0] for e in best].index(entry[0]) + 1
        which = "the best" if rank == 1 else f"number {rank} of the best {len(best)}"
        return (f"{self.display(entry[0])}: {which} of {validations} validations by "
                f"{metric_label(best.metric)} ({format_metric(best.metric, entry[2])} at step "
                f"{entry[1]})")

    def _resolve_averaged(self):
        averaged = self.averaged_checkpoint()
        if averaged is None:
            raise FileNotFoundError(
                f"No averaged checkpoint in {self.averaged_dir} (no `checkpoint` index there): "
                f"run kt-average --run-dir {self.path}, or use --checkpoint best:K or last:K."
            )
        return averaged, self._averaged_reason(averaged)

    def _averaged_reason(self, averaged):
        sources = self.averaged_sources()
        stale, newer = self.averaged_staleness()
        if sources is None:
            reason = (f"{self.display(averaged)}: an average of checkpoints not recorded "
                      f"(no {AVERAGED}/{SOURCES_FILE})")
        else:
            reason = f"{self.display(averaged)}: the average of {describe_sources(sources)}"
        if newer is not None:
            certainty = "STALE" if stale else "possibly stale"
            reason += (f"; {certainty}: older than {self.display(newer[0])}, training went on "
                       "after averaging (run kt-average again to refresh it)")
        return reason

    def _stale_message(self, averaged, newer):
        sources = self.averaged_sources()
        return (
            f"{self.averaged_dir} is stale: {self.display(averaged)} averages "
            f"{describe_sources(sources)}, but training went on to {newer[0]} (step "
            f"{newer[1]}). Run kt-average --run-dir {self.path} again to average the newest "
            "checkpoints, or choose explicitly with --checkpoint last, --checkpoint best or "
            "--checkpoint averaged (the stale average)."
        )

    def _resolve_prefix(self, prefix):
        candidates = [prefix]
        if not os.path.isabs(prefix):
            candidates.append(os.path.join(self.path, prefix))
        for candidate in candidates:
            if os.path.exists(candidate + ".index"):
                path = os.path.abspath(candidate)
                break
        else:
            raise FileNotFoundError(
                f"No checkpoint {prefix!r}: neither {candidates[0]}.index nor "
                f"{candidates[-1]}.index exists. Pass a prefix such as "
                f"{os.path.join(self.checkpoint_dir, 'ckpt-1200')} (no .index suffix) or a "
                "selector: auto, last, best, averaged, best:K, last:K."
            )
        directory = os.path.dirname(path)
        if directory == self.averaged_dir and path == self.averaged_checkpoint():
            return path, self._averaged_reason(path)
        if directory == self.best_dir:
            best = self.best_checkpoints()
            for entry in best:
                if os.path.abspath(entry[0]) == path:
                    return path, self._best_reason(best, entry)
        if directory == self.checkpoint_dir:
            latest = self.latest_training_checkpoint()
            which = ("the latest training checkpoint" if latest and latest[0] == path
                     else "a training checkpoint")
            return path, f"{self.display(path)}: {which} (named by --checkpoint)"
        return path, f"{self.display(path)}: the checkpoint named by --checkpoint"

    def _require(self, name):
        if not os.path.exists(self.file(name)):
            raise FileNotFoundError(
                f"{self.file(name)} not found: {self.path} is not a run directory "
                f"(expected {CONFIG_FILE} and {VOCAB_FILE}, or {SOURCE_VOCAB_FILE} and "
                f"{TARGET_VOCAB_FILE}, written by kt-train)."
            )


class BestCheckpointList(list):
    """`RunDirectory.best_checkpoints()`: `(prefix, step, value)` best first;
    `metric` names the validation metric ("bleu" or "loss")."""

    def __init__(self, entries, metric):
        super().__init__(entries)
        self.metric = metric


def metric_label(metric):
    return {"bleu": "validation BLEU", "loss": "validation loss"}.get(metric, str(metric))


def format_metric(metric, value):
    return f"{value:.2f}" if metric == "bleu" else f"{value:.4f}"


def describe_sources(sources):
    """'ckpt-3200..ckpt-4000 (last 5)' and the like, from `sources.json`."""
    entries = sources["sources"]
    names = [os.path.basename(s["prefix"]) for s in entries]
    chosen = sources.get("chosen")
    if chosen == "last":
        span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        return f"{span} (last {len(names)})"
    if chosen == "best":
        ranked = sorted(entries, key=lambda s: s.get("rank", 0))
        values = ", ".join(
            f"{os.path.basename(s['prefix'])} {format_metric(sources.get('metric'), s['value'])}"
            if "value" in s else os.path.basename(s["prefix"]) for s in ranked)
        return (f"the best {len(names)} by {metric_label(sources.get('metric'))} "
                f"({values})")
    return f"{', '.join(names)} (explicit)"
