"""Documents translated sentence by sentence (`keras_transformer/sentences.py`,
kt-translate --split-sentences): paragraphs with abbreviations, numbers and
quotes split where a reader would, one output line per input line."""

import doctest

import pytest

from keras_transformer import sentences


def test_the_examples_run():
    assert doctest.testmod(sentences).failed == 0


@pytest.mark.parametrize("language, text, expected", [
    ("en", "Mr. and Mrs. Jones live in the U.S. They have 3 kids, e.g. Tom.",
     ["Mr. and Mrs. Jones live in the U.S.", "They have 3 kids, e.g. Tom."]),
    ("en", "It costs $3.50 (about 2.5 kg). She asked: \"Why not?\" Nobody knew.",
     ["It costs $3.50 (about 2.5 kg).", "She asked: \"Why not?\"", "Nobody knew."]),
    ("de", "Herr Dr. Müller kam am 3. Mai. Er sagte: „Hallo!“ Dann ging er.",
     ["Herr Dr. Müller kam am 3. Mai.", "Er sagte: „Hallo!“", "Dann ging er."]),
    ("en", "no punctuation at all", ["no punctuation at all"]),
    ("en", "   ", []),
])
def test_paragraphs_split_where_a_reader_would(language, text, expected):
    assert sentences.split_sentences(text, language) == expected
    assert sentences.split_sentences(text.encode(), language) == expected


def test_one_output_line_per_input_line_in_one_call():
    calls = []

    def translate(batch):
        calls.append(list(batch))
        return [f"<{s}>" for s in batch]

    lines = [b"One. Two.", b"", "Three? Four! Five.", "   "]
    assert sentences.translate_documents(translate, lines, "en") == [
        "<One.> <Two.>", "", "<Three?> <Four!> <Five.>", ""]
    assert calls == [["One.", "Two.", "Three?", "Four!", "Five."]]
    assert sentences.translate_documents(translate, ["", ""], "en") == ["", ""]
    assert len(calls) == 1  # nothing to translate: no call


def test_an_unknown_language_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"no sentence splitter for language 'xx'; pysbd "
                                         r"knows .*\bde\b.*\ben\b"):
        sentences.check_language("xx")
