"""Corpus BLEU and chrF with sacreBLEU, on detokenized text, with sacreBLEU's
signature strings (so a score says how it was computed)."""

import sacrebleu


def score_translations(hypotheses, references, tokenize="13a"):
    """Scores detokenized `hypotheses` against one reference each.

    Args:
        hypotheses, references: lists of str, same length.
        tokenize: sacreBLEU's BLEU tokenizer (`13a` is WMT's default;
            `intl`, `zh`, `ja-mecab`, ... for other languages).

    Returns: a dict with `bleu`, `chrf` (floats), `bleu_signature`,
    `chrf_signature` and `bleu_text`/`chrf_text` (sacreBLEU's one-liners).
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "one reference per line is expected."
        )
    bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_text": bleu_score.format(signature=str(bleu.get_signature())),
        "chrf_text": chrf_score.format(signature=str(chrf.get_signature())),
    }
