"""The vocabulary map (`export/vocabulary_map.py`): built from
co-occurrence, written in CTranslate2's format, exported beside a
CTranslate2 model and used by its engine (`use_vmap`), by kt-export
--vocabulary-map from a run's training data."""

import contextlib
import io
import json
import os

import pytest

from keras_transformer.export.vocabulary_map import (
    VOCABULARY_MAP_FILE,
    build_vocabulary_map,
    read_vocabulary_map,
    write_vocabulary_map,
)

PAIRS = [("the dog runs", "der Hund rennt"), ("the cat runs", "die Katze rennt"),
         ("a dog sleeps", "ein Hund schläft"), ("a cat sleeps", "eine Katze schläft")] * 3


def test_each_source_word_keeps_the_target_words_it_predicts():
    mapping = build_vocabulary_map(PAIRS, str.split, str.split, per_source=1, always=0)
    assert mapping["dog"] == ["Hund"] and mapping["cat"] == ["Katze"]
    assert mapping["runs"] == ["rennt"] and mapping["sleeps"] == ["schläft"]
    # Pieces found everywhere, and the special tokens, are always allowed.
    mapping = build_vocabulary_map(PAIRS, str.split, str.split, per_source=2, always=1,
                                   special=("</s>",))
    assert mapping[""][0] == "</s>" and len(mapping[""]) == 2
    # A pair seen fewer than min_count times is no evidence.
    assert "dog" not in build_vocabulary_map(PAIRS[:4], str.split, str.split, min_count=3)
    assert build_vocabulary_map(PAIRS[:4], str.split, str.split, min_count=2)["dog"] == ["Hund"]


def test_bad_settings_and_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="per_source must be >= 1"):
        build_vocabulary_map(PAIRS, str.split, str.split, per_source=0)
    with pytest.raises(ValueError, match="at least one sentence pair"):
        build_vocabulary_map([], str.split, str.split)
    with pytest.raises(ValueError, match="whitespace"):
        write_vocabulary_map(tmp_path / "m", {"a b": ["c"]})
    bad = tmp_path / "bad"
    bad.write_text("\tx\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad:2: no tab"):
        read_vocabulary_map(str(bad))


def test_the_engine_uses_an_exported_map(tmp_path):
    pytest.importorskip("ctranslate2")
    from benchmarks.tiny_serving import _tiny_translator
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

    translator, model = _tiny_translator(7)
    tokenizer = translator.tokenizer
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    pairs = [("the dog sees a cat", "der Hund sieht eine Katze")] * 3

    def pieces(text):
        return processor.encode(text, out_type=str)

    mapping = build_vocabulary_map(pairs, pieces, pieces, always=5)
    path = export_ctranslate2(model, tokenizer, tokenizer, str(tmp_path / "m"),
                              vocabulary_map=mapping)
    assert read_vocabulary_map(os.path.join(path, VOCABULARY_MAP_FILE)) == mapping
    used = CTranslate2Translator(path)
    assert used.use_vmap
    used.translate(["the dog sees a cat"], beam_size=1)  # the engine runs with it
    result = used.translator.translate_batch([pieces("the dog sees a cat")], beam_size=1,
                                             max_decoding_length=10, use_vmap=True)
    config = model.config
    # CTranslate2 always allows unk, bos and eos besides the map's pieces.
    specials = {used.target_tokens[i] for i in (config.bos_id, config.eos_id, 0)}
    allowed = {p for ps in mapping.values() for p in ps} | specials
    assert set(result[0].hypotheses[0]) <= allowed  # only mapped pieces come out
    assert not CTranslate2Translator(path, vocabulary_map="off").use_vmap
    plain = export_ctranslate2(model, tokenizer, tokenizer, str(tmp_path / "plain"))
    with pytest.raises(FileNotFoundError, match="kt-export --vocabulary-map"):
        CTranslate2Translator(plain, vocabulary_map="on")
    with pytest.raises(ValueError, match="target pieces the model does not have"):
        export_ctranslate2(model, tokenizer, tokenizer, str(tmp_path / "x"),
                           vocabulary_map={"": ["no-such-piece"]})


def test_kt_export_builds_the_map_from_the_run_s_training_data(tmp_path):
    pytest.importorskip("ctranslate2")
    from test_translate_cli import make_run_directory

    from keras_transformer.cli import export

    run = make_run_directory(str(tmp_path / "run"))
    with open(os.path.join(run.path, "train_args.json"), "w") as f:
        json.dump({"data": "builtin:train=200,val=10,test=10", "src_lang": "en",
                   "tgt_lang": "synth"}, f)
    with contextlib.redirect_stdout(io.StringIO()):
        path = export.export(["--run-dir", run.path, "--output-dir", str(tmp_path / "out"),
                              "--format", "ctranslate2", "--vocabulary-map"])
    mapping = read_vocabulary_map(os.path.join(path, VOCABULARY_MAP_FILE))
    assert len(mapping) > 10 and mapping[""]
    with pytest.raises(SystemExit):
        export.main(["--run-dir", run.path, "--vocabulary-map"])
