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


def test_a_tiny_run_scores_every_choice_on_both_splits(tmp_path):
    output = tmp_path / "result.json"
    document = demo_settings.main([
        "--seeds", "1", "--config", "tiny", "--train-steps", "30", "--warmup-steps", "10",
        "--every", "5", "--first-end", "30", "--sentences", "6",
        "--work-dir", str(tmp_path / "work"), "--output", str(output)])
    written = json.loads(output.read_text())
    assert written["results"] == json.loads(json.dumps(document["results"]))
    assert list(written["results"]) == [f"30, {name}" for name in demo_settings.choices(30, 5)]
    for row in written["results"].values():
        assert set(row["validation"]) == set(row["test"]) == {"1"}
        assert all(0 <= value <= 100 for split in ("validation", "test")
                   for value in row[split].values())
    assert written["results"]["30, last 3, 5 apart"]["checkpoints"] == [20, 25, 30]
    kept = sorted(p.name for p in (tmp_path / "work" / "seed1" / "checkpoints").iterdir()
            if p.name.endswith(".index"))
    assert kept == sorted(f"ckpt-{step}.index" for step in range(5, 31, 5))  # all kept
