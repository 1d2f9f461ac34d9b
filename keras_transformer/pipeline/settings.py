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


def _setting(default, kind, choices=None):
    return dataclasses.field(default=default, metadata={"kind": kind, "choices": choices})


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
    # Data.
    data: str = _setting(None, str)
    src_lang: str = _setting(None, str)
    tgt_lang: str = _setting(None, str)
    train_split: str = _setting("train", str)
    valid_split: str = _setting("validation", str)
    test_split: str = _setting("", str)
    train_src: str = _setting(None, str)
    train_tgt: str = _setting(None, str)
    train_tsv: str = _setting(None, str)
    valid_src: str = _setting(None, str)
    valid_tgt: str = _setting(None, str)
    valid_tsv: str = _setting(None, str)
    test_src: str = _setting(None, str)
    test_tgt: str = _setting(None, str)
    test_tsv: str = _setting(None, str)
    max_length: int = _setting(256, int)
    batch_tokens: int = _setting(4096, int)
    shuffle_buffer: int = _setting(100_000, int)
    cache_tokenized: bool = _setting(False, bool)
    input_autotune: str = _setting("on", str, ("on", "off"))
    subword_sampling: float = _setting(None, float)
    subword_nbest: int = _setting(None, int)
    seed: int = _setting(1, int)
    # Vocabulary.
    vocab: str = _setting(None, str)
    src_vocab: str = _setting(None, str)
    tgt_vocab: str = _setting(None, str)
    separate_vocab: bool = _setting(False, bool)
    vocab_size: int = _setting(37000, int)
    src_vocab_size: int = _setting(None, int)
    tgt_vocab_size: int = _setting(None, int)
    vocab_model_type: str = _setting("unigram", str, ("unigram", "bpe"))
    character_coverage: float = _setting(1.0, float)
    vocab_sentences: int = _setting(1_000_000, int)
    # Model.
    config: str = None
    model_settings: dict = dataclasses.field(default_factory=dict)
    config_file: str = None
    dropout: float = _setting(None, float)
    r_drop: float = _setting(None, float)
    position_encoding: str = _setting(None, str, ("sinusoidal", "learned", "none"))
    init_from: str = _setting(None, str)
    keep_optimizer: bool = _setting(False, bool)
    # Optimisation.
    train_steps: int = _setting(100_000, int)
    max_minutes: float = _setting(None, float)
    warmup_steps: int = _setting(4000, int)
    lr_scale: float = _setting(1.0, float)
    ema: float = _setting(0.0, float)
    accumulation_steps: int = _setting(1, int)
    precision: str = _setting("auto", str, ("auto",) + PRECISIONS)
    strategy: str = _setting(None, str, STRATEGIES)
    logical_cpus: int = _setting(0, int)
    steps_per_execution: int = _setting(1, int)
    jit_compile: bool = _setting(False, bool)
    # Validation, checkpoint selection and early stopping.
    steps_per_epoch: int = _setting(1000, int)
    bleu_sentences: int = _setting(200, int)
    bleu_search: str = _setting("beam", str, ("beam", "greedy"))
    best_metric: str = _setting(None, str, ("bleu", "loss"))
    keep_best: int = _setting(3, int)
    early_stopping_patience: int = _setting(None, int)
    # Checkpoints and logging.
    checkpoint_every: int = _setting(1000, int)
    keep_checkpoints: int = _setting(20, int)
    log_every: int = _setting(100, int)
    verbose: int = _setting(1, int, (0, 1, 2))
    wait_for_chief: float = _setting(600.0, float)

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
    return "--" + name.replace("_", "-")


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
    positive = ("max_length", "batch_tokens", "vocab_size", "vocab_sentences", "train_steps",
                "warmup_steps", "accumulation_steps", "steps_per_execution", "keep_checkpoints",
                "steps_per_epoch", "log_every")
    for name in positive:
        if getattr(config, name) <= 0:
            raise ValueError(f"{_flag(name)} must be positive, received "
                             f"{getattr(config, name)}.")
    for name in ("src_vocab_size", "tgt_vocab_size", "early_stopping_patience"):
        value = getattr(config, name, None)
        if value is not None and value <= 0:
            raise ValueError(f"{_flag(name)} must be positive, received {value}.")
    for name in ("keep_best", "bleu_sentences"):
        if getattr(config, name) < 0:
            raise ValueError(f"{_flag(name)} must be >= 0, received "
                             f"{getattr(config, name)}.")
    for name, field in settings_fields().items():
        choices, value = field.metadata["choices"], getattr(config, name)
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"{_flag(name)} must be one of {list(choices)}, received "
                             f"{value!r}.")
    if not 0.0 <= config.ema < 1.0:
        raise ValueError(f"--ema must be in [0, 1), received {config.ema}.")
    if not 0.0 < config.character_coverage <= 1.0:
        raise ValueError(f"--character-coverage must be in (0, 1], received "
                         f"{config.character_coverage}.")
    if config.batch_tokens < config.max_length:
        raise ValueError(f"--batch-tokens ({config.batch_tokens}) must be at least "
                         f"--max-length ({config.max_length}).")
    if config.strategy == "multi_worker_mirrored" and config.logical_cpus > 1:
        raise ValueError("--logical-cpus applies to --strategy mirrored only.")
    if config.jit_compile and config.strategy in ("mirrored", "multi_worker_mirrored"):
        raise ValueError(JIT_WITH_REPLICAS.format(config.strategy))
    if config.max_minutes is not None:
        if config.max_minutes <= 0:
            raise ValueError(f"--max-minutes must be positive, received {config.max_minutes}.")
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
    if config.subword_sampling is not None and not config.subword_sampling > 0:
        raise ValueError(f"--subword-sampling must be positive, received "
                         f"{config.subword_sampling}.")
    if config.subword_nbest is not None:
        if config.subword_sampling is None:
            raise ValueError("--subword-nbest applies to --subword-sampling only.")
        if config.subword_nbest < 2:
            raise ValueError(f"--subword-nbest must be at least 2, received "
                             f"{config.subword_nbest}.")
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
