"""Model and training hyperparameters (paper Table 3), as a small dataclass
that round-trips through a dict and JSON, and the settings files that
`kt-train --config FILE` reads."""

import dataclasses
import json
import os
import typing

# "none" exists for ablations only: without positions the encoder is
# permutation-equivariant and cannot use word order.
POSITION_ENCODINGS = ("sinusoidal", "learned", "none")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Everything needed to rebuild a `Transformer` (and its paper recipe).

    Token ids (`pad_id`, `bos_id`, `eos_id`) come from the tokenizer the model
    is trained with; `training/` fills them from it. The defaults match the
    SentencePiece settings this package trains with.

    Example:

    ```python
    import keras_transformer as kt

    config = kt.TransformerConfig(vocab_size=8000, d_model=256, num_layers=3,
                                  num_heads=4, d_ff=1024)
    assert kt.TransformerConfig.from_json(config.to_json()) == config
    ```
    """

    vocab_size: int
    d_model: int = 512
    num_layers: int = 6
    num_decoder_layers: int | None = None  # None: same as num_layers
    num_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1  # P_drop: residual and embedding dropout (5.4)
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    label_smoothing: float = 0.1  # eps_ls (5.4)
    r_drop: float = 0.0  # R-Drop's alpha (r_drop.py); 0: off
    layer_drop: float = 0.0  # LayerDrop: a layer's skip probability in training
    norm_first: bool = False  # the paper is post-LN
    layer_norm_epsilon: float = 1e-6
    position_encoding: str = "sinusoidal"  # or "learned" (Table 3 row E)
    max_length: int = 1024  # learned-position table size; decoding cap
    target_vocab_size: int | None = None  # None: one shared vocabulary (3.4)
    tie_output_projection: bool = True  # pre-softmax = target embedding^T
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3
    warmup_steps: int = 4000  # 5.3

    def __post_init__(self):
        _check_field_types(self)
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff",
                     "max_length", "warmup_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive int, received {value!r}.")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"`d_model` ({self.d_model}) must be divisible by `num_heads` "
                f"({self.num_heads})."
            )
        for name in ("dropout", "attention_dropout", "activation_dropout",
                     "label_smoothing", "layer_drop"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1), received {value!r}.")
        if not 0.0 <= self.r_drop < float("inf"):
            raise ValueError(f"`r_drop` must be a finite number >= 0, received {self.r_drop!r}.")
        if self.position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {POSITION_ENCODINGS}, "
                f"received {self.position_encoding!r}."
            )
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.vocab_size, self.target_vocab_size or self.vocab_size):
                raise ValueError(
                    f"`{name}` ({value}) must be a valid token id below the "
                    f"vocabulary size."
                )

    @property
    def decoder_layers(self):
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def shared_vocabulary(self):
        return self.target_vocab_size is None

    @property
    def output_vocab_size(self):
        return self.vocab_size if self.target_vocab_size is None else self.target_vocab_size

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(
                f"Unknown TransformerConfig fields {sorted(unknown)}; expected a "
                f"subset of {sorted(known)}."
            )
        return cls(**values)

    def to_json(self, indent=2):
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))


def _check_field_types(config):
    """A clear error naming the field for a value of the wrong type (a YAML
    `norm_first: "yes"` must not pass as true)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        allowed = typing.get_args(hints[field.name]) or (hints[field.name],)
        if value is None and type(None) in allowed:
            continue
        ok = False
        for kind in allowed:
            if kind is bool:
                ok = ok or isinstance(value, bool)
            elif kind is int:
                ok = ok or (isinstance(value, int) and not isinstance(value, bool))
            elif kind is float:
                ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
            elif kind is str:
                ok = ok or isinstance(value, str)
        if not ok:
            names = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
            raise ValueError(f"`{field.name}` must be {names}, received {value!r}.")


# Table 3. `base`: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1;
# `big`: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3.
PRESETS = {
    # The Quick start's model: small enough to learn the built-in corpus in
    # minutes on two CPU cores. No dropout: the demo sees each of the 40k
    # noise-free training pairs ~5 times, too few to overfit, so dropout
    # would only slow its learning (and each step).
    "demo": dict(d_model=128, num_layers=2, num_heads=4, d_ff=512, dropout=0.0),
    "tiny": dict(d_model=64, num_layers=2, num_heads=4, d_ff=128, dropout=0.1),
    "small": dict(d_model=256, num_layers=3, num_heads=4, d_ff=1024, dropout=0.1),
    "base": dict(d_model=512, num_layers=6, num_heads=8, d_ff=2048, dropout=0.1),
    "big": dict(d_model=1024, num_layers=6, num_heads=16, d_ff=4096, dropout=0.3),
}


_TOKEN_IDS = ("pad_id", "bos_id", "eos_id")


def get_config(name, vocab_size=None, tokenizer=None, target_tokenizer=None, **overrides):
    """A preset (`demo`, `tiny`, `small`, `base`, `big`; Table 3) with
    `overrides` applied.

    Args:
        name: the preset.
        vocab_size: the (shared or source) vocabulary size; taken from
            `tokenizer` when one is given.
        tokenizer: a `SubwordTokenizer` (or anything with `vocab_size`,
            `pad_id`, `bos_id`, `eos_id`): the vocabulary size and the
            special ids come from it. An explicit `vocab_size` or id that
            disagrees with it is a `ValueError` naming both values.
        target_tokenizer: the target side's tokenizer, for separate
            vocabularies (`target_vocab_size`); its special ids must be the
            source's.
        overrides: any other `TransformerConfig` field.

    Example:

    ```python
    import keras_transformer as kt

    config = kt.get_config("base", vocab_size=37000)
    assert (config.d_model, config.num_heads, config.d_ff) == (512, 8, 2048)
    tok = kt.SubwordTokenizer.train([f"a dog {i} runs" for i in range(100)], vocab_size=400)
    config = kt.get_config("tiny", tokenizer=tok, dropout=0.2)
    assert config.vocab_size == tok.vocab_size and config.eos_id == tok.eos_id
    ```
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown config {name!r}; expected one of {sorted(PRESETS)}.")
    if tokenizer is None:
        if target_tokenizer is not None:
            raise ValueError("`target_tokenizer` needs `tokenizer` (the source side's).")
        if vocab_size is None:
            raise ValueError("get_config needs `vocab_size` or `tokenizer`.")
        return TransformerConfig(vocab_size=vocab_size, **{**PRESETS[name], **overrides})
    given = {"vocab_size": vocab_size, **{k: overrides.get(k) for k in _TOKEN_IDS}}
    found = {"vocab_size": tokenizer.vocab_size,
             **{k: getattr(tokenizer, k) for k in _TOKEN_IDS}}
    for key, value in given.items():
        if value is not None and value != found[key]:
            raise ValueError(f"`{key}={value}` disagrees with the tokenizer's {key} "
                             f"({found[key]}); leave it out to take the tokenizer's.")
    if target_tokenizer is not None and target_tokenizer is not tokenizer:
        for key in _TOKEN_IDS:
            if getattr(target_tokenizer, key) != found[key]:
                raise ValueError(
                    f"The target tokenizer's {key} ({getattr(target_tokenizer, key)}) differs "
                    f"from the source tokenizer's ({found[key]}); the model has one of each.")
        given_target = overrides.get("target_vocab_size")
        if given_target is not None and given_target != target_tokenizer.vocab_size:
            raise ValueError(f"`target_vocab_size={given_target}` disagrees with the target "
                             f"tokenizer's vocab_size ({target_tokenizer.vocab_size}).")
        found["target_vocab_size"] = target_tokenizer.vocab_size
    return TransformerConfig(**{**PRESETS[name], **overrides, **found})


# Settings files ------------------------------------------------------------

SETTINGS_SECTIONS = ("model", "training")


def is_settings_file(name):
    """True when `--config NAME` names a file rather than a preset."""
    return name not in PRESETS and (
        os.path.splitext(name)[1].lower() in (".yaml", ".yml", ".json") or os.path.exists(name))


def load_settings_file(path):
    """Reads a `kt-train --config` file: YAML (`.yaml`/`.yml`) or JSON.

    The file is a mapping with up to two sections::

        model:                  # TransformerConfig fields, plus `preset`
          preset: small         #   the Table 3 preset the fields start from
          norm_first: true
          dropout: 0.2
        training:               # kt-train settings, named as the flags
          batch_tokens: 4096    #   (dashes or underscores)
          train_steps: 20000

    Returns: `{"model": dict, "training": dict}` (keys of `training` with
    underscores). Raises `ValueError` naming the file (and the line, for a
    syntax error) for anything else: an unreadable file, a top-level key
    other than the two sections, or an unknown model field.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--config {path}: no such file, and not a preset "
                         f"(presets: {sorted(PRESETS)}).")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {e.lineno}: not valid JSON ({e.msg}).") from None
    else:
        import yaml

        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            raise ValueError(f"{path}{where}: not valid YAML "
                             f"({getattr(e, 'problem', None) or e}).") from None
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping with sections {SETTINGS_SECTIONS}, "
                         f"found a {type(values).__name__}.")
    unknown = sorted(set(values) - set(SETTINGS_SECTIONS))
    if unknown:
        raise ValueError(
            f"{path}: unknown top-level key(s) {unknown}; put model fields under `model:` "
            f"and kt-train settings under `training:`.")
    sections = {}
    for section in SETTINGS_SECTIONS:
        content = values.get(section) or {}
        if not isinstance(content, dict):
            raise ValueError(f"{path}: `{section}:` must be a mapping, found "
                             f"{type(content).__name__}.")
        sections[section] = {str(k).replace("-", "_"): v for k, v in content.items()}
    check_model_fields(sections["model"], f"{path}, model")
    return sections


def check_model_fields(values, where):
    """Raises `ValueError` naming `where` and the key for a key of `values`
    that is neither a `TransformerConfig` field nor `preset`."""
    known = {f.name for f in dataclasses.fields(TransformerConfig)} | {"preset"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; model fields are "
                         f"{sorted(known)}.")
    if "preset" in values and values["preset"] not in PRESETS:
        raise ValueError(f"{where}: unknown preset {values['preset']!r}; expected one of "
                         f"{sorted(PRESETS)}.")


def parse_assignment(text):
    """`--set KEY=VALUE` -> `(key, value)`, the value read as a YAML scalar
    (`true`, `0.1`, `null`, `sinusoidal`), so types match a settings file.
    `KEY` may be qualified: `model.dropout`, `training.batch_tokens`."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"--set {text!r}: expected KEY=VALUE, e.g. --set norm_first=true.")
    import yaml

    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ValueError(f"--set {text!r}: cannot read the value ({e}).") from None
    return key, value
