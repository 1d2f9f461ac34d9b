"""scripts/multi30k.sh end to end on a tiny stand-in corpus with Multi30k's
file layout: a wall-time-budgeted training run (--max-minutes), the average
of the last checkpoints (SELECTION=last) or of the ones with the lowest
validation loss (SELECTION=best), beam search over test_2016_flickr and
sacreBLEU. The real run is in
docs/training.md (Recipes)."""

import gzip
import json
import os
import re
import subprocess

import pytest

from support.processes import ENV, ROOT, write_corpus


def run_recipe(tmp_path, **settings):
    """scripts/multi30k.sh on a tiny corpus for 0.15 minutes; `settings`:
    its environment variables. Returns `(completed process, run directory)`."""
    data = tmp_path / "multi30k"
    data.mkdir()
    write_corpus(str(data))
    for lang in ("en", "de"):  # gzipped, as Multi30k ships
        lines = open(data / f"val.{lang}").read().splitlines()[:6]
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("\n".join(lines) + "\n")
    run = tmp_path / "run"
    env = {**ENV, "DATA": str(data), "RUN_DIR": str(run), "MINUTES": "0.06", **settings}
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "multi30k.sh"), "--config", "tiny",
         "--vocab-size", "400", "--batch-tokens", "128", "--max-length", "64",
         "--checkpoint-every", "3", "--validate-every", "5",
         "--warmup-steps", "20", "--shuffle-buffer", "50"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out, run


def check_selection(stdout, run, selection, member=None):
    """`run` trained until its wall-time budget, saved a checkpoint there
    and, for `selection`, kept what the recipe says; returns the names of
    the checkpoints the recipe should average. `member`: k of a MEMBERS
    run, whose training lines start with "[k] "."""
    line = rf"(?m)^\[{member}\] " if member else ""
    stopped = re.search(line + r"Stopping after 0\.1 minutes of training \(--max-minutes\) "
                        r"at step (\d+)", stdout)
    assert stopped, stdout[-3000:]
    step = int(stopped.group(1))
    assert re.search(line + re.escape(f"Training finished at step {step};"), stdout)
    assert (run / "checkpoints" / f"ckpt-{step}.index").exists()  # saved at the stop
    if selection == "best":
        # However many validations this machine's speed allowed (every 5
        # steps, and at the stop), the ones with the lowest validation loss,
        # up to 5, are averaged.
        index = json.loads((run / "best" / "index.json").read_text())
        assert index["metric"] == "loss"
        chosen = [entry["name"] for entry in index["best"]]
        assert 1 <= len(chosen) <= 5 and len(index["history"]) >= len(chosen)
        lowest = sorted(index["history"], key=lambda entry: entry["loss"])[:len(chosen)]
        assert {f"ckpt-{entry['step']}" for entry in lowest} == set(chosen)
        return chosen
    assert not (run / "best").exists()
    # However many checkpoints this machine's speed left (every 3 steps
    # and at the stop, 5 kept), the newest of them, up to 5, are averaged.
    kept = sorted((f[:-len(".index")] for f in os.listdir(run / "checkpoints")
                   if f.endswith(".index")), key=lambda name: int(name.split("-")[1]))
    return kept[-5:]


def check_averages(stdout, chosen):
    """kt-average's lines, one per run in order, name `chosen` (a list of
    checkpoint names per run)."""
    averaged = re.findall(r"Averaged (\d+) checkpoints \(([^)]*)\)", stdout)
    assert len(averaged) == len(chosen), stdout[-3000:]
    for (count, names), expected in zip(averaged, chosen):
        assert int(count) == len(expected) and set(names.split(", ")) == set(expected)


@pytest.mark.e2e
def test_the_recipe_runs_on_a_time_budget(tmp_path):
    """SELECTION=last on one model; SELECTION=best is checked on each member
    of the ensemble test below."""
    out, run = run_recipe(tmp_path, SELECTION="last")
    chosen = check_selection(out.stdout, run, "last")
    assert "validation BLEU" not in out.stdout  # neither recipe translates to validate
    check_averages(out.stdout, [chosen])
    assert "Loaded averaged/ckpt-" in out.stderr
    assert os.listdir(run / "averaged")
    assert "BLEU|nrefs:1|case:mixed|eff:no|tok:13a" in out.stdout
    assert len((run / "test_2016_flickr.hyp.de").read_text().splitlines()) == 6
    assert re.search(r"wall time: training \d+ s", out.stdout)


@pytest.mark.e2e
def test_members_train_side_by_side_and_translate_as_one_ensemble(tmp_path):
    """MEMBERS=2 with SELECTION=best: each member keeps and averages its
    own best checkpoints, and kt-evaluate decodes with both averages."""
    out, run = run_recipe(tmp_path, MEMBERS="2", SELECTION="best")
    second = tmp_path / "run-2"
    chosen = [check_selection(out.stdout, member_run, "best", member=k)
              for k, member_run in ((1, run), (2, second))]
    assert "validation BLEU" not in out.stdout
    args = json.loads((second / "train_args.json").read_text())
    assert args["seed"] == 2 and args["vocab"] == f"{run}/vocab.model"
    assert (second / "vocab.model").read_bytes() == (run / "vocab.model").read_bytes()
    check_averages(out.stdout, chosen)
    assert os.listdir(run / "averaged") and os.listdir(second / "averaged")
    # kt-evaluate loads both averages, as one ensemble.
    assert out.stderr.count("Loaded averaged/ckpt-") == 2, out.stderr[-3000:]
    assert "BLEU|nrefs:1|case:mixed|eff:no|tok:13a" in out.stdout
    assert len((run / "test_2016_flickr.hyp.de").read_text().splitlines()) == 6
    assert re.search(r"wall time: training \d+ s", out.stdout)


def test_a_bad_member_count_is_named(tmp_path):
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "multi30k.sh")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**ENV, "MEMBERS": "two", "DATA": str(tmp_path)})
    assert out.returncode == 2
    assert "MEMBERS must be a positive integer, not 'two'" in out.stderr
