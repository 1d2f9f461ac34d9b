"""The LiteRT export (keras_transformer/export/litert.py) and its engine
(export/litert_translator.py): a tiny random translator exported once
with a unigram vocabulary (tokenized inside the file) and once with a BPE
one (tokenized by the caller), each run through the LiteRT interpreter and
compared with the in-process `Translator`, whose serving functions are the
SavedModel's."""

import doctest
import json
import os

import numpy as np
import pytest

from keras_transformer.data.synthetic import generate_corpus
from keras_transformer.export import litert, litert_translator
from keras_transformer.export.engine import SERVING_DEFAULT, TRANSLATE_WITH_OPTIONS
from keras_transformer.export.litert_translator import LiteRTTranslator

# Input rules the SavedModel has: blank lines, invalid UTF-8, characters
# outside the vocabulary (byte fallback), a source over max_length pieces.
EDGE_CASES = ["", "   ", "\t", "Ünïcödé wörds 😀", b"a cat \xff\xfe sits",
              "the old man " * 30, "UPPER case AND digits 12345"]
# Scores are float32 sums over the same ops in another runtime.
SCORE_TOLERANCE = 1e-4


def held_out(count):
    return generate_corpus(num_train=10, num_val=10, num_test=count)["test"][0]


SENTENCES = held_out(60) + EDGE_CASES
OPTIONS = {"default": {}, "options": dict(beam_size=1, alpha=1.0, extra_length=2),
           # extra_length beyond max_length is clamped, as the SavedModel clamps it.
           "clamped": dict(beam_size=2, extra_length=10_000)}


def expected_translations(translator):
    """The in-process translations of `SENTENCES` under each of `OPTIONS`,
    taken at once: the suite's per-test seeding destroys eager
    tensorflow-text resources, so a module fixture's translator translates
    only in its own setup."""
    return {name: translator.translate(SENTENCES, **options)
            for name, options in OPTIONS.items()}


@pytest.fixture(scope="module")
def unigram(tmp_path_factory):
    """Runs `export_litert`'s docstring Example (a unigram vocabulary) in a
    scratch directory and keeps what it made: `{"translator", "path"}`."""
    import keras

    keras.utils.set_random_seed(11)  # the Example's random model, the same every run
    examples = doctest.DocTestFinder().find(litert.export_litert)
    runner = doctest.DocTestRunner()
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("example"))
    try:
        for test in examples:
            runner.run(test, clear_globs=False)
    finally:
        os.chdir(cwd)
    assert runner.failures == 0, "export_litert's Example failed (see the output above)"
    globs = examples[0].globs
    return {**globs, "expected": expected_translations(globs["translator"])}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A BPE translator exported as a SavedModel, then as LiteRT by
    `kt-export --saved-model ... --format litert` (the translator rebuilt
    from the SavedModel)."""
    import keras

    import keras_transformer as kt
    from keras_transformer.cli.export import export
    from keras_transformer.export import Translator, export_translator
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

    keras.utils.set_random_seed(3)
    sources, targets = generate_corpus(num_train=200, num_val=0, num_test=0)["train"]
    tokenizer = SubwordTokenizer(train_sentencepiece(sources + targets, vocab_size=400,
                                                     model_type="bpe"))
    # One layer: the export's plumbing does not depend on depth (the
    # unigram Example's model has two).
    model = kt.Transformer(kt.get_config("tiny", vocab_size=tokenizer.vocab_size,
                                         max_length=16, num_layers=1))
    model.build()
    translator = Translator(model, tokenizer, beam_size=3, extra_length=4)
    directory = tmp_path_factory.mktemp("bpe")
    saved = export_translator(translator, str(directory / "saved"), name="m")
    expected = expected_translations(translator)
    path = export(["--saved-model", os.path.dirname(saved), "--format", "litert",
                   "--output-dir", str(directory / "litert")])
    return {"translator": translator, "saved_model": saved, "path": path,
            "expected": expected}


def assert_same(expected, found, sentences):
    mismatched = [(s, e, f) for s, e, f in zip(sentences, expected[0], found[0]) if e != f]
    assert mismatched == []
    assert np.allclose(found[1], expected[1], rtol=0, atol=SCORE_TOLERANCE)


def test_unigram_export_tokenizes_inside_and_equals_the_savedmodel(unigram):
    metadata = litert_translator.read_metadata(unigram["path"])
    assert metadata["tokenization"] == "in_model"
    found = LiteRTTranslator(unigram["path"]).translate(SENTENCES)
    assert_same(unigram["expected"]["default"], found, SENTENCES)
    blank = [SENTENCES.index(s) for s in ("", "   ", "\t")]
    assert [found[0][i] for i in blank] == ["", "", ""]
    assert [found[1][i] for i in blank] == [0.0, 0.0, 0.0]


def test_bpe_export_leaves_tokenization_to_the_caller_and_equals_the_savedmodel(bpe):
    metadata = litert_translator.read_metadata(bpe["path"])
    assert metadata["tokenization"] == "caller"
    assert "bpe" in metadata["tokenization_why"]
    assert_same(bpe["expected"]["default"], LiteRTTranslator(bpe["path"]).translate(SENTENCES),
                SENTENCES)


def test_kt_export_names_and_versions_a_litert_export_of_a_savedmodel(bpe):
    assert bpe["path"].endswith(os.path.join("litert", "m_litert", "1"))
    assert litert_translator.read_metadata(bpe["path"])["defaults"] == {
        "beam_size": 3, "alpha": bpe["translator"].alpha, "extra_length": 4}


def test_a_translator_rebuilt_from_its_savedmodel_translates_as_it(bpe):
    from keras_transformer.export.saved_model import translator_from_saved_model

    rebuilt = translator_from_saved_model(bpe["saved_model"])
    assert rebuilt.config == bpe["translator"].config.replace(dropout=0.0)  # inference only
    found = rebuilt.translate(SENTENCES)
    assert found[0] == bpe["expected"]["default"][0]
    assert np.array_equal(found[1], bpe["expected"]["default"][1])


def test_the_rebuild_example_runs(bpe):
    from keras_transformer.export import saved_model

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(saved_model.translator_from_saved_model,
                            extraglobs={"saved_model_dir": bpe["saved_model"]}):
        runner.run(test)
    assert runner.tries > 0 and runner.failures == 0


def test_a_savedmodel_whose_weights_do_not_fit_its_config_is_refused(bpe, tmp_path):
    import shutil

    from keras_transformer.export.saved_model import translator_from_saved_model

    copy = tmp_path / "1"
    shutil.copytree(bpe["saved_model"], copy)
    metadata = copy / "assets.extra" / "translator.json"
    document = json.loads(metadata.read_text())
    document["config"]["num_layers"] += 1
    metadata.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="do not match the model its config builds"):
        translator_from_saved_model(str(copy))


@pytest.mark.parametrize("name", ["options", "clamped"])
def test_options_go_through_translate_with_options(unigram, name):
    found = LiteRTTranslator(unigram["path"]).translate(SENTENCES, **OPTIONS[name])
    assert_same(unigram["expected"][name], found, SENTENCES)


@pytest.mark.parametrize("options", [{"beam_size": 0}, {"alpha": float("nan")},
                                     {"extra_length": -1}, {"beam_size": 10_000}])
def test_bad_options_are_refused_with_the_savedmodel_s_words(unigram, options):
    with pytest.raises(ValueError) as expected:
        unigram["translator"].translate(["a cat"], **options)
    with pytest.raises(ValueError) as found:
        LiteRTTranslator(unigram["path"]).translate(["a cat"], **options)
    assert str(found.value) == str(expected.value)


def test_detokenizing_drops_leading_spaces_as_sentencepiece_does():
    """A model may put space-only pieces first (a random one often does):
    SentencePiece's decoder drops them, and so must the file's."""
    import tensorflow as tf

    from keras_transformer.export import Translator
    from keras_transformer.export.fast_sentencepiece import space_piece_ids
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

    sources, targets = generate_corpus(num_train=200, num_val=0, num_test=0)["train"]
    tokenizer = SubwordTokenizer(train_sentencepiece(sources + targets, vocab_size=400))
    import keras_transformer as kt

    model = kt.Transformer(kt.get_config("tiny", vocab_size=tokenizer.vocab_size,
                                         max_length=16))
    model.build()
    module = litert.LiteRTModule(Translator(model, tokenizer), tokenize_in_model=True)
    space = space_piece_ids(tokenizer.model_proto)
    assert space
    word = tokenizer.tokenize(tf.constant(["cat dog"])).to_list()[0]
    rows = [[space[0]] * 3 + word, [space[0]], word + [space[0]] + word, [space[0]] + word[:1]]
    width = max(map(len, rows))
    ids = tf.constant([r + [0] * (width - len(r)) for r in rows], tf.int32)
    found = [t.decode() for t in module._detokenize(ids).numpy()]
    assert found == [t.decode() for t in tokenizer.detokenize(ids).numpy()]
    assert found[0] == "cat dog" and found[1] == ""


def test_signatures_have_the_savedmodel_s_names_and_dtypes(unigram):
    module = unigram["translator"]
    interpreter = litert_translator.make_interpreter(
        os.path.join(unigram["path"], litert_translator.MODEL_FILE))
    listed = interpreter.get_signature_list()
    assert set(listed) == {SERVING_DEFAULT, TRANSLATE_WITH_OPTIONS}
    saved = {SERVING_DEFAULT: module.signature_serving_default,
             TRANSLATE_WITH_OPTIONS: module.signature_translate_with_options}
    for name, function in saved.items():
        runner = interpreter.get_signature_runner(name)
        inputs = {key: np.dtype(detail["dtype"]).name
                  for key, detail in runner.get_input_details().items()}
        outputs = {key: np.dtype(detail["dtype"]).name
                   for key, detail in runner.get_output_details().items()}
        concrete = function.get_concrete_function()
        assert inputs == {spec.name: _name(spec.dtype)
                          for spec in concrete.structured_input_signature[0]}
        assert outputs == {key: _name(spec.dtype)
                           for key, spec in concrete.structured_outputs.items()}


def _name(dtype):
    return "bytes" if dtype.name == "string" else dtype.name  # LiteRT: numpy.bytes_


def test_only_builtin_and_tensorflow_text_ops(unigram):
    ops = litert_translator.read_metadata(unigram["path"])["ops"]
    assert "WHILE" in ops and "TOPK_V2" in ops  # the beam search is inside
    custom = {name for name in ops if not name.replace("_", "").isalnum()
              or not name.isupper()}
    assert custom == set(litert.LITERT_CUSTOM_OPS)


def test_the_export_is_refused_when_an_op_is_not_builtin(unigram, tmp_path, monkeypatch):
    real = litert.op_counts
    monkeypatch.setattr(litert, "op_counts", lambda data: {**real(data), "FlexStringSplit": 1})
    with open(os.path.join(unigram["path"], litert_translator.MODEL_FILE), "rb") as f:
        converted = f.read()
    # The conversion's result is the fixture's: the test is about what follows it.
    monkeypatch.setattr(litert, "_convert", lambda saved_model_dir, quantization: converted)
    target = tmp_path / "m"
    with pytest.raises(ValueError, match="FlexStringSplit"):
        litert.export_litert(unigram["translator"], str(target))
    assert not target.exists() and os.listdir(tmp_path) == []


def float32_constants(tflite_bytes):
    """`[values]` of each buffer that a float32 constant tensor of a
    `.tflite` file reads (a buffer shared by several tensors once)."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(tflite_bytes))
    buffers = {t.buffer for subgraph in model.subgraphs for t in subgraph.tensors
               if t.type == schema.TensorType.FLOAT32
               and model.buffers[t.buffer].data is not None
               and len(model.buffers[t.buffer].data)}
    return [np.frombuffer(bytes(model.buffers[b].data), "<f4") for b in sorted(buffers)]


def test_float16_stores_the_weights_as_float16_and_keeps_the_sentinels(unigram, tmp_path):
    """`--quantization float16`'s pass on the float32 file: the weights
    become float16, the search's -1e9 sentinels stay exact (the converter's
    own float16 mode clamps them to -65504), and the file translates as the
    float32 one up to float16's rounding of the weights."""
    import shutil

    from keras_transformer.export.litert_float16 import MIN_ELEMENTS, float16_weights

    with open(os.path.join(unigram["path"], litert_translator.MODEL_FILE), "rb") as f:
        float32 = f.read()
    float16 = float16_weights(float32)
    before, after = float32_constants(float32), float32_constants(float16)
    weights = [v for v in before if v.size >= MIN_ELEMENTS]
    assert sum(v.size for v in weights) > 0.6 * sum(v.size for v in before)
    # Two bytes saved per weight, less what the new tensors and ops take.
    assert len(float16) < len(float32) - 0.9 * 2 * sum(v.size for v in weights)
    assert all(np.abs(v).max() > 65504 for v in after if v.size >= MIN_ELEMENTS)
    sentinel = [v for v in before if (v == -1e9).any()]
    assert sentinel and len([v for v in after if (v == -1e9).any()]) == len(sentinel)
    assert "DEQUANTIZE" in litert.op_counts(float16)

    path = tmp_path / "float16"
    shutil.copytree(unigram["path"], path)
    (path / litert_translator.MODEL_FILE).write_bytes(float16)
    reference = LiteRTTranslator(unigram["path"]).translate(SENTENCES)
    found = LiteRTTranslator(str(path)).translate(SENTENCES)
    same = [i for i, (a, b) in enumerate(zip(reference[0], found[0])) if a == b]
    # A random model has near ties that a 2^-11 change of a weight can flip.
    assert len(same) >= 0.9 * len(SENTENCES)
    assert np.allclose(np.array(found[1])[same], np.array(reference[1])[same], atol=0.05)


def test_float16_weights_example_runs():
    from keras_transformer.export import litert_float16

    (example,) = doctest.DocTestFinder().find(litert_float16.float16_weights)
    runner = doctest.DocTestRunner()
    runner.run(example)
    assert runner.failures == 0


def test_unknown_quantization_is_refused_before_any_work(unigram, tmp_path):
    with pytest.raises(ValueError, match="dynamic-int8"):
        litert.export_litert(unigram["translator"], str(tmp_path / "m"), quantization="int4")


def test_metadata_and_layout(unigram):
    path = unigram["path"]
    assert sorted(os.listdir(path)) == sorted([litert_translator.MODEL_FILE,
                                               litert_translator.METADATA_FILE,
                                               litert.SHARED_VOCABULARY])
    with open(os.path.join(path, litert_translator.METADATA_FILE)) as f:
        metadata = json.load(f)
    translator = unigram["translator"]
    assert metadata["defaults"] == {"beam_size": translator.beam_size,
                                    "alpha": translator.alpha,
                                    "extra_length": translator.extra_length}
    assert metadata["min_length"] == translator.min_length
    assert metadata["max_source_tokens"] == translator.config.max_length - 1
    assert metadata["batch_size"] == 1 and metadata["quantization"] == "float32"
    assert metadata["source_vocabulary"] == metadata["target_vocabulary"] == "shared.spm"
    assert LiteRTTranslator(os.path.dirname(path)).path == path  # newest version


def test_two_threads_share_one_engine(unigram):
    """kt-translate translates two windows at once: the interpreter's calls
    are taken one at a time, and each thread gets its own sentences'
    answers."""
    from concurrent.futures import ThreadPoolExecutor

    engine = LiteRTTranslator(unigram["path"])
    halves = [SENTENCES[::2], SENTENCES[1::2]]
    alone = [engine.translate(half) for half in halves]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(engine.translate, halves * 3))
    assert together == alone * 3


def test_engine_example_runs(unigram):
    globs = {"litert_dir": unigram["path"]}
    result = doctest.testmod(litert_translator, extraglobs=globs, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_nbest_and_sampling_say_which_engine_has_them(unigram):
    engine = LiteRTTranslator(unigram["path"])
    with pytest.raises(ValueError, match="SavedModel or CTranslate2"):
        engine.translate_nbest(["a cat"], 2)
    with pytest.raises(ValueError, match="SavedModel or CTranslate2"):
        engine.sample(["a cat"])


def test_kt_translate_with_litert_model(unigram, tmp_path):
    from keras_transformer.cli.translate import translate

    sentences = held_out(8) + ["", "a dog"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    found = translate(["--litert-model", os.path.dirname(unigram["path"]), "--input",
                       str(source), "--output", str(out), "--quiet"])
    expected = LiteRTTranslator(unigram["path"]).translate(sentences)
    assert found[0] == expected[0]
    assert out.read_text(encoding="utf-8").splitlines() == expected[0]


@pytest.mark.parametrize("argv, message", [
    (["--n-best", "2"], "--n-best does not apply to --litert-model"),
    (["--sampling"], "--sampling does not apply to --litert-model"),
    (["--engine", "ctranslate2"], "--litert-model and --engine litert go together"),
    (["--compute-type", "int8"], "--compute-type does not apply to --litert-model"),
    (["--threads", "0"], "--threads must be at least 1"),
])
def test_kt_translate_refuses_what_litert_cannot_do(argv, message, tmp_path, capsys):
    from keras_transformer.cli.translate import translate

    with pytest.raises(SystemExit) as exit_:
        translate(["--litert-model", str(tmp_path)] + argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--format", "litert", "--quantization", "int8"],
     "--quantization int8 does not apply to --format litert"),
    (["--format", "ctranslate2", "--quantization", "dynamic-int8"],
     "--quantization dynamic-int8 does not apply to --format ctranslate2"),
    (["--format", "ctranslate2", "--quantization", "float16"],
     "--quantization float16 does not apply to --format ctranslate2"),
    (["--format", "litert", "--xla-column-blocks", "2"],
     "--xla-column-blocks applies to --format saved_model, not litert"),
    (["--format", "litert", "--vocabulary-map"],
     "--vocabulary-map applies to --format ctranslate2"),
    (["--format", "saved_model", "--saved-model", "x"], "--saved-model applies to --format litert"),
])
def test_kt_export_checks_flags_per_format(argv, message, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from keras_transformer.cli.export import export

    source = [] if "--saved-model" in argv else ["--run-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        export(source + argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_export_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="kt-export --format litert"):
        LiteRTTranslator(str(tmp_path))


def test_kt_evaluate_with_litert_model(unigram, tmp_path, capsys):
    from keras_transformer.cli.evaluate import evaluate

    sentences = held_out(6)
    expected = LiteRTTranslator(unigram["path"]).translate(sentences)[0]
    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    reference.write_text("\n".join(expected) + "\n", encoding="utf-8")
    scores = evaluate(["--litert-model", unigram["path"], "--source", str(source),
                       "--reference", str(reference), "--quiet"])
    assert scores["bleu"] == pytest.approx(100.0)


@pytest.mark.slow
def test_the_demo_s_litert_exports_equal_its_savedmodel(tmp_path):
    """The real demo (bash scripts/demo.sh's model): float32 LiteRT gives
    the SavedModel's translations on 200 held-out sentences (at least 99%
    identical, the rest within float32 tolerance of score), and
    dynamic-int8 and float16 stay within 1.0 BLEU of float32 on 500."""
    from keras_transformer.cli.export import export
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export import load_translator
    from support.demo_run import run_demo

    done = run_demo(str(tmp_path), timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = str(tmp_path / "run")
    paths = {quantization: export(["--run-dir", run_dir, "--format", "litert", "--name", "demo",
                                   "--output-dir", str(tmp_path / "litert"),
                                   "--quantization", quantization])
             for quantization in litert.QUANTIZATIONS}
    sources, references = generate_corpus()["test"]
    saved = load_translator(str(tmp_path / "sm" / "demo")).translate(sources[:200],
                                                                      jit_compile=False)
    found = LiteRTTranslator(paths["float32"]).translate(sources[:200])
    different = [i for i, (a, b) in enumerate(zip(saved[0], found[0])) if a != b]
    assert len(different) <= 2, different
    same = [i for i in range(200) if i not in different]
    assert np.allclose(np.array(found[1])[same], np.array(saved[1])[same], atol=SCORE_TOLERANCE)
    bleu = {q: score_translations(LiteRTTranslator(p).translate(sources[:500])[0],
                                  references[:500])["bleu"] for q, p in paths.items()}
    assert abs(bleu["dynamic-int8"] - bleu["float32"]) <= 1.0, bleu
    assert abs(bleu["float16"] - bleu["float32"]) <= 1.0, bleu
