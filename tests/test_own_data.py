"""docs/own-data.md, "Train on your own data", executed: its bash blocks run
in order as one script, on the built-in corpus the page writes out, with the
sizes and update counts scaled down by the replacements in `SCALE` and
nothing else. Each replacement must match the page, so a change to a
documented command fails here until the test follows it. The page's
Multi30k block (step 1's alternative) runs in a test of its own, marked
`multi30k`, on the files in ../shared/data/multi30k."""

import os
import re
import subprocess
import sys

import pytest

from support.processes import ENV, ROOT

DOC = os.path.join(ROOT, "docs", "own-data.md")
MULTI30K = os.path.join(ROOT, "..", "shared", "data", "multi30k")
# The first line of the block that makes the TSV files from Multi30k instead.
MULTI30K_BLOCK = "# With Multi30k instead of the built-in corpus\n"

# (as documented, as run here): smaller files (the corpus writer's --train,
# --val and --test flags), a tiny model, few updates, outputs to files.
SCALE = [
    ("--write mine\n", "--write mine --train 3000 --val 60 --test 40\n"),
    ("preset: demo ", "preset: tiny "),
    ("  norm_first: true", "  num_layers: 1\n  norm_first: true"),
    ("train_steps: 2000", "train_steps: 40"),
    ("warmup_steps: 400", "warmup_steps: 20"),
    ("--validate-every 500", "--validate-every 10"),
    ("--bleu-sentences 500", "--bleu-sentences 16"),
    ("--checkpoint-every 500", "--checkpoint-every 10"),
    ("--early-stopping-patience 3", "--early-stopping-patience 2"),
    ("--n-best 3", "--n-best 3 --output mine/nbest.txt"),
    ("--seed 7", "--seed 7 --output mine/sample.txt"),
    ("head -n 5000", "head -n 200"),
    ("--train-steps 500", "--train-steps 6"),
    ("--warmup-steps 100", "--warmup-steps 4"),
    ("--validate-every 100", "--validate-every 3"),
    ("--checkpoint-every 100", "--checkpoint-every 3"),
]


def bash_blocks():
    text = open(DOC, encoding="utf-8").read()
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def documented_script():
    """The walk-through: every bash block of the page but the Multi30k one."""
    blocks = bash_blocks()
    walk = [b for b in blocks if not b.startswith(MULTI30K_BLOCK)]
    assert len(blocks) - len(walk) == 1, "the page's Multi30k block is gone or doubled"
    assert len(walk) >= 7, "the walk-through's bash blocks are gone"
    return "\n".join(walk)


def multi30k_block():
    return next(b for b in bash_blocks() if b.startswith(MULTI30K_BLOCK))


def bash(script, cwd, env, timeout):
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def command_env():
    """The test's environment with this Python's directory (the venv's
    `python` and kt-* console scripts) first on PATH, as where the package
    is installed."""
    return dict(ENV, PATH=os.path.dirname(sys.executable) + os.pathsep + ENV.get("PATH", ""))


def test_every_scaling_replacement_matches_the_page():
    script = documented_script()
    missing = [old for old, _ in SCALE if script.count(old) != 1]
    assert missing == [], f"docs/own-data.md does not have each of {missing} once: update SCALE"


@pytest.mark.e2e
def test_the_walk_through_runs_as_documented(tmp_path):
    script = documented_script()
    for old, new in SCALE:
        script = script.replace(old, new)
    env = command_env()
    run = bash(script, tmp_path, env, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]

    # 1: the built-in corpus as TSV files, of the sizes asked for.
    assert [len(open(tmp_path / f"mine/{split}.tsv").read().splitlines())
            for split in ("train", "val", "test")] == [3000, 60, 40]
    # 4: validation, the best kept apart, the checkpoint to ship, test BLEU.
    assert os.path.isfile(tmp_path / "runs/mine/best/index.json")
    assert "Training data: 3000 pairs from mine/train.tsv" in out
    assert re.search(r"The checkpoint to ship: best/ckpt-\d+: ", out), out[-4000:]
    assert re.search(r"Test BLEU \d+\.\d\d with ckpt-\d+ \(40 pairs from mine/test.tsv\)", out)
    config = open(tmp_path / "runs/mine/config.json").read()
    assert '"norm_first": true' in config and '"d_model": 64' in config
    assert '"num_layers": 1' in config
    # The vocabulary trained elsewhere has no pad piece: one id is added.
    import sentencepiece

    pieces = sentencepiece.SentencePieceProcessor(
        model_file=str(tmp_path / "mine/spm.model")).get_piece_size()
    assert f'"vocab_size": {pieces + 1}' in config and f'"pad_id": {pieces}' in config
    # 5: the export names the checkpoint it took and why.
    assert re.search(r"Exporting best/ckpt-\d+: ", out), out[-4000:]
    assert os.path.isfile(tmp_path / "mine/saved_models/mine/1/saved_model.pb")
    # 6: three hypotheses per input, best first; seeded samples.
    nbest = (tmp_path / "mine/nbest.txt").read_text().splitlines()
    assert [line.split(" ||| ")[0] for line in nbest] == ["0"] * 3 + ["1"] * 3
    for i in (0, 3):
        scores = [float(line.split(" ||| ")[2]) for line in nbest[i:i + 3]]
        assert scores == sorted(scores, reverse=True)
    samples = (tmp_path / "mine/sample.txt").read_text().splitlines()
    assert len(samples) == 2
    again = subprocess.run(
        ["kt-translate", "--saved-model", "mine/saved_models/mine", "--input",
         "mine/input.en", "--sampling", "--temperature", "0.8", "--top-p", "0.9",
         "--seed", "7"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == samples
    # Fine-tuning: a new run from the trained weights.
    assert re.search(r"Initialised from (best|averaged|checkpoints)/ckpt-\d+: .*; fresh "
                     r"optimizer", out), out[-4000:]
    tuned = out[out.index("Initialised from"):]
    assert "Training finished at step 6;" in tuned  # a fresh optimizer: from step 0
    assert os.path.isfile(tmp_path / "runs/mine-tuned/checkpoints/ckpt-6.index")


def test_the_written_corpus_is_the_builtin_one(tmp_path):
    """Step 1's files hold the pairs `--data builtin` trains on, in order."""
    from keras_transformer.data import synthetic

    paths = synthetic.write_tsv(str(tmp_path), seed=3, num_train=30, num_val=5, num_test=4)
    for split, named in (("train", "train"), ("val", "validation"), ("test", "test")):
        expected = [f"{s.decode()}\t{t.decode()}" for s, t in synthetic.builtin_source(
            "seed=3,train=30,val=5,test=4", named).as_numpy_iterator()]
        assert open(paths[split], encoding="utf-8").read().splitlines() == expected


@pytest.mark.multi30k
@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason="../shared/data/multi30k is absent")
def test_the_multi30k_block_makes_the_three_files(tmp_path):
    """Step 1's Multi30k alternative, as written, with DATA naming the files:
    three TSV files that kt-train's check accepts, every pair of the splits."""
    from keras_transformer.data import sources

    (tmp_path / "mine").mkdir()
    env = dict(command_env(), DATA=os.path.abspath(MULTI30K))
    run = bash(multi30k_block(), tmp_path, env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = {split: sources.count_pairs(tsv=str(tmp_path / f"mine/{split}.tsv"))
              for split in ("train", "val", "test")}
    assert counts == {"train": 29000, "val": 1014, "test": 1000}


# The flags of the tiny runs that the --init-from tests train and fine-tune.
TINY_RUN = ["--src-lang", "en", "--tgt-lang", "de", "--vocab-size", "400",
            "--validate-every", "3", "--checkpoint-every", "0", "--warmup-steps", "4",
            "--batch-tokens", "256", "--max-length", "32", "--valid-split", "",
            "--verbose", "0"]


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """A tiny run of 3 updates, trained once for the --init-from tests
    (`trained`, unigram vocabulary), and `other`, a directory holding only
    another vocabulary (BPE) of the same corpus. Returns `{"data",
    "trained", "other"}` (directories)."""
    import keras_transformer as kt
    from keras_transformer.cli import train as trainer

    from support.processes import write_corpus

    root = tmp_path_factory.mktemp("init-from")
    data = root / "data"
    data.mkdir()
    write_corpus(str(data))
    runs = {"data": str(data), "trained": str(root / "trained"), "other": str(root / "other")}
    assert trainer.main(["--run-dir", runs["trained"], "--data", f"text:{data}", "--config",
                         "tiny", "--train-steps", "3", *TINY_RUN]) == 0
    # Only its vocabulary is read: another one (BPE) of the same corpus.
    sentences = [line for lang in ("en", "de")
                 for line in (data / f"train.{lang}").read_text(encoding="utf-8").splitlines()]
    os.makedirs(runs["other"])
    kt.SubwordTokenizer.train(sentences, vocab_size=400, model_type="bpe").save(
        os.path.join(runs["other"], "vocab.model"))
    return runs


@pytest.mark.parametrize("flags, message", [
    (["--vocab", "{other}"], r"its source vocabulary \(\d+ ids\) is not the one given"),
    (["--config", "small"], r"the new run's model differs from the trained one in .*'d_model': \(64, 256\)"),
])
def test_init_from_refuses_another_vocabulary_or_architecture(trained_runs, tmp_path, flags,
                                                              message):
    """--init-from with a mismatched vocabulary or model is refused, naming
    what differs, before the new run writes anything."""
    from keras_transformer.cli import train as trainer

    flags = [f.format(other=os.path.join(trained_runs["other"], "vocab.model")) for f in flags]
    argv = ["--run-dir", str(tmp_path / "tuned"), "--init-from", trained_runs["trained"],
            "--data", f"text:{trained_runs['data']}", "--train-steps", "2", *TINY_RUN, *flags]
    args = trainer.build_parser().parse_args(argv)
    with pytest.raises(ValueError, match=message):
        trainer.train(args, argv)
    assert not os.path.exists(tmp_path / "tuned" / "config.json")


def test_init_from_takes_the_weights_and_leaves_the_optimizer_fresh(trained_runs):
    """A fine-tuning run's model starts with the trained weights, and its
    optimizer at step 0 with zero moments; with --keep-optimizer, the trained
    optimizer's step and moments come too."""
    import keras
    import numpy as np

    from keras_transformer.pipeline.trainer import restore_initial_weights
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.schedules import transformer_adam
    from keras_transformer.training.checkpoints import build_for_restore
    from keras_transformer.transformer import Transformer

    run = RunDirectory(trained_runs["trained"])
    expected = run.load_model("last", quiet=True)
    prefix, _ = run.resolve_checkpoint("last")
    for keep in (False, True):
        model = Transformer(run.load_config())
        optimizer = transformer_adam(64, warmup_steps=4)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        build_for_restore(model, optimizer)
        restore_initial_weights(model, optimizer, (prefix, "test"), keep)
        for a, b in zip(model.weights, expected.weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                          keras.ops.convert_to_numpy(b))
        moments = sum(float(np.abs(keras.ops.convert_to_numpy(v)).sum())
                      for v in optimizer.variables if "momentum" in v.path)
        assert int(optimizer.iterations.numpy()) == (3 if keep else 0)
        assert (moments > 0) == keep
