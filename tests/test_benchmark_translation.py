"""training/benchmark_translation.py: one export measured, or two side by
side in one process (`--baseline`)."""

import argparse

import pytest

from test_tokenizer import CORPUS
from test_translate_cli import script


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two random `tiny` exports with one vocabulary and the same weights
    (seed 0), one searching 3 tokens past the source, one 1."""
    bench = script("benchmark_translation")
    root = tmp_path_factory.mktemp("exports")
    source = root / "source.txt"
    source.write_text("\n".join(CORPUS[:6]) + "\n", encoding="utf-8")
    paths = {}
    for extra in (3, 1):
        args = argparse.Namespace(vocab_size=400, config="tiny", beam_size=2, alpha=0.6,
                                  extra_length=extra)
        paths[extra] = bench.build_random_saved_model(CORPUS, str(root / f"extra{extra}"), args)
    return bench, str(source), paths


def measure(bench, source, *flags):
    return bench.main(["--source", source, "--num-sentences", "4", "--batch-size", "2",
                       "--latency-runs", "2", *flags])


def test_one_model(exports):
    bench, source, paths = exports
    result = measure(bench, source, "--saved-model", paths[3])
    assert (result["beam_size"], result["extra_length"], result["rounds"]) == (2, 3, 1)
    assert result["latency_runs"] == 2 and result["num_sentences"] == 4
    assert result["throughput_sentences_per_s"] > 0
    assert 0 < result["latency_p50_ms"] <= result["latency_p95_ms"]
    assert "baseline" not in result


def test_a_model_against_itself_and_against_another(exports):
    bench, source, paths = exports
    same = measure(bench, source, "--saved-model", paths[3], "--baseline", paths[3],
                   "--rounds", "2")
    assert same["rounds"] == 2 and same["latency_runs"] == 4
    assert same["baseline"]["latency_runs"] == 4
    assert same["same_translations"] is True
    for key in ("throughput_ratio", "latency_p50_ratio"):
        low, high = same[f"{key}_range"]
        assert 0 < low <= same[key] <= high

    # Random weights rarely emit eos, so a shorter length limit changes the
    # translations; each side reports its own export's settings.
    other = measure(bench, source, "--saved-model", paths[3], "--baseline", paths[1],
                    "--rounds", "1")
    assert other["same_translations"] is False
    assert (other["extra_length"], other["baseline"]["extra_length"]) == (3, 1)


def test_bad_arguments_fail_before_any_work(exports, tmp_path, capsys):
    bench, source, paths = exports
    with pytest.raises(SystemExit):
        measure(bench, source, "--saved-model", paths[3], "--baseline", str(tmp_path / "no"))
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        measure(bench, source, "--saved-model", paths[3], "--rounds", "0")
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        measure(bench, source, "--saved-model", paths[3], "--latency-runs", "0")
    assert "--latency-runs must be at least 1, got 0" in capsys.readouterr().err
