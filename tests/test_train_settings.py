"""kt-train's settings: `--config FILE` (YAML or JSON), `--set KEY=VALUE`,
their precedence over flags, the data and vocabulary flags, and the error
each bad input gets (naming the file, the key or the flag)."""

import json
import types

import pytest

from keras_transformer.cli import train as trainer
from keras_transformer.pipeline import settings

BASE = ["--run-dir", "r", "--data", "builtin", "--src-lang", "en", "--tgt-lang", "synth"]


def tokenizer(size=500):
    return types.SimpleNamespace(vocab_size=size, pad_id=0, bos_id=2, eos_id=3)


def resolved(argv):
    args = trainer.build_parser().parse_args(argv)
    return trainer.training_config(args, argv)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


YAML = """\
model:
  preset: tiny
  norm_first: true
  dropout: 0.25
  num_decoder_layers: 1
training:
  batch-tokens: 512
  train_steps: 77
  cache_tokenized: true
  input_autotune: off
"""


def test_a_yaml_file_sets_model_fields_on_its_preset_and_training_settings(tmp_path):
    path = write(tmp_path, "c.yaml", YAML)
    args = resolved(BASE + ["--config", path])
    assert (args.batch_tokens, args.train_steps, args.cache_tokenized) == (512, 77, True)
    assert args.input_autotune == "off"  # YAML's unquoted off is a bool
    shared = tokenizer()
    config = settings.model_config(args, shared, shared)
    assert (config.d_model, config.num_layers, config.d_ff) == (64, 2, 128)  # tiny
    assert config.norm_first is True and config.dropout == 0.25
    assert config.decoder_layers == 1 and config.vocab_size == 500
    assert config.shared_vocabulary


def test_flags_win_over_the_file_and_set_wins_over_both(tmp_path):
    path = write(tmp_path, "c.yaml", YAML)
    args = resolved(BASE + ["--config", path, "--batch-tokens", "256", "--dropout", "0.05",
                            "--set", "training.train_steps=9", "--set", "norm_first=false",
                            "--set", "model.d_ff=96", "--set", "warmup_steps=12"])
    assert args.batch_tokens == 256 and args.train_steps == 9
    config = settings.model_config(args, tokenizer(), tokenizer())
    assert config.dropout == 0.05 and config.norm_first is False
    assert config.d_ff == 96 and config.warmup_steps == 12
    # A flag given on the command line at its default value still wins.
    args = resolved(BASE + ["--config", path, "--batch-tokens", "4096"])
    assert args.batch_tokens == 4096


def test_json_files_and_presets_by_name(tmp_path):
    path = write(tmp_path, "c.json", json.dumps(
        {"model": {"preset": "demo", "position_encoding": "learned"},
         "training": {"max_length": 32}}))
    args = resolved(BASE + ["--config", path])
    config = settings.model_config(args, tokenizer(), tokenizer())
    assert config.d_model == 128 and config.position_encoding == "learned"
    assert args.max_length == 32 and config.max_length == 1024  # the flag, not the field
    args = resolved(BASE + ["--config", "small"])
    assert settings.model_config(args, tokenizer(), tokenizer()).d_model == 256
    args = resolved(BASE)
    assert settings.model_config(args, tokenizer(), tokenizer()).d_model == 512  # base


def test_separate_tokenizers_give_a_target_vocabulary():
    args = resolved(BASE + ["--config", "tiny"])
    config = settings.model_config(args, tokenizer(500), tokenizer(700))
    assert config.vocab_size == 500 and config.target_vocab_size == 700


@pytest.mark.parametrize("text, message", [
    ("colour: red\n", r"c\.yaml: unknown top-level key\(s\) \['colour'\]"),
    ("model:\n  norm_frist: true\n", r"c\.yaml, model: unknown field\(s\) \['norm_frist'\]"),
    ("model:\n  preset: huge\n", r"unknown preset 'huge'"),
    ("training:\n  batch_token: 5\n", r"c\.yaml, training: unknown training setting `batch_token`"),
    ("training:\n  batch_tokens: many\n", r"`batch_tokens` must be int, received 'many'"),
    ("training:\n  batch_tokens: 2.5\n", r"`batch_tokens` must be int, received 2.5"),
    ("training:\n  precision: float8\n", r"`precision` must be one of"),
    ("training:\n  cache_tokenized: 1\n", r"`cache_tokenized` must be true or false"),
    ("model: [1, 2]\n", r"`model:` must be a mapping"),
    ("model:\n  d_model: 64\n   dropout: 0.1\n", r"c\.yaml, line 3: not valid YAML"),
])
def test_bad_settings_files_name_the_file_and_the_key(tmp_path, text, message):
    path = write(tmp_path, "c.yaml", text)
    with pytest.raises(ValueError, match=message):
        resolved(BASE + ["--config", path])


@pytest.mark.parametrize("model, message", [
    ("norm_first: 'yes'", r"`norm_first` must be bool, received 'yes'"),
    ("d_model: 60\n  num_heads: 8", r"`d_model` \(60\) must be divisible by `num_heads` \(8\)"),
    ("dropout: 1.5", r"`dropout` must be in \[0, 1\)"),
    ("position_encoding: rotary", r"`position_encoding` must be one of"),
])
def test_bad_model_values_name_the_field_and_the_file(tmp_path, model, message):
    path = write(tmp_path, "c.yaml", f"model:\n  {model}\n")
    args = resolved(BASE + ["--config", path])
    with pytest.raises(ValueError, match=message) as raised:
        settings.model_config(args, tokenizer(), tokenizer())
    assert "c.yaml" in str(raised.value)


@pytest.mark.parametrize("assignment, message", [
    ("max_length=5", r"both a model field and a kt-train setting; write model.max_length"),
    ("nonsense=1", r"unknown key `nonsense`"),
    ("model.nonsense=1", r"--set model.nonsense=1: unknown field"),
    ("training.nonsense=1", r"unknown training setting `nonsense`"),
    ("novalue", r"expected KEY=VALUE"),
    ("batch_tokens=lots", r"`batch_tokens` must be int"),
])
def test_bad_set_assignments_are_named(assignment, message):
    with pytest.raises(ValueError, match=message):
        resolved(BASE + ["--set", assignment])


def test_a_missing_config_file_is_named():
    with pytest.raises(ValueError, match=r"--config nowhere\.yaml: no such file"):
        resolved(BASE + ["--config", "nowhere.yaml"])


@pytest.mark.parametrize("extra, message", [
    (["--train-src", "a.en"], r"--train-src needs --train-tgt"),
    (["--train-tgt", "a.de"], r"--train-tgt needs --train-src"),
    (["--train-tsv", "a.tsv", "--train-src", "a.en"], r"--train-tsv and --train-src/--train-tgt"),
    (["--valid-tsv", "v.tsv", "--valid-tgt", "v.de"], r"--valid-tsv and --valid-src"),
    (["--vocab", "a.model", "--src-vocab", "b.model", "--tgt-vocab", "c.model"],
     r"--vocab \(shared\) and --src-vocab/--tgt-vocab"),
    (["--src-vocab", "b.model"], r"--src-vocab and --tgt-vocab go together"),
    (["--separate-vocab", "--vocab", "a.model"], r"--separate-vocab trains vocabularies"),
    (["--src-vocab-size", "500"], r"need --separate-vocab"),
    (["--character-coverage", "0"], r"--character-coverage must be in \(0, 1\]"),
    (["--keep-optimizer"], r"--keep-optimizer applies to --init-from only"),
    (["--valid-split", "", "--early-stopping-patience", "3"], r"needs validation data"),
    (["--bleu-sentences", "0", "--best-metric", "bleu"], r"--best-metric bleu needs"),
    (["--early-stopping-patience", "0"], r"--early-stopping-patience must be positive"),
    (["--subword-sampling", "0"], r"--subword-sampling must be positive"),
    (["--subword-sampling", "nan"], r"--subword-sampling must be positive"),
    (["--subword-nbest", "8"], r"--subword-nbest applies to --subword-sampling only"),
    (["--subword-sampling", "0.2", "--subword-nbest", "1"], r"--subword-nbest must be at least 2"),
])
def test_bad_data_and_vocabulary_flags_are_named(extra, message):
    args = resolved(BASE + extra)
    with pytest.raises(ValueError, match=message):
        args.validate()


def test_training_data_is_required_and_data_needs_languages():
    args = resolved(["--run-dir", "r"])
    with pytest.raises(ValueError, match="No training data"):
        args.validate()
    args = resolved(["--run-dir", "r", "--data", "text:x"])
    with pytest.raises(ValueError, match="needs --src-lang and --tgt-lang"):
        args.validate()
    args = resolved(["--run-dir", "r", "--train-tsv", "t.tsv", "--valid-tsv", "v.tsv"])
    args.validate()  # files alone need no languages


def test_documented_validate_every_is_the_old_steps_per_epoch():
    assert resolved(BASE + ["--validate-every", "7"]).steps_per_epoch == 7
    assert resolved(BASE + ["--steps-per-epoch", "9"]).steps_per_epoch == 9


def test_every_setting_flag_is_a_training_config_field_with_its_default():
    parser = trainer.build_parser()
    not_settings = {"help", "set", "tf_verbose", "system_malloc", "config", "run_dir"}
    dests = {a.dest for a in parser._actions if a.option_strings} - not_settings
    assert dests == set(settings.settings_fields())
    args = parser.parse_args(["--run-dir", "r"])
    for name, field in settings.settings_fields().items():
        assert getattr(args, name) == field.default, name


def test_an_abbreviated_flag_is_refused_and_a_given_flag_wins_over_the_file(tmp_path,
                                                                             capsys):
    path = write(tmp_path, "my.yaml", "training:\n  train_steps: 100\n  warmup_steps: 10\n")
    with pytest.raises(SystemExit) as exit:
        resolved(BASE + ["--config", path, "--train-step", "500"])
    assert exit.value.code == 2
    assert "unrecognized arguments: --train-step 500" in capsys.readouterr().err
    config = resolved(BASE + ["--config", path, "--train-steps", "500"])
    assert (config.train_steps, config.warmup_steps) == (500, 10)
    assert trainer.explicit_settings(BASE + ["--validate-every", "3"]) == {
        "data", "src_lang", "tgt_lang", "steps_per_epoch"}
    assert trainer.explicit_settings(BASE + ["--steps-per-epoch", "3"]) == {
        "data", "src_lang", "tgt_lang", "steps_per_epoch"}
    assert trainer.explicit_settings(BASE + ["--train-steps=500", "--cache-tokenized"]) == {
        "data", "src_lang", "tgt_lang", "train_steps", "cache_tokenized"}


def test_every_command_refuses_abbreviated_flags():
    import argparse
    import importlib

    for name in ("train", "translate", "evaluate", "export", "serve", "average", "visualize",
                 "demo"):
        module = importlib.import_module(f"keras_transformer.cli.{name}")
        parser = module.build_parser()
        assert isinstance(parser, argparse.ArgumentParser)
        assert parser.allow_abbrev is False, name


def test_the_configuration_page_is_the_fields():
    import os

    page = os.path.join(os.path.dirname(__file__), "..", "docs", "configuration.md")
    with open(page, encoding="utf-8") as f:
        written = f.read()
    assert written == settings.configuration_markdown(), (
        "docs/configuration.md differs from the TrainingConfig fields: regenerate it with "
        "python -m keras_transformer.pipeline.settings > docs/configuration.md")
    for name, field in settings.settings_fields().items():
        assert field.metadata["help"] and f"| `{name}` |" in written, name


def test_a_script_s_training_config_is_checked_like_the_flags(tmp_path):
    import keras_transformer as kt

    with pytest.raises(ValueError, match=r"^--batch-tokens must be int, received '4096'"):
        kt.TrainingConfig(run_dir="r", train_tsv="t.tsv", batch_tokens="4096").validate()
    with pytest.raises(ValueError, match=r"^--precision must be one of"):
        kt.TrainingConfig(run_dir="r", train_tsv="t.tsv", precision="fp8").validate()
    path = write(tmp_path, "c.yaml", YAML)
    config = kt.TrainingConfig.from_file(path, run_dir="r", train_tsv="t.tsv", train_steps=5)
    assert (config.batch_tokens, config.train_steps) == (512, 5)  # keywords win
    assert config.model_settings["norm_first"] is True
    with pytest.raises(ValueError, match=r"c\.yaml, training: `batch_tokens` must be int"):
        kt.TrainingConfig.from_file(write(tmp_path, "c.yaml", "training:\n  batch_tokens: x\n"))
