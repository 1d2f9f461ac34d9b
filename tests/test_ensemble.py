"""`TransformerEnsemble` (keras_transformer/decoding/ensemble.py): a step is
the log of the members' mean probability; one member, or copies of one
model, decode as the model alone; kt-translate/kt-evaluate `--ensemble`."""

import contextlib
import io

import keras
import numpy as np
import pytest
from test_tokenizer import CORPUS
from test_translate_cli import make_run_directory

import keras_transformer as kt
from keras_transformer.cli import evaluate, translate
from keras_transformer.decoding import beam_search_translate
from keras_transformer.export.loading import translator_from_run_directory
from keras_transformer.export.translator import Translator
from keras_transformer.run_directory import RunDirectory
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

EPS = np.finfo(np.float32).eps
SOURCE = [[5, 6, 7, 8, 9, 3], [11, 12, 3, 0, 0, 0]]


def built_model(seed, **overrides):
    overrides.setdefault("vocab_size", 60)
    keras.utils.set_random_seed(seed)
    settings = dict(dict(max_length=24), **overrides)
    model = kt.Transformer(kt.get_config("tiny", **settings))
    model.build()
    return model


def search(model, beam_size=3):
    sequences, scores = beam_search_translate(
        model, keras.ops.convert_to_tensor(SOURCE, "int32"), beam_size=beam_size, alpha=0.6,
        extra_length=6)
    return keras.ops.convert_to_numpy(sequences), keras.ops.convert_to_numpy(scores)


def first_step_logits(model):
    source = keras.ops.convert_to_tensor(SOURCE, "int32")
    memory, mask = model.encode(source, training=False)
    cache = model.init_decoding_cache(memory, 4)
    ids = keras.ops.full((len(SOURCE),), model.config.bos_id, "int32")
    logits, _ = model.decode_step(ids, 0, cache, mask)
    return keras.ops.convert_to_numpy(keras.ops.cast(logits, "float32")).astype(np.float64)


@pytest.mark.numerics
def test_a_step_is_the_log_of_the_members_mean_probability():
    members = [built_model(1), built_model(2), built_model(3)]
    expected = np.log(np.mean([np.exp(logits - logits.max(-1, keepdims=True))
                               / np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                                   keepdims=True)
                               for logits in map(first_step_logits, members)], axis=0))
    actual = first_step_logits(kt.TransformerEnsemble(members))
    # float32 log-softmax and logsumexp over 3 members: a few ulps of the
    # largest magnitude involved.
    bound = 64 * EPS * (1 + np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0, atol=bound)
    assert np.abs(actual - first_step_logits(members[0])).max() > 1e-3  # a real mixture


@pytest.mark.numerics
def test_one_member_decodes_exactly_as_the_model_alone():
    model = built_model(1)
    alone, ensemble = search(model), search(kt.TransformerEnsemble([model]))
    np.testing.assert_array_equal(ensemble[0], alone[0])
    np.testing.assert_array_equal(ensemble[1], alone[1])


@pytest.mark.numerics
def test_copies_of_one_model_decode_as_the_model_alone():
    model = built_model(1)
    sequences, scores = search(model)
    copies = search(kt.TransformerEnsemble([model, model]))
    np.testing.assert_array_equal(copies[0], sequences)
    # The mixture of equal distributions is the distribution; only the extra
    # log-softmax and logsumexp round, a few ulps per step of <= 30 steps.
    np.testing.assert_allclose(copies[1], scores, rtol=0,
                               atol=30 * 16 * EPS * (1 + np.abs(scores).max()))


def test_members_of_other_shapes_decode_together():
    small, deeper = built_model(1), built_model(2, num_layers=3, d_ff=96)
    sequences, scores = search(kt.TransformerEnsemble([small, deeper]))
    assert sequences.shape[:2] == (2, 3) and np.all(np.isfinite(scores))
    assert not np.array_equal(sequences, search(small)[0])


@pytest.mark.parametrize("field, value", [("vocab_size", 61), ("eos_id", 4),
                                          ("max_length", 32)])
def test_members_must_share_the_vocabulary_and_ids(field, value):
    with pytest.raises(ValueError, match=f"member 1 has {field}={value}"):
        kt.TransformerEnsemble([built_model(1), built_model(2, **{field: value})])
    with pytest.raises(ValueError, match="at least one model"):
        kt.TransformerEnsemble([])


def run_pair(tmp_path):
    """Two run directories with one vocabulary and other weights."""
    keras.utils.set_random_seed(1)
    first = make_run_directory(str(tmp_path / "a"), num_layers=1)
    keras.utils.set_random_seed(2)
    second = make_run_directory(str(tmp_path / "b"), num_layers=1)
    assert first.load_tokenizer().model_proto == second.load_tokenizer().model_proto
    return first, second


def capture(command, argv):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        command(argv)
    return printed.getvalue()


def test_kt_translate_and_evaluate_decode_an_ensemble(tmp_path):
    first, second = run_pair(tmp_path)
    source = tmp_path / "source.txt"
    source.write_text("Ein Mann fährt mit dem Fahrrad.\nDie Mädchen überqueren die Straße.\n")
    sentences = source.read_text().splitlines()
    # kt-translate searches under XLA (its default); the translators below
    # in the graph: the same translations.
    pair = capture(translate.translate, ["--run-dir", first.path, "--ensemble", second.path,
                                         "--input", str(source), "--beam-size", "2",
                                         "--extra-length", "4"])
    translator = translator_from_run_directory(first.path, ensemble=[second.path],
                                               beam_size=2, extra_length=4)
    assert isinstance(translator.model, kt.TransformerEnsemble)
    assert pair.splitlines() == translator.translate(sentences)[0]
    alone = translator_from_run_directory(first.path, beam_size=2, extra_length=4)
    assert pair.splitlines() != alone.translate(sentences)[0]  # the member counts
    scores = evaluate.evaluate(["--run-dir", first.path, "--ensemble", second.path,
                                "--source", str(source), "--reference", str(source),
                                "--beam-size", "2", "--extra-length", "4", "--no-xla",
                                "--json"], stdout=io.StringIO())
    assert 0 <= scores["bleu"] <= 100


def test_a_member_with_another_vocabulary_is_named(tmp_path):
    first = make_run_directory(str(tmp_path / "a"))
    other = RunDirectory(str(tmp_path / "other"))
    other.save_config(first.load_config())
    other.save_tokenizer(SubwordTokenizer(train_sentencepiece(CORPUS[::-1][:60],
                                                              vocab_size=400)))
    with pytest.raises(ValueError, match="other has another vocabulary"):
        translator_from_run_directory(first.path, ensemble=[other.path])


@pytest.mark.parametrize("flags, message", [
    (["--saved-model", "x", "--ensemble", "y"], "--ensemble adds members to --run-dir"),
    (["--run-dir", "x", "--ensemble", "y", "--engine", "ctranslate2"],
     "--ensemble needs --engine tensorflow"),
])
def test_ensemble_flags_that_cannot_work_are_usage_errors(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        translate.translate(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_ensemble_is_neither_explained_nor_exported(tmp_path):
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", tokenizer=tokenizer, max_length=16)
    models = [kt.Transformer(config) for _ in range(2)]
    for model in models:
        model.build()
    translator = Translator(kt.TransformerEnsemble(models), tokenizer, beam_size=2)
    assert len(translator.translate(["Ein Mann."])[0]) == 1
    with pytest.raises(ValueError, match="explain with a member"):
        translator.explain(["Ein Mann."])
    with pytest.raises(ValueError, match="An ensemble is not exported"):
        kt.export_saved_model(translator, str(tmp_path / "saved_models" / "ens"))
    with pytest.raises(ValueError, match="xla_column_blocks"):
        Translator(kt.TransformerEnsemble(models), tokenizer, xla_column_blocks=2)
