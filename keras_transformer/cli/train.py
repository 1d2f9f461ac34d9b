"""kt-train: train the Transformer on a parallel corpus (data, vocabulary,
strategy, precision, model, checkpoints and `model.fit`, with exact resume).

`train(args)` is the command as a function of its parsed arguments;
`main(argv)` parses them and returns the exit status."""

import argparse
import hashlib
import math
import os
import sys
import time
import warnings

from keras_transformer import startup

# Kudo (2018)'s l for subword sampling in translation.
DEFAULT_SUBWORD_NBEST = 64


def build_parser():
    from keras_transformer.config import PRESETS
    from keras_transformer.training.strategy import PRECISIONS, STRATEGIES

    p = argparse.ArgumentParser(
        prog="kt-train",
        description=(
            "Train the Transformer (paper section 5) on a parallel corpus. The first run "
            "trains (or takes) the subword vocabulary and writes RUN_DIR (config.json, "
            "vocab.model, train_args.json, checkpoints/, best/, logs/); running the same "
            "command again resumes exactly where the last checkpoint was (model, "
            "optimizer, step and position in the data)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=(
            "examples:\n"
            "  kt-train --run-dir runs/m30k --data text:../shared/data/multi30k \\\n"
            "      --src-lang en --tgt-lang de --config small --vocab-size 8000 --train-steps 20000\n"
            "  kt-train --run-dir runs/mine --train-tsv train.tsv --valid-tsv dev.tsv \\\n"
            "      --vocab my.model --config my.yaml --set dropout=0.2 --early-stopping-patience 5\n"
            "  kt-train --run-dir runs/wmt --data tfds:wmt14_translate/de-en \\\n"
            "      --src-lang en --tgt-lang de --config base --batch-tokens 3125 --accumulation-steps 8\n"
            "  kt-train --run-dir runs/tuned --init-from runs/wmt --train-src in.en --train-tgt in.de\n"
            "  TF_CONFIG='{\"cluster\":{\"worker\":[\"h1:2222\",\"h2:2222\"]},\"task\":{\"type\":\"worker\",\"index\":0}}' \\\n"
            "      kt-train --strategy multi_worker_mirrored ...  (same on h2 with index 1)\n"
            "  kt-average --run-dir runs/wmt --num 5"
        ),
    )
    p.add_argument("--run-dir", required=True, help="run directory (created or resumed)")
    g = p.add_argument_group(
        "data", "Either --data (a named source) or files by path; per split, paths win.")
    g.add_argument("--data", default=None,
                   help="`text:<dir of <split>.<lang>[.gz]>`, `tfds:<name>/<config>`, or "
                        "`builtin` (the generated en <-> synth corpus)")
    g.add_argument("--src-lang", default=None,
                   help="source language suffix/feature, e.g. en (needed by --data)")
    g.add_argument("--tgt-lang", default=None,
                   help="target language suffix/feature, e.g. de (needed by --data)")
    g.add_argument("--train-split", default="train", help="split of --data to train on")
    g.add_argument("--valid-split", default="validation",
                   help="split of --data to validate on; '' disables validation")
    g.add_argument("--test-split", default="",
                   help="split of --data translated and scored at the end ('' : none)")
    for split, what in (("train", "training"), ("valid", "validation"), ("test", "test")):
        g.add_argument(f"--{split}-src", default=None,
                       help=f"{what} source sentences, one per line (plain or gzipped)")
        g.add_argument(f"--{split}-tgt", default=None,
                       help=f"{what} target sentences, aligned line by line with --{split}-src")
        g.add_argument(f"--{split}-tsv", default=None,
                       help=f"{what} pairs, one `source<TAB>target` per line (plain or gzipped)")
    g.add_argument("--max-length", type=int, default=256,
                   help="drop training pairs with a side longer than this many tokens "
                        "(counted, logged)")
    g.add_argument("--batch-tokens", type=int, default=4096,
                   help="token budget per batch, per replica and side, padding included "
                        "(paper: ~25000 per step over 8 GPUs)")
    g.add_argument("--shuffle-buffer", type=int, default=100_000, help="pairs")
    g.add_argument("--cache-tokenized", action="store_true",
                   help="tokenize the training pairs once and keep their ids in memory "
                        "(saves the CPU that tokenizing every epoch takes; the ids of every "
                        "pair must fit in memory: fine for Multi30k, ~1.5 GB for WMT14)")
    g.add_argument("--subword-sampling", type=float, default=None, metavar="ALPHA",
                   help="subword regularization (Kudo 2018): each training pair's sides get "
                        "a segmentation drawn from their --subword-nbest most likely ones "
                        "with probability P^ALPHA, anew every epoch (0.1-0.5; unigram "
                        "vocabularies; the candidates are kept in memory). Validation, "
                        "BLEU and translation keep the best segmentation")
    g.add_argument("--subword-nbest", type=int, default=None, metavar="L",
                   help=f"candidates per sentence for --subword-sampling (default "
                        f"{DEFAULT_SUBWORD_NBEST})")
    g.add_argument("--seed", type=int, default=1,
                   help="weights, dropout and data order; a resumed run keeps its seed")
    g = p.add_argument_group("vocabulary")
    g.add_argument("--vocab", default=None,
                   help="an existing SentencePiece model to use as the shared vocabulary "
                        "(instead of training one)")
    g.add_argument("--src-vocab", default=None,
                   help="an existing SentencePiece model for the source side (with --tgt-vocab)")
    g.add_argument("--tgt-vocab", default=None,
                   help="an existing SentencePiece model for the target side (with --src-vocab)")
    g.add_argument("--separate-vocab", action="store_true",
                   help="train separate source and target vocabularies (default: one shared, "
                        "paper 3.4)")
    g.add_argument("--vocab-size", type=int, default=37000,
                   help="pieces of a trained vocabulary (paper: 37000 shared for en-de)")
    g.add_argument("--src-vocab-size", type=int, default=None,
                   help="with --separate-vocab: source pieces (default --vocab-size)")
    g.add_argument("--tgt-vocab-size", type=int, default=None,
                   help="with --separate-vocab: target pieces (default --vocab-size)")
    g.add_argument("--vocab-model-type", default="unigram", choices=("unigram", "bpe"),
                   help="SentencePiece algorithm of a trained vocabulary")
    g.add_argument("--character-coverage", type=float, default=1.0,
                   help="share of characters a trained vocabulary covers (1.0 for "
                        "alphabetic scripts; ~0.9995 for Chinese or Japanese), the rest by "
                        "byte fallback")
    g.add_argument("--vocab-sentences", type=int, default=1_000_000,
                   help="training pairs read to train the vocabulary")
    g = p.add_argument_group("model")
    g.add_argument("--config", default=None, metavar="PRESET|FILE",
                   help=f"a Table 3 preset ({', '.join(sorted(PRESETS))}) or a YAML/JSON "
                        "file with `model:` (TransformerConfig fields, `preset`) and "
                        "`training:` (these flags) sections; flags given on the command "
                        "line win over the file (default: base, or the --init-from model's)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one model field or training setting, over the file and "
                        "flags, e.g. --set norm_first=true --set training.batch_tokens=2048 "
                        "(repeatable; qualify with model./training. where a name is both)")
    g.add_argument("--dropout", type=float, default=None, help="override P_drop")
    g.add_argument("--position-encoding", default=None,
                   choices=("sinusoidal", "learned", "none"),
                   help="override the positional encoding ('none': an ablation)")
    g.add_argument("--init-from", default=None, metavar="RUN_DIR|CHECKPOINT",
                   help="fine-tune: start a new run from a trained run's weights (its "
                        "averaged, best or last checkpoint, as kt-translate chooses) or from "
                        "a checkpoint prefix; same vocabulary and architecture, fresh "
                        "optimizer and schedule")
    g.add_argument("--keep-optimizer", action="store_true",
                   help="with --init-from a training checkpoint: also take its optimizer "
                        "slots and step (the schedule continues)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--train-steps", type=int, default=100_000,
                   help="total optimizer updates (paper: 100k base, 300k big)")
    g.add_argument("--max-minutes", type=float, default=None,
                   help="also stop after this much training wall time (validation included), "
                        "with a checkpoint, like fairseq's --stop-time-hours; one-process "
                        "strategies only")
    g.add_argument("--warmup-steps", type=int, default=4000)
    g.add_argument("--lr-scale", type=float, default=1.0, help="multiplies the schedule")
    g.add_argument("--accumulation-steps", type=int, default=1,
                   help="micro-batches per update (effective batch = batch-tokens x replicas x this)")
    g.add_argument("--precision", default="auto", choices=("auto",) + PRECISIONS,
                   help="auto: mixed_bfloat16 where the CPU or GPU multiplies bfloat16 in "
                        "hardware (AVX512-BF16/AMX CPUs, Ampere or later GPUs), else float32; "
                        "the choice is printed and recorded in train_args.json. "
                        "mixed_float16 adds dynamic loss scaling")
    g.add_argument("--strategy", default=None, choices=STRATEGIES,
                   help="default: mirrored with more than one GPU, else one_device")
    g.add_argument("--logical-cpus", type=int, default=0,
                   help="split the CPU into N devices for `mirrored` (testing without GPUs)")
    g.add_argument("--steps-per-execution", type=int, default=1)
    g.add_argument("--jit-compile", action="store_true",
                   help="compile the training and validation steps with XLA; batches are "
                        "then padded to their length bucket's longest length (one shape, "
                        "so one compilation, per bucket). Keras leaves XLA off under any "
                        "tf.distribute strategy, and so by default does this trainer "
                        "(docs/training.md: when it pays)")
    g = p.add_argument_group("validation, checkpoint selection and early stopping")
    g.add_argument("--validate-every", "--steps-per-epoch", dest="steps_per_epoch", type=int,
                   default=1000, help="updates between validations (validation loss, and "
                   "BLEU with --bleu-sentences)")
    g.add_argument("--bleu-sentences", type=int, default=200,
                   help="validation sentences translated for BLEU (sacreBLEU) at every "
                        "validation; 0 disables")
    g.add_argument("--bleu-search", default="beam", choices=("beam", "greedy"),
                   help="how validation sentences are translated (beam: 4, alpha 0.6)")
    g.add_argument("--best-metric", default=None, choices=("bleu", "loss"),
                   help="what chooses the best checkpoints (default: bleu when "
                        "--bleu-sentences > 0, else loss)")
    g.add_argument("--keep-best", type=int, default=3,
                   help="keep the best K checkpoints (model weights) in RUN_DIR/best/; "
                        "0 disables")
    g.add_argument("--early-stopping-patience", type=int, default=None,
                   help="stop after this many validations in a row without a new best")
    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--checkpoint-every", type=int, default=1000, help="updates (0: only at the end)")
    g.add_argument("--keep-checkpoints", type=int, default=20,
                   help="keep the last K (average 5 for base, 20 for big)")
    g.add_argument("--log-every", type=int, default=100, help="TensorBoard interval in updates")
    g.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="1: progress bar, 2: one line per epoch")
    g.add_argument("--wait-for-chief", type=float, default=600,
                   help="seconds a non-chief worker waits for the chief's vocabulary")
    startup.add_arguments(p)
    return p


# Keras 3 compiles a replica's step with the variables of every replica in
# it; TensorFlow then refuses to read another device's variable ("Trying to
# access resource ... located in device ...CPU:1 from device ...CPU:0").
_JIT_WITH_REPLICAS = ("--jit-compile needs one device; the {} strategy runs replicas, whose "
                      "steps Keras 3 cannot compile with XLA. Drop --jit-compile, or use "
                      "--strategy one_device.")


# Settings that are not training settings of a file or --set.
_NOT_SETTINGS = {"run_dir", "config", "set", "help", "tf_verbose", "system_malloc"}
# Names that are both a model field and a flag: unqualified in --set, they
# set the flag (the model field follows it).
_FLAG_MODEL_FIELDS = {"dropout", "position_encoding", "warmup_steps"}


def _settings_actions(parser):
    return {a.dest: a for a in parser._actions
            if a.dest not in _NOT_SETTINGS and a.option_strings}


def _convert_setting(action, key, value, where):
    """A file or --set value for the flag of `action`, typed as the flag."""
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise ValueError(f"{where}: `{key}` must be true or false, received {value!r}.")
        return value
    if value is None:
        return None
    kind = action.type
    if kind is not None and not (kind is float and isinstance(value, int)
                                 and not isinstance(value, bool)):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{where}: `{key}` must be {kind.__name__}, received {value!r}.")
        try:
            converted = kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: `{key}` must be {kind.__name__}, received "
                             f"{value!r}.") from None
        if kind is int and isinstance(value, float) and value != converted:
            raise ValueError(f"{where}: `{key}` must be int, received {value!r}.")
        value = converted
    elif kind is None and not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where}: `{key}` must be one of {list(action.choices)}, received "
                         f"{value!r}.")
    return value


def resolve_settings(args, argv=None, parser=None):
    """Applies `--config FILE` and `--set` to parsed `args`.

    Precedence, lowest first: flag defaults, the file's `training:` section,
    flags given on the command line (known from `argv`; without it, a flag
    still at its default counts as not given), then `--set`. Model fields
    (the file's `model:` section and `--set` model fields) are kept in
    `args.model_settings` for `model_config`; `args.config_file` names the
    file. Raises `ValueError` naming the file or `--set` and the key.
    """
    import copy

    from keras_transformer.config import (
        TransformerConfig,
        check_model_fields,
        is_settings_file,
        load_settings_file,
        parse_assignment,
    )
    import dataclasses

    parser = parser or build_parser()
    actions = _settings_actions(parser)
    args = copy.copy(args)
    sections = {"model": {}, "training": {}}
    args.config_file = None
    if args.config is not None and is_settings_file(args.config):
        args.config_file = os.path.abspath(args.config)
        sections = load_settings_file(args.config)
    explicit = set()
    if argv is not None:
        strings = {o: a.dest for a in parser._actions for o in a.option_strings}
        for token in argv:
            flag = token.split("=", 1)[0]
            if flag in strings:
                explicit.add(strings[flag])
    else:
        explicit = {d for d, a in actions.items() if getattr(args, d) != a.default}

    def apply(key, value, where, force):
        if key not in actions:
            raise ValueError(f"{where}: unknown training setting `{key}`; settings are the "
                             f"kt-train flags: {sorted(actions)}.")
        if force or key not in explicit:
            setattr(args, key, _convert_setting(actions[key], key, value, where))

    where_file = f"{args.config}, training"
    for key, value in sections["training"].items():
        apply(key, value, where_file, force=False)
    model = dict(sections["model"])
    fields = {f.name for f in dataclasses.fields(TransformerConfig)} | {"preset"}
    for text in args.set:
        key, value = parse_assignment(text)
        where = f"--set {text}"
        section, _, name = key.partition(".")
        if name and section in ("model", "training"):
            if section == "model":
                check_model_fields({name: value}, where)
                model[name] = value
            else:
                apply(name, value, where, force=True)
        elif key in _FLAG_MODEL_FIELDS or (key in actions and key not in fields):
            apply(key, value, where, force=True)
        elif key in fields and key in actions:
            raise ValueError(f"{where}: `{key}` is both a model field and a kt-train setting; "
                             f"write model.{key}= or training.{key}=.")
        elif key in fields:
            model[key] = value
        else:
            raise ValueError(f"{where}: unknown key `{key}`; expected a model field "
                             f"({sorted(fields)}) or a kt-train setting.")
    args.model_settings = model
    return args


def model_config(args, source_tokenizer, target_tokenizer, base=None):
    """The run's `TransformerConfig`: a preset (`--config NAME`, the file's
    `model.preset`, or `base`), the file's and `--set` model fields, then
    `--dropout`, `--position-encoding`, `--warmup-steps`; token ids and
    vocabulary sizes from the tokenizers. With `base` (an `--init-from`
    model's config), the preset is replaced by `base`."""
    from keras_transformer.config import PRESETS, TransformerConfig

    fields = dict(getattr(args, "model_settings", {}) or {})
    preset = fields.pop("preset", None)
    if args.config is not None and args.config in PRESETS:
        preset = args.config
    if base is not None and preset is None:
        values = base.to_dict()
    else:
        values = dict(PRESETS[preset or "base"])
    values.update(fields)
    if args.dropout is not None:
        values["dropout"] = args.dropout
    if args.position_encoding is not None:
        values["position_encoding"] = args.position_encoding
    values["warmup_steps"] = args.warmup_steps
    shared = source_tokenizer is target_tokenizer
    values.update(
        vocab_size=source_tokenizer.vocab_size,
        target_vocab_size=None if shared else target_tokenizer.vocab_size,
        pad_id=source_tokenizer.pad_id, bos_id=source_tokenizer.bos_id,
        eos_id=source_tokenizer.eos_id)
    try:
        return TransformerConfig.from_dict(values)
    except (TypeError, ValueError) as e:
        where = args.config_file or "the model settings"
        raise ValueError(f"{where}: {e}") from None


def validate_args(args):
    positive = ("max_length", "batch_tokens", "vocab_size", "vocab_sentences", "train_steps",
                "warmup_steps", "accumulation_steps", "steps_per_execution", "keep_checkpoints",
                "steps_per_epoch", "log_every")
    for name in positive:
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, received "
                             f"{getattr(args, name)}.")
    for name in ("src_vocab_size", "tgt_vocab_size", "early_stopping_patience"):
        value = getattr(args, name, None)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, received {value}.")
    for name in ("keep_best", "bleu_sentences"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, received "
                             f"{getattr(args, name)}.")
    if not 0.0 < args.character_coverage <= 1.0:
        raise ValueError(f"--character-coverage must be in (0, 1], received "
                         f"{args.character_coverage}.")
    if args.batch_tokens < args.max_length:
        raise ValueError(f"--batch-tokens ({args.batch_tokens}) must be at least --max-length "
                         f"({args.max_length}).")
    if args.strategy == "multi_worker_mirrored" and args.logical_cpus > 1:
        raise ValueError("--logical-cpus applies to --strategy mirrored only.")
    if args.jit_compile and args.strategy in ("mirrored", "multi_worker_mirrored"):
        raise ValueError(_JIT_WITH_REPLICAS.format(args.strategy))
    if args.max_minutes is not None:
        if args.max_minutes <= 0:
            raise ValueError(f"--max-minutes must be positive, received {args.max_minutes}.")
        if args.strategy == "multi_worker_mirrored":
            # Workers' clocks would stop them at different steps, and the
            # others would wait forever in the next all-reduce.
            raise ValueError("--max-minutes cannot be used with multi_worker_mirrored: "
                             "workers could stop at different steps; use --train-steps.")
    _validate_data_args(args)
    if args.vocab and (args.src_vocab or args.tgt_vocab):
        raise ValueError("--vocab (shared) and --src-vocab/--tgt-vocab (separate) exclude "
                         "each other.")
    if bool(args.src_vocab) != bool(args.tgt_vocab):
        raise ValueError("--src-vocab and --tgt-vocab go together (or use --vocab for one "
                         "shared vocabulary).")
    if args.separate_vocab and (args.vocab or args.src_vocab):
        raise ValueError("--separate-vocab trains vocabularies; with --vocab or "
                         "--src-vocab/--tgt-vocab nothing is trained.")
    if (args.src_vocab_size or args.tgt_vocab_size) and not args.separate_vocab:
        raise ValueError("--src-vocab-size/--tgt-vocab-size need --separate-vocab.")
    if args.keep_optimizer and not args.init_from:
        raise ValueError("--keep-optimizer applies to --init-from only.")
    if args.early_stopping_patience and not _has_validation(args):
        raise ValueError("--early-stopping-patience needs validation data (--valid-split of "
                         "--data, --valid-src/--valid-tgt or --valid-tsv).")
    if args.subword_sampling is not None and not args.subword_sampling > 0:
        raise ValueError(f"--subword-sampling must be positive, received "
                         f"{args.subword_sampling}.")
    if args.subword_nbest is not None:
        if args.subword_sampling is None:
            raise ValueError("--subword-nbest applies to --subword-sampling only.")
        if args.subword_nbest < 2:
            raise ValueError(f"--subword-nbest must be at least 2, received "
                             f"{args.subword_nbest}.")
    if args.best_metric == "bleu" and not args.bleu_sentences:
        raise ValueError("--best-metric bleu needs --bleu-sentences > 0.")


def _split_files(args, split):
    """`dict(source=, target=, tsv=)` given for `split`, or None."""
    files = {"source": getattr(args, f"{split}_src"), "target": getattr(args, f"{split}_tgt"),
             "tsv": getattr(args, f"{split}_tsv")}
    if not any(files.values()):
        return None
    if files["tsv"] and (files["source"] or files["target"]):
        raise ValueError(f"--{split}-tsv and --{split}-src/--{split}-tgt exclude each other.")
    if not files["tsv"] and not (files["source"] and files["target"]):
        given = "--" + split + ("-src" if files["source"] else "-tgt")
        missing = "--" + split + ("-tgt" if files["source"] else "-src")
        raise ValueError(f"{given} needs {missing} (aligned files), or use --{split}-tsv.")
    return files


def _validate_data_args(args):
    train = _split_files(args, "train")
    for split in ("valid", "test"):
        _split_files(args, split)
    if train is None and not args.data:
        raise ValueError("No training data: give --data, --train-src/--train-tgt, or "
                         "--train-tsv.")
    if train is not None and args.data and not (args.valid_split or args.test_split):
        raise ValueError("--data is not used: the training data comes from files.")
    if args.data and not (args.src_lang and args.tgt_lang):
        raise ValueError(f"--data {args.data} needs --src-lang and --tgt-lang.")


def _has_validation(args):
    return bool(_split_files(args, "valid") or (args.data and args.valid_split))


def _subword_sampling(args, source_tokenizer, target_tokenizer):
    """The `SubwordSampling` that --subword-sampling asks for (None without
    it); ValueError naming the flag where a vocabulary is not unigram."""
    if args.subword_sampling is None:
        return None
    from keras_transformer.data.subword_sampling import SubwordSampling, check_unigram

    for tokenizer in {id(t): t for t in (source_tokenizer, target_tokenizer)}.values():
        try:
            check_unigram(tokenizer.model_proto)
        except ValueError as e:
            raise ValueError(f"--subword-sampling: {e}") from None
    return SubwordSampling(args.subword_sampling, args.subword_nbest or DEFAULT_SUBWORD_NBEST)


def weights_digest(model):
    """sha256 over every weight's bytes: equal digests, equal models."""
    import keras
    import numpy as np

    h = hashlib.sha256()
    for v in model.weights:
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


# Arguments that must not change when a run is resumed: the data, the
# vocabulary and the model.
FIXED_ON_RESUME = ("data", "src_lang", "tgt_lang", "config", "vocab_size", "position_encoding",
                   "train_src", "train_tgt", "train_tsv", "vocab", "src_vocab", "tgt_vocab",
                   "separate_vocab", "src_vocab_size", "tgt_vocab_size", "init_from")
# Arguments that decide the stream of training batches: a resumed run
# continues the uninterrupted run's stream only if they are unchanged.
DATA_STREAM = ("seed", "batch_tokens", "max_length", "shuffle_buffer", "accumulation_steps",
               "cache_tokenized", "jit_compile", "strategy", "logical_cpus", "train_split",
               "subword_sampling", "subword_nbest")
# Fields an --init-from model may change: regularisation and schedule.
FINE_TUNABLE = ("dropout", "attention_dropout", "activation_dropout", "label_smoothing",
                "warmup_steps")


class Corpus:
    """The run's data: `pairs(split)` for "train", "valid", "test" gives a
    fresh `(source_text, target_text)` dataset; `has(split)`; `describe(split)`.

    Files given by path are checked once here (missing, empty, undecodable,
    misaligned or malformed lines are errors naming the file and the line)
    and counted; afterwards they are read without checking again."""

    def __init__(self, args):
        from keras_transformer.data import sources

        self._sources = sources
        self.args = args
        self.files, self.splits, self.counts = {}, {}, {}
        for split, named in (("train", args.train_split), ("valid", args.valid_split),
                             ("test", args.test_split)):
            files = _split_files(args, split)
            if files is not None:
                self.files[split] = files
                self.counts[split] = sources.count_pairs(**files)
            elif args.data and named:
                self.splits[split] = named

    def has(self, split):
        return split in self.files or split in self.splits

    def pairs(self, split):
        if split in self.files:
            return self._sources.pairs_from_paths(**self.files[split], validate=False)
        if split in self.splits:
            args = self.args
            return self._sources.load_pairs(args.data, self.splits[split], args.src_lang,
                                            args.tgt_lang)
        raise ValueError(f"No {split} data was given.")

    def describe(self, split):
        if split in self.files:
            names = " + ".join(v for v in self.files[split].values() if v)
            return f"{self.counts[split]} pairs from {names}"
        return f"split {self.splits[split]!r} of {self.args.data}"


def _checkpoint_run(prefix):
    """The run directory of a checkpoint prefix (`RUN/checkpoints/ckpt-N`,
    `RUN/best/ckpt-N`, `RUN/averaged/ckpt-N`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(prefix)))


def init_source(path):
    """`--init-from PATH` -> `(RunDirectory, checkpoint prefix, reason)`
    (`reason` names the prefix and why it was chosen):
    a run directory's checkpoint as kt-translate would choose it, or a
    checkpoint prefix inside a run directory."""
    import tensorflow as tf

    from keras_transformer.run_directory import RunDirectory

    run = RunDirectory(path)
    if os.path.isdir(path) and run.exists():
        prefix, reason = run.resolve_checkpoint(None)
        return run, prefix, reason
    if os.path.exists(path + ".index"):
        run = RunDirectory(_checkpoint_run(path))
        if not run.exists():
            raise ValueError(f"--init-from {path}: the checkpoint is not inside a run "
                             f"directory ({run.path} has no config.json and vocabulary).")
        tf.train.load_checkpoint(path)  # a readable checkpoint, or an error naming it
        return run, path, f"{path}: the checkpoint given"
    raise ValueError(f"--init-from {path}: neither a run directory (config.json, vocabulary, "
                     "checkpoints) nor a checkpoint prefix (PREFIX.index).")


def _differences(before, after, keys):
    """`{key: (before[key], after[key])}` for the `keys` whose values differ
    (a key missing from `before`, as in older run directories, is skipped)."""
    return {k: (before[k], after[k]) for k in keys if k in before and before[k] != after[k]}


def _same_architecture(source, config, where):
    """Raises naming every field that differs, except `FINE_TUNABLE` ones."""
    a, b = source.to_dict(), config.to_dict()
    differ = _differences(a, b, [k for k in a if k not in FINE_TUNABLE])
    if differ:
        raise ValueError(
            f"--init-from {where}: the new run's model differs from the trained one in "
            f"{differ} (trained, new); fine-tuning keeps the architecture and vocabulary "
            f"(only {', '.join(FINE_TUNABLE)} may change).")


def _vocabularies(args, corpus, init_run):
    """`(source_tokenizer, target_tokenizer)` of a new run (one object twice
    for a shared vocabulary): the --init-from run's, given files, or trained
    on the training data."""
    from keras_transformer.data.batching import check_special_ids
    from keras_transformer.data.sources import sentences_for_vocabulary
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

    given = None
    if args.vocab:
        shared = SubwordTokenizer.from_file(args.vocab)
        given = (shared, shared)
    elif args.src_vocab:
        source = SubwordTokenizer.from_file(args.src_vocab)
        target = SubwordTokenizer.from_file(args.tgt_vocab)
        if source.model_proto == target.model_proto:
            target = source
        try:
            check_special_ids(source, target)
        except ValueError as e:
            raise ValueError(f"--src-vocab {args.src_vocab}, --tgt-vocab {args.tgt_vocab}: "
                             f"{e}") from None
        given = (source, target)
    if init_run is not None:
        trained = init_run.load_tokenizers()
        if given is not None:
            for side, mine, theirs in zip(("source", "target"), given, trained):
                if mine.model_proto != theirs.model_proto:
                    raise ValueError(
                        f"--init-from {args.init_from}: its {side} vocabulary "
                        f"({theirs.vocab_size} ids) is not the one given "
                        f"({mine.vocab_size} ids); a fine-tuned model keeps its vocabulary.")
        return trained
    if given is not None:
        return given
    sizes = ((args.src_vocab_size or args.vocab_size, "source"),
             (args.tgt_vocab_size or args.vocab_size, "target")) if args.separate_vocab \
        else ((args.vocab_size, "both"),)
    made = []
    for size, side in sizes:
        what = "shared" if side == "both" else side
        print(f"Training a {size}-piece {what} vocabulary on up to {args.vocab_sentences} "
              f"training pairs ({corpus.describe('train')}) ...", flush=True)
        sentences = sentences_for_vocabulary(corpus.pairs("train"), args.vocab_sentences,
                                             side=side)
        made.append(SubwordTokenizer(train_sentencepiece(
            sentences, size, model_type=args.vocab_model_type,
            character_coverage=args.character_coverage)))
    return (made[0], made[0]) if len(made) == 1 else tuple(made)


def _prepare_run_directory(args, run, strategy, corpus):
    """Returns `(config, source_tokenizer, target_tokenizer, init)`, `init`
    the `(prefix, reason)` to start from (None when resuming or without
    --init-from): from the run directory when it exists; otherwise the
    chief makes the vocabulary and writes config and vocabulary, and other
    workers wait for them."""
    from keras_transformer.training.strategy import is_chief

    if run.exists():
        previous = run.load_args()
        changed = _differences(previous, vars(args), FIXED_ON_RESUME)
        if changed:
            raise ValueError(
                f"{run.path} was created with different settings {changed} "
                "(was, now); use a new --run-dir or the original arguments."
            )
        source, target = run.load_tokenizers()
        config = run.load_config()
        wanted = model_config(args, source, target, base=config if args.init_from else None)
        was = config.to_dict()
        differ = _differences(was, wanted.to_dict(), was)
        if differ:
            raise ValueError(f"{run.path} was created with model settings that differ from "
                             f"these: {differ} (was, now); use a new --run-dir or the "
                             "original settings.")
        stream = _differences(previous, vars(args), DATA_STREAM)
        if stream and is_chief(strategy):
            print(f"Warning: {stream} (was, now) changed since the run began, so the resumed "
                  "run reads a different stream of batches than an uninterrupted run would.",
                  flush=True)
        init = None
        if args.init_from and run.latest_training_checkpoint() is None:
            # Stopped before its first checkpoint: start from the weights again.
            _, prefix, reason = init_source(args.init_from)
            init = (prefix, reason)
        return config, source, target, init
    if is_chief(strategy):
        init = init_run = None
        if args.init_from:
            init_run, prefix, reason = init_source(args.init_from)
            init = (prefix, reason)
        source, target = _vocabularies(args, corpus, init_run)
        base = init_run.load_config() if init_run is not None else None
        config = model_config(args, source, target, base=base)
        if base is not None:
            _same_architecture(base, config, args.init_from)
        os.makedirs(run.path, exist_ok=True)
        saved = {k: v for k, v in vars(args).items() if k != "model_settings"}
        saved["model_settings"] = dict(getattr(args, "model_settings", {}) or {})
        run.save_args(saved)
        run.save_tokenizers(source, None if target is source else target)
        run.save_config(config)  # last: `run.exists()` means complete.
        return config, source, target, init
    deadline = time.time() + args.wait_for_chief
    while not run.exists():
        if time.time() > deadline:
            raise TimeoutError(
                f"Waited {args.wait_for_chief}s for the chief to write {run.path}; is the run "
                "directory on a file system shared by all workers?")
        time.sleep(0.5)
    time.sleep(0.5)
    source, target = run.load_tokenizers()
    init = None
    if args.init_from:
        _, prefix, reason = init_source(args.init_from)
        init = (prefix, reason)
    return run.load_config(), source, target, init


def _restore_initial_weights(model, optimizer, init, keep_optimizer):
    """Loads `--init-from`'s checkpoint into a new run's model (and, with
    `keep_optimizer`, optimizer)."""
    import tensorflow as tf

    prefix, reason = init
    if keep_optimizer:
        names = [name for name, _ in tf.train.list_variables(prefix)]
        if not any(name.startswith("optimizer/") for name in names):
            raise ValueError(
                f"--keep-optimizer: {prefix} holds no optimizer state ({reason}); give "
                "--init-from a training checkpoint (RUN/checkpoints/ckpt-N) or drop "
                "--keep-optimizer.")
        tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
            prefix).expect_partial().assert_existing_objects_matched()
    else:
        # Restored through a model without an optimizer: a checkpoint of the
        # model also holds the optimizer it was compiled with (its step and
        # moments), which a fine-tuning run starts afresh.
        from keras_transformer.transformer import Transformer

        bare = Transformer(model.config)
        bare.build()
        tf.train.Checkpoint(model=bare).restore(
            prefix).expect_partial().assert_existing_objects_matched()
        for variable, value in zip(model.weights, bare.weights):
            variable.assign(value)
    print(f"Initialised from {reason}"
          f"{'; optimizer and step kept' if keep_optimizer else '; fresh optimizer'}.",
          flush=True)


class DataPosition:
    """How many micro-batches the run has taken from its training stream,
    as a variable saved in every checkpoint, so a resumed run skips exactly
    those batches of the same stream (same seed) and goes on with the
    batches an uninterrupted run would have seen."""

    def __init__(self):
        import tensorflow as tf

        with tf.device("/CPU:0"):
            self.variable = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="data_position")

    def value(self):
        return int(self.variable.numpy())

    def callback(self, batches_per_call):
        import keras

        variable = self.variable

        class Count(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                variable.assign_add(batches_per_call)

        return Count()


def _translation_fn(model, source_tokenizer, target_tokenizer, search):
    """`translate_fn(list of str) -> list of str` over the model being
    trained, for validation BLEU: beam search with the paper's settings, or
    greedy."""
    from keras_transformer.export.translator import Translator

    translator = Translator(model, source_tokenizer, target_tokenizer=(
        None if target_tokenizer is source_tokenizer else target_tokenizer))
    if search == "greedy":
        return lambda sentences: translator.sample(sentences, temperature=0.0)[0]
    return lambda sentences: translator.translate(sentences)[0]


# Test sets at least this long are translated with the XLA-compiled search.
XLA_TEST_SET_SENTENCES = 256


def _score_test_set(args, run, corpus, selector):
    """Translates the test data with the chosen checkpoint and returns the
    sacreBLEU scores."""
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export.translator import translator_from_run_directory

    translator = translator_from_run_directory(run, selector)
    pairs = list(corpus.pairs("test").as_numpy_iterator())
    sources = [s for s, _ in pairs]
    references = [t.decode("utf-8", "replace") for _, t in pairs]
    # XLA compiles a search per length bucket (seconds each), which pays
    # back only over a test set of some size.
    hypotheses, _ = translator.translate(sources,
                                         jit_compile=len(sources) >= XLA_TEST_SET_SENTENCES)
    return score_translations(hypotheses, references)


def train(args, argv=None, extra_callbacks=()):
    """Runs training as `kt-train` does.

    Args:
        args: parsed `build_parser()` arguments (a settings file and `--set`
            are applied here, see `resolve_settings`).
        argv: the command line `args` came from, so its flags win over the
            settings file; None: flags at their default count as not given.
        extra_callbacks: more Keras callbacks.

    Returns: the trained `Transformer`.
    """
    args = resolve_settings(args, argv)
    validate_args(args)
    from keras_transformer.training.strategy import make_strategy

    # The strategy first: MultiWorkerMirroredStrategy and logical CPUs need
    # TensorFlow uninitialised.
    strategy = make_strategy(args.strategy, args.logical_cpus)
    if args.jit_compile and strategy.num_replicas_in_sync > 1:
        raise ValueError(_JIT_WITH_REPLICAS.format(type(strategy).__name__))

    import keras

    from keras_transformer.data import batching
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.metrics import MaskedAccuracy
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.schedules import transformer_adam
    from keras_transformer.training import callbacks as cb
    from keras_transformer.training.checkpoints import (
        CheckpointWriter, StepCheckpoint, build_for_restore, optimizer_step)
    from keras_transformer.training.selection import BestCheckpoints, ValidationBleu
    from keras_transformer.training.strategy import choose_precision, is_chief, set_precision
    from keras_transformer.transformer import Transformer

    corpus = Corpus(args)
    # Seed before creating the tokenizer: seeding destroys eager resources.
    keras.utils.set_random_seed(args.seed)
    # Resolved before the run directory records the arguments.
    args.precision, precision_reason = choose_precision(args.precision)
    set_precision(args.precision)
    chief = is_chief(strategy)
    run = RunDirectory(args.run_dir)
    config, source_tokenizer, target_tokenizer, init = _prepare_run_directory(
        args, run, strategy, corpus)
    replicas = strategy.num_replicas_in_sync
    if chief:
        for split, name in (("train", "Training"), ("valid", "Validation"), ("test", "Test")):
            if corpus.has(split):
                print(f"{name} data: {corpus.describe(split)}.", flush=True)
        print(f"Strategy {type(strategy).__name__} with {replicas} replica(s); precision "
              f"{args.precision} ({precision_reason}); {args.batch_tokens} tokens per "
              f"replica batch x {replicas} replicas x {args.accumulation_steps} accumulation = "
              f"{args.batch_tokens * replicas * args.accumulation_steps} tokens per update "
              "(upper bound, padding included).", flush=True)

    position = DataPosition()
    with strategy.scope():
        model = Transformer(config)
        optimizer = transformer_adam(
            config.d_model, warmup_steps=config.warmup_steps, scale=args.lr_scale,
            gradient_accumulation_steps=(args.accumulation_steps
                                         if args.accumulation_steps > 1 else None))
        if args.accumulation_steps > 1:
            optimizer.learning_rate = cb.PerUpdateSchedule(
                optimizer._learning_rate, args.accumulation_steps)
        if args.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
            metrics=[MaskedAccuracy(pad_id=config.pad_id), cb.TargetTokens(config.pad_id)],
            steps_per_execution=args.steps_per_execution,
            jit_compile=args.jit_compile,
        )
        # Logged values are already global (synchronised metric variables;
        # see Transformer.compute_loss): take the first replica's. Keras's
        # default ("mean") fails under MultiWorkerMirroredStrategy.
        model.distribute_reduction_method = "first"
        build_for_restore(model, optimizer)
        writer = CheckpointWriter(model, optimizer, run.checkpoint_dir,
                                  max_to_keep=args.keep_checkpoints, strategy=strategy)
        writer.checkpoint.data_position = position.variable
        # Dropout's random streams (SeedGenerator states), which are not
        # weights: restored, a resumed run draws the masks it would have.
        weights = {id(v) for v in model.weights}
        writer.checkpoint.random_states = [v for v in model.variables if id(v) not in weights]
        restored = writer.restore_latest()
        if not restored and init is not None:
            _restore_initial_weights(model, optimizer, init, args.keep_optimizer)
    start_step = optimizer_step(optimizer)
    if restored:
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        print(f"Resumed from {restored} at step {start_step}; learning rate {lr!r}", flush=True)
    validating = _has_validation(args)
    metric = args.best_metric or ("bleu" if args.bleu_sentences else "loss")
    selection = None
    if validating and (args.keep_best or args.early_stopping_patience):
        selection = BestCheckpoints(model, run, metric=metric, keep=max(args.keep_best, 1),
                                    patience=args.early_stopping_patience, strategy=strategy)
    if start_step >= args.train_steps:
        print(f"Already at step {start_step} >= --train-steps {args.train_steps}; nothing to do.")
        return model
    if selection is not None and selection.should_stop():
        print(f"Nothing to do: {selection.summary()}", flush=True)
        return model

    # Data: every replica gets its own token-bucketed batch; a resumed run
    # skips the batches its checkpoint had already taken.
    length_filter = batching.LengthFilter(args.max_length)
    # One pipeline per worker feeds each of its replicas a batch per step.
    skip = position.value() * len(strategy.extended.worker_devices)
    if skip and chief:
        print(f"Skipping the {skip} micro-batches already trained on, to continue the same "
              "stream of batches.", flush=True)
    target = None if target_tokenizer is source_tokenizer else target_tokenizer

    subword_sampling = _subword_sampling(args, source_tokenizer, target_tokenizer)
    if subword_sampling is not None and chief:
        print(f"Subword sampling: each side of a training pair gets a segmentation drawn "
              f"from its {subword_sampling.nbest} most likely ones with probability "
              f"P^{subword_sampling.alpha}, anew each time (the candidates are computed "
              "once, as the first batch is read).", flush=True)

    def train_fn(context):
        pairs = corpus.pairs("train").shard(
            context.num_input_pipelines, context.input_pipeline_id)
        return batching.token_batches(
            pairs, source_tokenizer, args.batch_tokens, args.max_length, length_filter,
            shuffle_buffer=args.shuffle_buffer, seed=args.seed, repeat=True,
            cache_tokenized=args.cache_tokenized, fixed_shapes=args.jit_compile,
            target_tokenizer=target, skip_batches=skip, subword_sampling=subword_sampling)

    train_ds = batching.distributed_dataset(strategy, train_fn)
    val_ds = None
    if validating:
        val_filter = batching.LengthFilter(args.max_length)

        def val_fn(context):
            pairs = corpus.pairs("valid").shard(
                context.num_input_pipelines, context.input_pipeline_id)
            return batching.token_batches(pairs, source_tokenizer, args.batch_tokens,
                                          args.max_length, val_filter,
                                          fixed_shapes=args.jit_compile,
                                          target_tokenizer=target)

        val_ds = batching.distributed_dataset(strategy, val_fn)

    callbacks = [
        # Counted before the checkpoint callback saves it.
        position.callback(args.steps_per_execution),
        cb.StopAtStep(args.train_steps),
        *([cb.StopAfterTime(args.max_minutes * 60)] if args.max_minutes else []),
        StepCheckpoint(writer, args.checkpoint_every),
        cb.TrainingLogger(run.log_dir if chief else None, args.log_every, length_filter),
        *extra_callbacks,
    ]
    if validating and args.bleu_sentences:
        pairs = list(corpus.pairs("valid").take(args.bleu_sentences).as_numpy_iterator())
        callbacks.append(ValidationBleu(
            _translation_fn(model, source_tokenizer, target_tokenizer, args.bleu_search),
            [s.decode("utf-8", "replace") for s, _ in pairs],
            [t.decode("utf-8", "replace") for _, t in pairs],
            log_dir=run.log_dir if chief else None))
    if selection is not None:
        callbacks.append(selection)

    initial_epoch = start_step // args.steps_per_epoch
    epochs = initial_epoch + math.ceil((args.train_steps - start_step) / args.steps_per_epoch)
    with warnings.catch_warnings():
        # The training data repeats forever (callbacks stop the run), so it
        # cannot run out; the validation set has no known length, and Keras
        # (3.15) warns "Your input ran out of data; interrupting training" when
        # its first pass ends, which is how it learns that length. A false
        # alarm, fixed upstream in keras-team/keras#23360.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        model.fit(
            train_ds,
            validation_data=val_ds,
            steps_per_epoch=args.steps_per_epoch * args.accumulation_steps,
            initial_epoch=initial_epoch,
            epochs=epochs,
            callbacks=callbacks,
            verbose=args.verbose if chief else 0,
            shuffle=False,  # the pipeline shuffles (--shuffle-buffer)
        )
    counts = length_filter.counts()
    print(f"Training finished at step {optimizer_step(optimizer)}; weights sha256 "
          f"{weights_digest(model)}; training pairs dropped for length: {counts['dropped']} "
          f"of {counts['kept'] + counts['dropped']} read.", flush=True)
    if chief:
        _final_summary(args, run, corpus, selection)
    return model


def _final_summary(args, run, corpus, selection):
    """Says which checkpoint to ship and why, and scores it on the test data."""
    if selection is not None and run.best_checkpoints():
        selector = "best"
        print(f"Checkpoint selection: {selection.summary()}", flush=True)
    else:
        selector = "last"
    prefix, reason = run.resolve_checkpoint(selector)
    print(f"The checkpoint to ship: {reason}. Export it with: kt-export "
          f"--run-dir {run.path} --checkpoint {selector}", flush=True)
    if corpus.has("test"):
        scores = _score_test_set(args, run, corpus, prefix)
        print(f"Test BLEU {scores['bleu']:.2f} with {os.path.basename(prefix)} "
              f"({corpus.describe('test')}): {scores['bleu_text']}", flush=True)


def main(argv=None, **kwargs):
    """kt-train; `kwargs` go to `train`. Returns the exit status (2: bad
    arguments or data, with the reason on stderr; KT_TRACEBACK=1 raises)."""
    startup.start(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        train(args, argv=argv, **kwargs)
    except (ValueError, FileNotFoundError, TimeoutError) as e:
        if os.environ.get("KT_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
