"""Corpus BLEU and chrF with sacreBLEU, on detokenized text, with sacreBLEU's
signature strings (so a score says how it was computed); and the BLEU that
the Multi30k papers report, on lowercased, punctuation-normalised,
Moses-tokenized text (`tokenized_bleu`), which is a different number."""

import sacrebleu

__all__ = ["score_translations", "moses_tokenize", "tokenized_bleu"]

TOKENIZED_BLEU_LABEL = ("lowercased Moses-tokenized BLEU (the Multi30k papers' metric, "
                        "not sacreBLEU)")


def score_translations(hypotheses, references, tokenize="13a", tokenized_bleu_lang=None):
    """Scores detokenized `hypotheses` against one reference each.

    Args:
        hypotheses, references: lists of str, same length.
        tokenize: sacreBLEU's BLEU tokenizer (`13a` is WMT's default;
            `intl`, `zh`, `ja-mecab`, ... for other languages).
        tokenized_bleu_lang: also score with `tokenized_bleu` for this
            target language (e.g. "de"); None: sacreBLEU only.

    Returns: a dict with `bleu`, `chrf` (floats), `bleu_signature`,
    `chrf_signature` and `bleu_text`/`chrf_text` (sacreBLEU's one-liners);
    with `tokenized_bleu_lang` also `tokenized_bleu` and
    `tokenized_bleu_text`.

    Example:

    ```python
    from keras_transformer.evaluation import score_translations

    scores = score_translations(["Ein Hund läuft."], ["Ein Hund läuft."],
                                tokenized_bleu_lang="de")
    assert round(scores["bleu"], 6) == round(scores["tokenized_bleu"], 6) == 100.0
    assert scores["bleu_text"].startswith("BLEU|nrefs:1|case:mixed")
    ```
    """
    _check_lengths(hypotheses, references)
    bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    scores = {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_text": bleu_score.format(signature=str(bleu.get_signature())),
        "chrf_text": chrf_score.format(signature=str(chrf.get_signature())),
    }
    if tokenized_bleu_lang:
        scores.update(tokenized_bleu(hypotheses, references, tokenized_bleu_lang))
    return scores


def moses_tokenize(lines, lang):
    """The Multi30k dataset's `scripts/task1-tokenize.sh` in Python:
    lowercase, then Moses' `normalize-punctuation.perl -l lang`, then
    `tokenizer.perl -l lang` (with its escaping of `&`, `"`, `'`, `<`, `>`,
    `|`, `[`, `]`), through sacremoses. On test_2016_flickr it gives the
    dataset's `tok/*.lc.norm.tok.*` files line for line (tests/
    test_tokenized_bleu.py).

    Args:
        lines: list of str, detokenized.
        lang: a Moses language code ("en", "de", "fr", "cs", ...).

    Returns: a list of str, tokens separated by single spaces.

    Example:

    ```python
    from keras_transformer.evaluation import moses_tokenize

    assert moses_tokenize(["Ein Mann sagt: „Hallo!“"], "de") == [
        'ein mann sagt : &quot; hallo ! &quot;']
    ```
    """
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(lang=lang)
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True)
            for line in lines]


def tokenized_bleu(hypotheses, references, lang):
    """BLEU as the Multi30k papers report it (Elliott et al. 2016 and the
    WMT multimodal tasks; Wu et al. 2021): both sides through
    `moses_tokenize`, then corpus BLEU on the tokens as Moses'
    `multi-bleu.perl` computes it (sacreBLEU with tokenize "none"). It
    ignores case and punctuation style, so it is not comparable with cased,
    detokenized sacreBLEU; on this project's Multi30k outputs it reads a
    few tenths higher (docs/experiments.md).

    Returns: a dict with `tokenized_bleu` (float), `tokenized_bleu_text`
    (a one-liner labelled `TOKENIZED_BLEU_LABEL`) and `tokenized_bleu_lang`.

    Example:

    ```python
    from keras_transformer.evaluation import tokenized_bleu

    scores = tokenized_bleu(["a dog runs ."], ["A dog runs."], "en")
    assert round(scores["tokenized_bleu"], 6) == 100.0  # case and spacing ignored
    ```
    """
    _check_lengths(hypotheses, references)
    bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    score = bleu.corpus_score(moses_tokenize(hypotheses, lang),
                              [moses_tokenize(references, lang)])
    detail = score.format(width=2).split("=", 1)[1].strip()
    return {
        "tokenized_bleu": score.score,
        "tokenized_bleu_lang": lang,
        "tokenized_bleu_text": f"{TOKENIZED_BLEU_LABEL}, {lang} = {detail}",
    }


def _check_lengths(hypotheses, references):
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "one reference per line is expected."
        )
