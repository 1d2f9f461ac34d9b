"""`python -m benchmarks demo-settings` (benchmarks/demo_settings.py): the
averaging choices it names are the checkpoints it averages, and a tiny run
trains, averages, scores both splits and writes its result."""

import json

import pytest

from benchmarks import demo_settings


def test_choices_name_the_checkpoints_they_average():
    assert demo_settings.choices(1200, 100) == {
        "the last alone": [1200],
        "last 3, 200 apart": [800, 1000, 1200],
        "last 3, 100 apart": [1000, 1100, 1200],
        "last 5, 100 apart": [800, 900, 1000, 1100, 1200],
    }


@pytest.mark.parametrize("flags, message", [
    (["--first-end", "30", "--every", "10"], "room for 5 checkpoints"),
    (["--first-end", "1500"], "at most --train-steps")])
def test_bad_flags_are_refused(flags, message, capsys):
    with pytest.raises(SystemExit):
        demo_settings.main(flags)
    assert message in capsys.readouterr().err


@pytest.mark.e2e
def test_a_tiny_run_scores_every_choice_on_both_splits(tmp_path, monkeypatch):
    # Thirty updates teach the tiny model nothing (BLEU 0.0 on both splits),
    # so docs/performance.md's figures (92.04 and up) are the full run's. Each
    # average still translates, and then the reference is put in its place:
    # every choice must score 100 on the validation split and on the test
    # split, which fails where a split is scored against the other's
    # references or the sentences and references fall out of line.
    from keras_transformer.data.synthetic import builtin_source
    from keras_transformer.export.translator import Translator

    answers = {s.decode(): t.decode() for split in ("validation", "test")
               for s, t in builtin_source("", split, "en", "synth").take(6).as_numpy_iterator()}
    translate = Translator.translate

    def translate_then_answer(self, sentences, **kwargs):
        _, scores = translate(self, sentences, **kwargs)
        return [answers[s] for s in sentences], scores

    monkeypatch.setattr(Translator, "translate", translate_then_answer)
    output = tmp_path / "result.json"
    document = demo_settings.main([
        "--seeds", "1", "--config", "tiny", "--train-steps", "30", "--warmup-steps", "10",
        "--every", "5", "--first-end", "30", "--sentences", "6",
        "--work-dir", str(tmp_path / "work"), "--output", str(output), "--no-xla"])
    written = json.loads(output.read_text())
    assert written["results"] == json.loads(json.dumps(document["results"]))
    assert list(written["results"]) == [f"30, {name}" for name in demo_settings.choices(30, 5)]
    for row in written["results"].values():
        assert set(row["validation"]) == set(row["test"]) == {"1"}
        # Identical text scores exactly 100 after the benchmark's rounding
        # to 2 decimals, on every CPU (sacreBLEU counts in Python).
        assert row["validation"] == row["test"] == {"1": 100.0}, row
    assert written["results"]["30, last 3, 5 apart"]["checkpoints"] == [20, 25, 30]
    kept = sorted(p.name for p in (tmp_path / "work" / "seed1" / "checkpoints").iterdir()
            if p.name.endswith(".index"))
    assert kept == sorted(f"ckpt-{step}.index" for step in range(5, 31, 5))  # all kept
