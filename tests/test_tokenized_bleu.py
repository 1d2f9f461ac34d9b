"""The Multi30k papers' BLEU (`evaluation.tokenized_bleu`): its
tokenization reproduces the dataset's own tokenized files, and kt-evaluate
prints it beside sacreBLEU, labelled."""

import hashlib
import io
import json
import os

import pytest
import sacrebleu
from test_translate_cli import make_run_directory

from keras_transformer.cli import evaluate
from keras_transformer.evaluation import (
    TOKENIZED_BLEU_LABEL,
    moses_tokenize,
    score_translations,
    tokenized_bleu,
)

HERE = os.path.dirname(__file__)
MULTI30K = os.path.join(HERE, "..", "..", "shared", "data", "multi30k")
DIGESTS = os.path.join(HERE, "support", "data", "multi30k_tokenized_sha256.json")


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason="../shared/data/multi30k is absent")
@pytest.mark.parametrize("name", ["test_2016_flickr.de", "test_2016_flickr.en"])
def test_tokenization_reproduces_the_dataset_tokenized_reference(name):
    """The raw test_2016_flickr file through `moses_tokenize` is the
    dataset's `tok/test_2016_flickr.lc.norm.tok.<lang>` line for line (the
    expected lines are kept as digests, not as corpus text)."""
    with open(DIGESTS, encoding="utf-8") as f:
        expected = json.load(f)["files"][name]
    with open(os.path.join(MULTI30K, name), encoding="utf-8") as f:
        raw = f.read().split("\n")[:-1]
    assert len(raw) == len(expected) == 1000
    tokenized = moses_tokenize(raw, name.rsplit(".", 1)[1])
    wrong = [(i + 1, raw[i], line) for i, line in enumerate(tokenized)
             if hashlib.sha256(line.encode("utf-8")).hexdigest()[:16] != expected[i]]
    assert not wrong, f"{len(wrong)} lines differ from the dataset's, the first: {wrong[:3]}"


def test_it_ignores_case_and_punctuation_style_and_sacrebleu_does_not():
    references = ["Ein Mann sagt: „Hallo!“", "Zwei Hunde spielen im Schnee."]
    hypotheses = ['ein mann sagt : " hallo ! "', "zwei Hunde spielen im Schnee ."]
    scores = score_translations(hypotheses, references, tokenized_bleu_lang="de")
    assert scores["tokenized_bleu"] == pytest.approx(100.0)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score < 60
    # One word wrong costs the tokenized score as multi-bleu.perl counts it.
    worse = tokenized_bleu(["ein mann sagt : " "\" hallo ! \"", "zwei katzen spielen im schnee ."],
                           references, "de")
    tokens = moses_tokenize(references, "de")
    expected = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
        ['ein mann sagt : &quot; hallo ! &quot;', "zwei katzen spielen im schnee ."],
        [tokens]).score
    assert worse["tokenized_bleu"] == pytest.approx(expected) and expected < 100
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        tokenized_bleu(hypotheses, references[:1], "de")


def test_kt_evaluate_prints_it_on_its_own_labelled_line(tmp_path):
    run = make_run_directory(str(tmp_path / "run"), num_layers=1)
    source, reference = tmp_path / "src", tmp_path / "ref"
    source.write_text("Ein Mann fährt.\nDie Mädchen laufen.\n", encoding="utf-8")
    reference.write_text("A man rides.\nThe girls run.\n", encoding="utf-8")
    files = ["--run-dir", run.path, "--source", str(source), "--reference", str(reference),
             "--hypotheses", str(tmp_path / "hyp")]
    out = io.StringIO()
    scores = evaluate.evaluate([*files, "--tokenized-bleu", "en"], stdout=out)
    lines = out.getvalue().split("\n")
    assert lines[0].startswith("BLEU|nrefs:1|case:mixed") and lines[1].startswith("chrF2")
    assert lines[2].startswith(f"{TOKENIZED_BLEU_LABEL}, en = ") and lines[3] == ""
    hypotheses = (tmp_path / "hyp").read_text(encoding="utf-8").split("\n")[:-1]
    assert scores["tokenized_bleu"] == tokenized_bleu(
        hypotheses, ["A man rides.", "The girls run."], "en")["tokenized_bleu"]
    # Without the flag, sacreBLEU alone, as before.
    out = io.StringIO()
    assert "tokenized_bleu" not in evaluate.evaluate(files, stdout=out)
    assert len(out.getvalue().split("\n")) == 3
