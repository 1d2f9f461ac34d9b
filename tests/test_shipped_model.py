"""The English->German Multi30k model shipped in saved_models/: its three
exports load (the SavedModel in plain TensorFlow with tensorflow-text, the
CTranslate2 directory through its engine, the LiteRT file through the
LiteRT interpreter), translate fixed captions into German, and the model
card states what its results files measured. Where
../shared/data/multi30k is present, `-m slow` scores test_2016_flickr with
each engine against the card."""

import json
import os
import re

import pytest

from support.processes import ROOT

SAVED_MODEL = os.path.join(ROOT, "saved_models", "multi30k_en_de")
CTRANSLATE2 = os.path.join(ROOT, "saved_models", "multi30k_en_de_ct2")
LITERT = os.path.join(ROOT, "saved_models", "multi30k_en_de_litert")
CARD = os.path.join(SAVED_MODEL, "README.md")
DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k")
SENTENCES = ["A man is riding a bicycle down the street.",
             "Two dogs are playing in the snow.",
             "A woman in a red dress is sitting on a bench.",
             "Children are playing soccer in a park."]
# Words a German caption of these sentences is made of; an English one
# shares almost none of them.
GERMAN = set("""ein eine einer einem einen der die das den dem des und mit auf in im
am an zwei mann frau kinder kind hunde hund fährt fahrrad rad straße spielen spielt
schnee sitzt sitzen bank kleid rotem roten rote rot park fußball einem einer hinunter
entlang die straße junge mädchen ist sind""".split())
ENGLISH = set("a the is are riding down street two dogs playing in snow woman dress "
              "sitting on bench children soccer park".split())


def words(text):
    return re.findall(r"\w+", text.lower())


def assert_german(translations):
    for source, translation in zip(SENTENCES, translations):
        assert translation.strip(), source
        assert "<unk>" not in translation and "⁇" not in translation, translation
        tokens = words(translation)
        german = sum(t in GERMAN for t in tokens)
        english = sum(t in ENGLISH and t not in GERMAN for t in tokens)
        assert german >= max(2, len(tokens) // 3) and english <= 1, (source, translation)


def card_results(kind="model-card"):
    """The results file of `kind` the model card names, loaded."""
    with open(CARD, encoding="utf-8") as f:
        card = f.read()
    match = re.search(r"benchmarks/results/([\w.-]+_" + kind + r"\.json)", card)
    assert match, f"the model card names no benchmarks/results/*_{kind}.json"
    with open(os.path.join(ROOT, "benchmarks", "results", match.group(1)),
              encoding="utf-8") as f:
        return card, json.load(f)


def test_the_savedmodel_loads_in_plain_tensorflow_and_translates_to_german():
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops)

    loaded = tf.saved_model.load(os.path.join(SAVED_MODEL, "1"))
    out = loaded.signatures["serving_default"](text=tf.constant(SENTENCES))
    assert_german([t.decode() for t in out["translation"].numpy()])


def test_the_ctranslate2_export_loads_in_its_engine_and_translates_to_german():
    pytest.importorskip("ctranslate2")
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

    translations, _ = CTranslate2Translator(CTRANSLATE2).translate(SENTENCES)
    assert_german(translations)


def test_the_litert_export_tokenizes_searches_and_detokenizes_inside_in_german():
    from keras_transformer.export.litert_translator import LiteRTTranslator, read_metadata

    assert read_metadata(LITERT)["tokenization"] == "in_model"
    translations, _ = LiteRTTranslator(LITERT).translate(SENTENCES)
    assert_german(translations)


def test_the_card_states_what_the_litert_results_file_measured():
    card, results = card_results("model-card-litert")
    scores = results["scores"]["litert"]
    for split in ("val", "test_2016_flickr"):
        for key in ("bleu", "chrf", "tokenized_bleu"):
            assert f"{scores[split][key]:.2f}" in card, (split, key)
        assert f"{results['identical_to_savedmodel'][split]:,}" in card, split
    speed = results["speed"]["litert"]
    assert f"{speed['p50_ms']:g}" in card and f"{speed['sentences_per_second']:g}" in card
    assert f"{results['sizes_bytes']['litert']:,}" in card
    assert results["commit"].split("+")[0] in card


def test_the_card_states_what_its_results_file_measured():
    card, results = card_results()
    for engine in ("savedmodel", "ctranslate2"):
        for split in ("val", "test_2016_flickr"):
            scores = results["scores"][engine][split]
            for key in ("bleu", "chrf", "tokenized_bleu"):
                assert f"{scores[key]:.2f}" in card, (engine, split, key, scores[key])
        speed = results["speed"][engine]
        assert f"{speed['p50_ms']:g}" in card and f"{speed['sentences_per_second']:g}" in card
    assert results["scores"]["savedmodel"]["test_2016_flickr"]["bleu_signature"] in card
    assert f"{results['parameters']:,}" in card
    assert results["cpu"]["model"] in card and results["commit"].split("+")[0] in card
    for engine, size in results["sizes_bytes"].items():
        assert f"{size:,}" in card, engine
    with open(os.path.join(CTRANSLATE2, "README.md"), encoding="utf-8") as f:
        assert "multi30k_en_de/README.md" in f.read()


@pytest.mark.slow
@pytest.mark.multi30k
@pytest.mark.parametrize("engine", ["savedmodel", "ctranslate2", "litert"])
def test_test_2016_flickr_scores_as_the_card_says(engine):
    if not os.path.isdir(DATA):
        pytest.skip(f"{DATA} is absent")
    import keras_transformer as kt
    from benchmarks.model_card import batched, read_lines
    from keras_transformer.evaluation import score_translations

    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
        from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

        translator = CTranslate2Translator(CTRANSLATE2)
    elif engine == "litert":
        from keras_transformer.export.litert_translator import LiteRTTranslator

        translator = LiteRTTranslator(LITERT)
    else:
        translator = kt.load_saved_model(SAVED_MODEL)
    sources = read_lines(DATA, "test_2016_flickr", "en")
    references = read_lines(DATA, "test_2016_flickr", "de")
    hypotheses = batched(translator.translate, sources, 32)
    scores = score_translations(hypotheses, references, tokenized_bleu_lang="de")
    _, results = card_results("model-card-litert" if engine == "litert" else "model-card")
    expected = results["scores"][engine]["test_2016_flickr"]
    assert abs(scores["tokenized_bleu"] - expected["tokenized_bleu"]) <= 0.5, scores
    assert abs(scores["bleu"] - expected["bleu"]) <= 0.5, scores
