"""`TrainingConfig`: every setting of a training run (what `kt-train`'s flags
set), its settings file and `--set` overrides, and the checks each setting
gets.

Precedence, lowest first: the dataclass defaults, the settings file's
`training:` section, the values given explicitly (flags on a command line,
keyword arguments in a script), then `--set KEY=VALUE` assignments. Model
fields (the file's `model:` section, `--set` model fields) are kept in
`TrainingConfig.model_settings` and applied by `model_config`.
"""

import copy
import dataclasses
import os

from keras_transformer.config import (
    PRESETS,
    TransformerConfig,
    check_model_fields,
    is_settings_file,
    load_settings_file,
    parse_assignment,
)
from keras_transformer.training.strategy import PRECISIONS, STRATEGIES

# Kudo (2018)'s l for subword sampling in translation.
DEFAULT_SUBWORD_NBEST = 64


# The groups of kt-train's --help and docs/configuration.md, in order.
DATA, VOCABULARY, MODEL = "data", "vocabulary", "model"
OPTIMISATION = "optimisation"
VALIDATION = "validation, checkpoint selection and early stopping"
CHECKPOINTS = "checkpoints and logging"
GROUP_NOTES = {DATA: "Either --data (a named source) or files by path; per split, paths win."}


def _setting(default, kind, group, help, choices=None, minimum=None, maximum=None,
             open_minimum=False, open_maximum=False, metavar=None, flag=None, aliases=()):
    """A setting: a field whose metadata declares its kt-train `flag`
    (default: the name with dashes) and `aliases`, `help`, `group`,
    `choices`, and range
    (`minimum`/`maximum`, `open_*`: the bound itself excluded); `validate`
    checks the range and `build_parser` and docs/configuration.md read the
    rest."""
    return dataclasses.field(default=default, metadata={
        "kind": kind, "group": group, "help": help, "choices": choices,
        "range": (minimum, maximum, open_minimum, open_maximum), "metavar": metavar,
        "flag": flag, "aliases": aliases})


def _positive(default, group, help, kind=int, **more):
    return _setting(default, kind, group, help, minimum=0, open_minimum=True, **more)


def _split_file(split, what, side):
    words = {"src": f"{what} source sentences, one per line (plain or gzipped)",
             "tgt": f"{what} target sentences, aligned line by line with --{split}-src",
             "tsv": f"{what} pairs, one `source<TAB>target` per line (plain or gzipped)"}
    return _setting(None, str, DATA, words[side])


def range_words(field):
    """A setting's range in words ("positive", "at least 2", "in [0, 1)"),
    or None."""
    low, high, open_low, open_high = field.metadata["range"]
    if low is None and high is None:
        return None
    if high is None:
        return "positive" if (low == 0 and open_low) else f"at least {low}"
    return f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"


def in_range(field, value):
    """Whether `value` (a number) is in the setting's range; NaN never is."""
    low, high, open_low, open_high = field.metadata["range"]
    if low is not None and not (value > low if open_low else value >= low):
        return False
    return high is None or (value < high if open_high else value <= high)


@dataclasses.dataclass
class TrainingConfig:
    """Every setting of a training run; `kt-train --help` documents each
    (the flag `--batch-tokens` is the field `batch_tokens`; `--validate-every`
    is `steps_per_epoch`).

    `run_dir` is the run directory (created or resumed); `config` a Table 3
    preset name or a YAML/JSON settings file (`model:` and `training:`
    sections); `model_settings` the model fields over the preset, as a
    settings file's `model:` section gives them.

    Build it with keywords, or from a settings file with
    `TrainingConfig.from_file`; `resolve_settings` applies a file and
    `--set` assignments with kt-train's precedence; `validate()` raises
    `ValueError` naming the setting (as its flag) for a bad value.

    Example:

    ```python
    import keras_transformer as kt

    config = kt.TrainingConfig(run_dir="runs/mine", train_tsv="train.tsv",
                               valid_tsv="dev.tsv", config="tiny", vocab_size=400,
                               train_steps=2000, batch_tokens=2048)
    config.validate()
    assert config.steps_per_epoch == 1000  # validations every 1,000 updates
    ```
    """

    run_dir: str = None
    data: str = _setting(
        None, str, DATA, "`text:<dir of <split>.<lang>[.gz]>`, `tfds:<name>/<config>`, or "
        "`builtin` (the generated en <-> synth corpus)")
    src_lang: str = _setting(None, str, DATA, "source language suffix/feature, e.g. en "
                             "(needed by --data)")
    tgt_lang: str = _setting(None, str, DATA, "target language suffix/feature, e.g. de "
                             "(needed by --data)")
    train_split: str = _setting("train", str, DATA, "split of --data to train on")
    valid_split: str = _setting("validation", str, DATA, "split of --data to validate on; "
                                "'' disables validation")
    test_split: str = _setting("", str, DATA, "split of --data translated and scored at "
                               "the end ('' : none)")
    train_src: str = _split_file("train", "training", "src")
    train_tgt: str = _split_file("train", "training", "tgt")
    train_tsv: str = _split_file("train", "training", "tsv")
    valid_src: str = _split_file("valid", "validation", "src")
    valid_tgt: str = _split_file("valid", "validation", "tgt")
    valid_tsv: str = _split_file("valid", "validation", "tsv")
    test_src: str = _split_file("test", "test", "src")
    test_tgt: str = _split_file("test", "test", "tgt")
    test_tsv: str = _split_file("test", "test", "tsv")
    max_length: int = _positive(256, DATA, "drop training pairs with a side longer than "
                                "this many tokens (counted, logged)")
    batch_tokens: int = _positive(4096, DATA, "token budget per batch, per replica and side, "
                                  "padding included (paper: ~25000 per step over 8 GPUs)")
    shuffle_buffer: int = _setting(100_000, int, DATA, "pairs")
    cache_tokenized: bool = _setting(
        False, bool, DATA, "tokenize the training pairs once and keep their ids in memory "
        "(saves the CPU that tokenizing every epoch takes; the ids of every pair must fit "
        "in memory: fine for Multi30k, ~1.5 GB for WMT14)")
    input_autotune: str = _setting(
        "on", str, DATA, "tf.data autotuning of the training stream. Off spares the wait of "
        "up to a minute that deleting an autotuned iterator can cost when training ends: "
        "worth it for runs of minutes", choices=("on", "off"))
    subword_sampling: float = _positive(
        None, DATA, "subword regularization (Kudo 2018): each training pair's sides get a "
        "segmentation drawn from their --subword-nbest most likely ones with probability "
        "P^ALPHA, anew every epoch (0.1-0.5; unigram vocabularies; the candidates are kept "
        "in memory). Validation, BLEU and translation keep the best segmentation",
        kind=float, metavar="ALPHA")
    subword_nbest: int = _setting(
        None, int, DATA, f"candidates per sentence for --subword-sampling (default "
        f"{DEFAULT_SUBWORD_NBEST})", minimum=2, metavar="L")
    seed: int = _setting(1, int, DATA, "weights, dropout and data order; a resumed run keeps "
                         "its seed")
    vocab: str = _setting(None, str, VOCABULARY, "an existing SentencePiece model to use as "
                          "the shared vocabulary (instead of training one)")
    src_vocab: str = _setting(None, str, VOCABULARY, "an existing SentencePiece model for "
                              "the source side (with --tgt-vocab)")
    tgt_vocab: str = _setting(None, str, VOCABULARY, "an existing SentencePiece model for "
                              "the target side (with --src-vocab)")
    separate_vocab: bool = _setting(False, bool, VOCABULARY, "train separate source and "
                                    "target vocabularies (default: one shared, paper 3.4)")
    vocab_size: int = _positive(37000, VOCABULARY, "pieces of a trained vocabulary (paper: "
                                "37000 shared for en-de)")
    src_vocab_size: int = _positive(None, VOCABULARY, "with --separate-vocab: source pieces "
                                    "(default --vocab-size)")
    tgt_vocab_size: int = _positive(None, VOCABULARY, "with --separate-vocab: target pieces "
                                    "(default --vocab-size)")
    vocab_model_type: str = _setting("unigram", str, VOCABULARY, "SentencePiece algorithm of "
                                     "a trained vocabulary", choices=("unigram", "bpe"))
    character_coverage: float = _setting(
        1.0, float, VOCABULARY, "share of characters a trained vocabulary covers (1.0 for "
        "alphabetic scripts; ~0.9995 for Chinese or Japanese), the rest by byte fallback",
        minimum=0, maximum=1, open_minimum=True)
    vocab_sentences: int = _positive(1_000_000, VOCABULARY, "training pairs read to train "
                                     "the vocabulary")
    config: str = None
    model_settings: dict = dataclasses.field(default_factory=dict)
    config_file: str = None
    dropout: float = _setting(None, float, MODEL, "override P_drop")
    r_drop: float = _setting(
        None, float, MODEL, "R-Drop: each batch twice, with the symmetric KL between the two "
        "passes' distributions weighted ALPHA added to the loss (about twice the compute "
        "per update; 0: off, the default)", metavar="ALPHA")
    position_encoding: str = _setting(
        None, str, MODEL, "override the positional encoding ('none': an ablation)",
        choices=("sinusoidal", "learned", "none"))
    init_from: str = _setting(
        None, str, MODEL, "fine-tune: start a new run from a trained run's weights (its "
        "averaged, best or last checkpoint, as kt-translate chooses) or from a checkpoint "
        "prefix; same vocabulary and architecture, fresh optimizer and schedule",
        metavar="RUN_DIR|CHECKPOINT")
    keep_optimizer: bool = _setting(False, bool, MODEL, "with --init-from a training "
                                    "checkpoint: also take its optimizer slots and step "
                                    "(the schedule continues)")
    train_steps: int = _positive(100_000, OPTIMISATION, "total optimizer updates (paper: "
                                 "100k base, 300k big)")
    max_minutes: float = _positive(
        None, OPTIMISATION, "also stop after this much training wall time (validation "
        "included), with a checkpoint, like fairseq's --stop-time-hours; one-process "
        "strategies only", kind=float)
    warmup_steps: int = _positive(4000, OPTIMISATION, "updates of linear warm-up of the "
                                  "learning rate (paper 5.3)")
    lr_scale: float = _setting(1.0, float, OPTIMISATION, "multiplies the schedule")
    ema: float = _setting(
        0.0, float, OPTIMISATION, "keep an exponential moving average of the weights, "
        "average = DECAY * average + (1 - DECAY) * weights after each update, and validate, "
        "select best checkpoints and end with it (e.g. 0.999; 0: off, the default)",
        minimum=0, maximum=1, open_maximum=True, metavar="DECAY")
    accumulation_steps: int = _positive(1, OPTIMISATION, "micro-batches per update "
                                        "(effective batch = batch-tokens x replicas x this)")
    precision: str = _setting(
        "auto", str, OPTIMISATION, "auto: mixed_bfloat16 where the CPU or GPU multiplies "
        "bfloat16 in hardware (AVX512-BF16/AMX CPUs, Ampere or later GPUs), else float32; "
        "the choice is printed and recorded in train_args.json. mixed_float16 adds dynamic "
        "loss scaling", choices=("auto",) + PRECISIONS)
    strategy: str = _setting(None, str, OPTIMISATION, "default: mirrored with more than one "
                             "GPU, else one_device", choices=STRATEGIES)
    logical_cpus: int = _setting(0, int, OPTIMISATION, "split the CPU into N devices for "
                                 "`mirrored` (testing without GPUs)")
    steps_per_execution: int = _positive(1, OPTIMISATION, "updates per call into the "
                                         "compiled training step (Keras' steps_per_execution)")
    jit_compile: bool = _setting(
        False, bool, OPTIMISATION, "compile the training and validation steps with XLA; "
        "batches are then padded to their length bucket's longest length (one shape, so one "
        "compilation, per bucket). Keras leaves XLA off under any tf.distribute strategy, "
        "and so by default does this trainer (docs/training.md: when it pays)")
    steps_per_epoch: int = _positive(
        1000, VALIDATION, "updates between validations (validation loss, and BLEU with "
        "--bleu-sentences)", flag="--validate-every", aliases=("--steps-per-epoch",))
    bleu_sentences: int = _setting(200, int, VALIDATION, "validation sentences translated "
                                   "for BLEU (sacreBLEU) at every validation; 0 disables",
                                   minimum=0)
    bleu_search: str = _setting("beam", str, VALIDATION, "how validation sentences are "
                                "translated (beam: 4, alpha 0.6)", choices=("beam", "greedy"))
    best_metric: str = _setting(None, str, VALIDATION, "what chooses the best checkpoints "
                                "(default: bleu when --bleu-sentences > 0, else loss)",
                                choices=("bleu", "loss"))
    keep_best: int = _setting(3, int, VALIDATION, "keep the best K checkpoints (model "
                              "weights) in RUN_DIR/best/; 0 disables", minimum=0)
    early_stopping_patience: int = _positive(None, VALIDATION, "stop after this many "
                                             "validations in a row without a new best")
    checkpoint_every: int = _setting(1000, int, CHECKPOINTS, "updates (0: only at the end)")
    keep_checkpoints: int = _positive(20, CHECKPOINTS, "keep the last K (average 5 for base, "
                                      "20 for big)")
    log_every: int = _positive(100, CHECKPOINTS, "TensorBoard interval in updates")
    verbose: int = _setting(1, int, CHECKPOINTS, "1: progress bar, 2: one line per epoch",
                            choices=(0, 1, 2))
    wait_for_chief: float = _setting(600.0, float, CHECKPOINTS, "seconds a non-chief worker "
                                     "waits for the chief's vocabulary")

    @classmethod
    def from_file(cls, path, **values):
        """The settings of a YAML/JSON file (`model:`, `training:`
        sections), with `values` over them."""
        return resolve_settings(cls(config=os.fspath(path), **values), explicit=set(values))

    def validate(self):
        """Raises `ValueError` naming the setting (as its kt-train flag)
        for a value out of range or settings that exclude each other."""
        validate(self)
        return self

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)


def settings_fields():
    """`{name: dataclasses.Field}` of the settings a file's `training:`
    section and `--set` may give (every field but the run directory, the
    preset or file, and the model fields)."""
    return {f.name: f for f in dataclasses.fields(TrainingConfig) if "kind" in f.metadata}


# Names that are both a model field and a setting: unqualified in --set,
# they set the setting (the model field follows it).
_SETTING_MODEL_FIELDS = {"dropout", "r_drop", "position_encoding", "warmup_steps"}


def convert_setting(field, key, value, where):
    """A file or --set value for the setting `field`, typed as the setting."""
    kind, choices = field.metadata["kind"], field.metadata["choices"]
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: `{key}` must be true or false, received {value!r}.")
        return value
    if value is None:
        return None
    if kind is not str and not (kind is float and isinstance(value, int)
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
    elif kind is str and isinstance(value, bool) and choices and {"on", "off"} <= set(choices):
        value = "on" if value else "off"  # YAML 1.1 reads an unquoted on/off as a bool
    elif kind is str and not isinstance(value, str):
        value = str(value)
    if choices is not None and value not in choices:
        raise ValueError(f"{where}: `{key}` must be one of {list(choices)}, received "
                         f"{value!r}.")
    return value


def resolve_settings(config, explicit=None, assignments=()):
    """Applies `config.config` (when it names a settings file) and `--set`
    `assignments` to `config`; returns a new `TrainingConfig`.

    Args:
        config: a `TrainingConfig`.
        explicit: names of the settings given explicitly (command-line
            flags, keywords), which the file does not override; None: the
            settings that differ from their defaults.
        assignments: `KEY=VALUE` strings (`--set`); they override
            everything. `KEY` may be qualified: `model.dropout`,
            `training.batch_tokens`.

    Raises `ValueError` naming the file or the `--set` and the key.
    """
    fields = settings_fields()
    config = copy.copy(config)
    config.model_settings = dict(config.model_settings or {})
    sections = {"model": {}, "training": {}}
    config.config_file = None
    if config.config is not None and is_settings_file(config.config):
        config.config_file = os.path.abspath(config.config)
        sections = load_settings_file(config.config)
    if explicit is None:
        explicit = {name for name, f in fields.items() if getattr(config, name) != f.default}

    def apply(key, value, where, force):
        if key not in fields:
            raise ValueError(f"{where}: unknown training setting `{key}`; settings are the "
                             f"kt-train flags: {sorted(fields)}.")
        if force or key not in explicit:
            setattr(config, key, convert_setting(fields[key], key, value, where))

    where_file = f"{config.config}, training"
    for key, value in sections["training"].items():
        apply(key, value, where_file, force=False)
    model = {**sections["model"], **config.model_settings}
    model_fields = {f.name for f in dataclasses.fields(TransformerConfig)} | {"preset"}
    for text in assignments:
        key, value = parse_assignment(text)
        where = f"--set {text}"
        section, _, name = key.partition(".")
        if name and section in ("model", "training"):
            if section == "model":
                check_model_fields({name: value}, where)
                model[name] = value
            else:
                apply(name, value, where, force=True)
        elif key in _SETTING_MODEL_FIELDS or (key in fields and key not in model_fields):
            apply(key, value, where, force=True)
        elif key in model_fields and key in fields:
            raise ValueError(f"{where}: `{key}` is both a model field and a kt-train setting; "
                             f"write model.{key}= or training.{key}=.")
        elif key in model_fields:
            model[key] = value
        else:
            raise ValueError(f"{where}: unknown key `{key}`; expected a model field "
                             f"({sorted(model_fields)}) or a kt-train setting.")
    config.model_settings = model
    return config


def model_config(config, source_tokenizer, target_tokenizer, base=None):
    """The run's `TransformerConfig`: a preset (`config.config` naming one,
    the file's `model.preset`, or `base`), the model settings, then
    `dropout`, `r_drop`, `position_encoding`, `warmup_steps`; token ids and
    vocabulary sizes from the tokenizers. With `base` (an `init_from`
    model's config), the preset is replaced by `base`."""
    fields = dict(config.model_settings or {})
    preset = fields.pop("preset", None)
    if config.config is not None and config.config in PRESETS:
        preset = config.config
    if base is not None and preset is None:
        values = base.to_dict()
    else:
        values = dict(PRESETS[preset or "base"])
    values.update(fields)
    if config.dropout is not None:
        values["dropout"] = config.dropout
    if config.r_drop is not None:
        values["r_drop"] = config.r_drop
    if config.position_encoding is not None:
        values["position_encoding"] = config.position_encoding
    values["warmup_steps"] = config.warmup_steps
    shared = source_tokenizer is target_tokenizer
    values.update(
        vocab_size=source_tokenizer.vocab_size,
        target_vocab_size=None if shared else target_tokenizer.vocab_size,
        pad_id=source_tokenizer.pad_id, bos_id=source_tokenizer.bos_id,
        eos_id=source_tokenizer.eos_id)
    try:
        return TransformerConfig.from_dict(values)
    except (TypeError, ValueError) as e:
        where = config.config_file or "the model settings"
        raise ValueError(f"{where}: {e}") from None


# Keras 3 compiles a replica's step with the variables of every replica in
# it; TensorFlow then refuses to read another device's variable ("Trying to
# access resource ... located in device ...CPU:1 from device ...CPU:0").
JIT_WITH_REPLICAS = ("--jit-compile needs one device; the {} strategy runs replicas, whose "
                     "steps Keras 3 cannot compile with XLA. Drop --jit-compile, or use "
                     "--strategy one_device.")


def _flag(name):
    """A setting's kt-train flag."""
    field = settings_fields().get(name)
    flag = field.metadata.get("flag") if field is not None else None
    return flag or "--" + name.replace("_", "-")


def validate(config):
    """Raises `ValueError` naming the setting (as its kt-train flag) for a
    value out of range or settings that exclude each other."""
    for name, field in settings_fields().items():
        kind, value = field.metadata["kind"], getattr(config, name)
        if value is None or kind is str and isinstance(value, str):
            continue
        ok = isinstance(value, bool) if kind is bool else (
            isinstance(value, (int, float) if kind is float else int)
            and not isinstance(value, bool))
        if not ok:
            raise ValueError(f"{_flag(name)} must be {kind.__name__}, received {value!r}.")
    for name, field in settings_fields().items():
        value = getattr(config, name)
        if value is not None and field.metadata["kind"] in (int, float) \
                and not in_range(field, value):
            raise ValueError(f"{_flag(name)} must be {range_words(field)}, received {value}.")
    for name, field in settings_fields().items():
        choices, value = field.metadata["choices"], getattr(config, name)
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"{_flag(name)} must be one of {list(choices)}, received "
                             f"{value!r}.")
    if config.batch_tokens < config.max_length:
        raise ValueError(f"--batch-tokens ({config.batch_tokens}) must be at least "
                         f"--max-length ({config.max_length}).")
    if config.strategy == "multi_worker_mirrored" and config.logical_cpus > 1:
        raise ValueError("--logical-cpus applies to --strategy mirrored only.")
    if config.jit_compile and config.strategy in ("mirrored", "multi_worker_mirrored"):
        raise ValueError(JIT_WITH_REPLICAS.format(config.strategy))
    if config.max_minutes is not None:
        if config.strategy == "multi_worker_mirrored":
            # Workers' clocks would stop them at different steps, and the
            # others would wait forever in the next all-reduce.
            raise ValueError("--max-minutes cannot be used with multi_worker_mirrored: "
                             "workers could stop at different steps; use --train-steps.")
    _validate_data(config)
    if config.vocab and (config.src_vocab or config.tgt_vocab):
        raise ValueError("--vocab (shared) and --src-vocab/--tgt-vocab (separate) exclude "
                         "each other.")
    if bool(config.src_vocab) != bool(config.tgt_vocab):
        raise ValueError("--src-vocab and --tgt-vocab go together (or use --vocab for one "
                         "shared vocabulary).")
    if config.separate_vocab and (config.vocab or config.src_vocab):
        raise ValueError("--separate-vocab trains vocabularies; with --vocab or "
                         "--src-vocab/--tgt-vocab nothing is trained.")
    if (config.src_vocab_size or config.tgt_vocab_size) and not config.separate_vocab:
        raise ValueError("--src-vocab-size/--tgt-vocab-size need --separate-vocab.")
    if config.keep_optimizer and not config.init_from:
        raise ValueError("--keep-optimizer applies to --init-from only.")
    if config.early_stopping_patience and not has_validation(config):
        raise ValueError("--early-stopping-patience needs validation data (--valid-split of "
                         "--data, --valid-src/--valid-tgt or --valid-tsv).")
    if config.subword_nbest is not None:
        if config.subword_sampling is None:
            raise ValueError("--subword-nbest applies to --subword-sampling only.")
    if config.best_metric == "bleu" and not config.bleu_sentences:
        raise ValueError("--best-metric bleu needs --bleu-sentences > 0.")


def split_files(config, split):
    """`dict(source=, target=, tsv=)` given for `split` ("train", "valid",
    "test"), or None."""
    files = {"source": getattr(config, f"{split}_src"),
             "target": getattr(config, f"{split}_tgt"),
             "tsv": getattr(config, f"{split}_tsv")}
    if not any(files.values()):
        return None
    if files["tsv"] and (files["source"] or files["target"]):
        raise ValueError(f"--{split}-tsv and --{split}-src/--{split}-tgt exclude each other.")
    if not files["tsv"] and not (files["source"] and files["target"]):
        given = "--" + split + ("-src" if files["source"] else "-tgt")
        missing = "--" + split + ("-tgt" if files["source"] else "-src")
        raise ValueError(f"{given} needs {missing} (aligned files), or use --{split}-tsv.")
    return files


def _validate_data(config):
    train = split_files(config, "train")
    for split in ("valid", "test"):
        split_files(config, split)
    if train is None and not config.data:
        raise ValueError("No training data: give --data, --train-src/--train-tgt, or "
                         "--train-tsv.")
    if train is not None and config.data and not (config.valid_split or config.test_split):
        raise ValueError("--data is not used: the training data comes from files.")
    if config.data and not (config.src_lang and config.tgt_lang):
        raise ValueError(f"--data {config.data} needs --src-lang and --tgt-lang.")


def has_validation(config):
    """True when the run has validation data."""
    return bool(split_files(config, "valid") or (config.data and config.valid_split))


def configuration_markdown():
    """docs/configuration.md: every setting, by group, as its YAML key (the
    field name, in a settings file's `training:` section), its kt-train
    flag, type, default, range or choices, and help. Generated from the
    fields; `python -m keras_transformer.pipeline.settings` prints it and a
    test holds the file to it."""
    lines = [
        "# Configuration: every kt-train setting",
        "",
        "<!-- Generated by `python -m keras_transformer.pipeline.settings "
        "> docs/configuration.md`",
        "     from the `TrainingConfig` fields; tests/test_train_settings.py fails when "
        "they differ. -->",
        "",
        "A setting has one name: the `TrainingConfig` field, the key of a settings "
        "file's `training:` section, and (with dashes) the kt-train flag. Precedence, "
        "lowest first: the default below, the file given with `--config`, flags given "
        "on the command line, then `--set KEY=VALUE`. Flags are never abbreviated. A "
        "file's `model:` section holds `TransformerConfig` fields (docs/api.md) and "
        "`preset`.",
        "",
        "```yaml",
        "model:",
        "  preset: small",
        "  dropout: 0.3",
        "training:",
        "  batch_tokens: 4096",
        "  train_steps: 20000",
        "```",
        "",
    ]
    groups = {}
    for name, field in settings_fields().items():
        groups.setdefault(field.metadata["group"], []).append((name, field))
    for group, fields in groups.items():
        lines += [f"## {group[0].upper()}{group[1:]}", ""]
        if group in GROUP_NOTES:
            lines += [GROUP_NOTES[group], ""]
        lines += ["| key | flag | type | default | allowed | what it does |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name, field in fields:
            meta = field.metadata
            flags = ", ".join(f"`{flag}`" for flag in [_flag(name), *meta["aliases"]])
            choices = meta["choices"]
            allowed = (", ".join(f"`{c}`" for c in choices) if choices
                       else range_words(field) or "")
            default = "none" if field.default is None else f"`{field.default!r}`"
            help = meta["help"].replace("|", "\\|")
            lines.append(f"| `{name}` | {flags} | {meta['kind'].__name__} | {default} | "
                         f"{allowed} | {help} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(configuration_markdown(), end="")
