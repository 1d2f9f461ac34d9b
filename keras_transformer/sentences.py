"""Translating documents with a model trained on sentences: each line is
split into sentences with pysbd (Python Sentence Boundary Disambiguation,
rule-based, 23 languages, abbreviations, numbers and quotes included), the
sentences are translated, and each line's translations are joined back
with a space: one output line per input line.

pysbd's rules are Golden Rules tested (Sadvilkar and Neumann, 2020); its
languages: `pysbd.languages.LANGUAGE_CODES` (en, de, fr, es, it, nl, ru,
zh, ja, ...).
"""

import functools
import threading

# A pysbd Segmenter keeps the text it segments on itself: one thread at a
# time (kt-translate translates two windows at once).
_SEGMENTING = threading.Lock()


@functools.lru_cache(maxsize=None)
def _segmenter(language):
    try:
        import pysbd
    except ImportError:
        raise ImportError("splitting sentences needs pysbd: pip install pysbd") from None
    if language not in pysbd.languages.LANGUAGE_CODES:
        known = ", ".join(sorted(pysbd.languages.LANGUAGE_CODES))
        raise ValueError(f"no sentence splitter for language {language!r}; pysbd knows "
                         f"{known}.")
    return pysbd.Segmenter(language=language, clean=False)


def check_language(language):
    """Raises `ValueError` (naming the languages there are) when pysbd has
    no rules for `language`, `ImportError` without pysbd."""
    _segmenter(language)


def split_sentences(text, language):
    """The sentences of `text` (str or UTF-8 bytes), stripped; `[]` for
    a blank line. Thread-safe.

    Example:
    >>> split_sentences('Dr. Smith paid $3.50 for it. He said "Cheap!" Then he left.',
    ...                 "en")
    ['Dr. Smith paid $3.50 for it.', 'He said "Cheap!"', 'Then he left.']
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not text.strip():
        return []
    segmenter = _segmenter(language)
    with _SEGMENTING:
        found = segmenter.segment(text)
    return [s.strip() for s in found if s.strip()]


def translate_documents(translate, lines, language):
    """Translates each of `lines` sentence by sentence.

    Args:
        translate: `list of str -> list of str`, one translation per
            sentence (a translator's `translate(...)[0]`, say), called
            once with every sentence of `lines`.
        lines: str or UTF-8 bytes, one document (paragraph) each.
        language: the source language, for the sentence splitter.

    Returns: one str per line, its sentences' translations joined with a
    space ("" for a blank line).

    Example:
    >>> translate_documents(lambda sentences: [s.upper() for s in sentences],
    ...                     ["Mr. Jones is here. He waits.", "", "One."], "en")
    ['MR. JONES IS HERE. HE WAITS.', '', 'ONE.']
    """
    split = [split_sentences(line, language) for line in lines]
    flat = [sentence for sentences in split for sentence in sentences]
    translated = iter(translate(flat) if flat else [])
    return [" ".join(next(translated) for _ in sentences) for sentences in split]
