"""`python -m benchmarks savedmodel` (benchmarks/savedmodel_speed.py): one
export measured, or two side by side in one process (`--baseline`); the
ratios' direction on stand-ins whose speeds are known."""

import argparse
import time

import pytest
import tensorflow as tf

from benchmarks import savedmodel_speed
from test_tokenizer import CORPUS


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A random `tiny` export, searching 3 tokens past the source."""
    bench = savedmodel_speed
    root = tmp_path_factory.mktemp("exports")
    source = root / "source.txt"
    source.write_text("\n".join(CORPUS[:6]) + "\n", encoding="utf-8")
    args = argparse.Namespace(vocab_size=400, config="tiny", beam_size=2, alpha=0.6,
                              extra_length=3)
    return bench, str(source), bench.build_random_saved_model(CORPUS, str(root), args)


def run_script(bench, source, *flags):
    return bench.main(["--source", source, "--num-sentences", "4", "--batch-size", "2",
                       "--latency-runs", "2", *flags])


@pytest.mark.e2e
def test_one_model(exports):
    bench, source, path = exports
    result = run_script(bench, source, "--saved-model", path)
    assert (result["beam_size"], result["extra_length"], result["rounds"]) == (2, 3, 1)
    assert result["latency_runs"] == 2 and result["num_sentences"] == 4
    assert result["throughput_sentences_per_s"] > 0
    assert 0 < result["latency_p50_ms"] <= result["latency_p95_ms"]
    assert "baseline" not in result


@pytest.mark.e2e
def test_a_model_against_itself(exports):
    bench, source, path = exports
    result = run_script(bench, source, "--saved-model", path, "--baseline", path, "--rounds", "2")
    assert result["rounds"] == 2 and result["latency_runs"] == 4
    assert result["baseline"]["latency_runs"] == 4
    assert result["baseline"]["saved_model"] == path
    assert result["same_translations"] is True
    for key in ("throughput_ratio", "latency_p50_ratio"):
        low, high = result[f"{key}_range"]
        assert 0 < low <= result[key] <= high


def fake_export(seconds_per_sentence, word):
    def serve(text):
        time.sleep(seconds_per_sentence * len(text))
        return {"translation": tf.constant([word] * len(text))}
    return serve


def test_ratios_say_which_is_faster_and_each_side_keeps_its_settings():
    bench = savedmodel_speed
    # 8x apart, so that a loaded machine's sleep overshoot (a few ms per
    # call) cannot bring the ratios near the bounds below.
    serve = {"model": fake_export(0.005, "a"), "baseline": fake_export(0.04, "b")}
    metadata = {"model": dict(beam_size=4, alpha=0.6, extra_length=3),
                "baseline": dict(beam_size=4, alpha=0.6, extra_length=1)}
    result = bench.measure(serve, metadata, [["x", "y"], ["z"]], ["x", "y"], rounds=3)
    # The model takes an eighth of the baseline's time: ratios above 1.
    assert result["throughput_ratio"] > 2 and result["latency_p50_ratio"] > 2
    assert result["model"]["throughput_sentences_per_s"] > 2 * result["baseline"][
        "throughput_sentences_per_s"]
    assert (result["model"]["extra_length"], result["baseline"]["extra_length"]) == (3, 1)
    assert result["model"]["latency_runs"] == result["baseline"]["latency_runs"] == 6
    assert result["same_translations"] is False
    swapped = bench.measure({"model": serve["baseline"], "baseline": serve["model"]},
                            metadata, [["x"]], ["x"], rounds=2)
    assert swapped["throughput_ratio"] < 0.5 and swapped["latency_p50_ratio"] < 0.5


def test_bad_arguments_fail_before_any_work(exports, tmp_path, capsys):
    bench, source, path = exports
    with pytest.raises(SystemExit):
        run_script(bench, source, "--saved-model", path, "--baseline", str(tmp_path / "no"))
    assert "--baseline: No SavedModel at" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        run_script(bench, source, "--saved-model", str(tmp_path / "empty"))
    assert "--saved-model: No SavedModel at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_script(bench, source, "--saved-model", path, "--rounds", "0")
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_script(bench, source, "--saved-model", path, "--latency-runs", "0")
    assert "--latency-runs must be at least 1, got 0" in capsys.readouterr().err
