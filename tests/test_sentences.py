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


def test_two_threads_split_with_one_segmenter():
    # kt-translate translates two windows at once; pysbd's Segmenter keeps
    # the text it segments on itself, so unguarded the threads' texts mix.
    import sys
    import threading

    texts = ["Mr. Jones is here. He waits. Then he leaves.", "One. Two? Three!",
             "Dr. Smith paid $3.50 for it. He said \"Cheap!\" Then he left."]
    expected = [sentences.split_sentences(text, "en") for text in texts]
    wrong = []

    def split(text, want):
        for _ in range(200):
            got = sentences.split_sentences(text, "en")
            if got != want:
                wrong.append(got)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python can
    try:
        threads = [threading.Thread(target=split, args=pair) for pair in zip(texts, expected)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
