"""RunDirectory: vocabulary layouts, `--checkpoint` selectors and stale
averaged checkpoints, on hand-made run directories (model-only checkpoints
with distinct weights; no training)."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_directory import RunDirectory
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from keras_transformer.training.checkpoints import average_checkpoints, averaged_if_asked
from test_tokenizer import CORPUS


def weights(model):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in model.weights]


def set_weights(model, seed):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if np.issubdtype(np.dtype(variable.dtype), np.floating):
            variable.assign(rng.normal(size=variable.shape).astype(variable.dtype))


def make_run(tmp_path, config, steps=(100, 200, 300)):
    """A run with training checkpoints at `steps` whose weights are
    `set_weights(model, step)`. Returns `(run, model)`."""
    run = RunDirectory(str(tmp_path / "run"))
    run.save_config(config)
    model = kt.Transformer(config)
    model.build()
    for step in steps:
        save_training_checkpoint(run, model, step)
    return run, model


def save_training_checkpoint(run, model, step):
    set_weights(model, step)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run.checkpoint_dir,
                                         max_to_keep=10, checkpoint_name="ckpt")
    return manager.save(checkpoint_number=step)


def save_best(run, model, entries, metric="bleu"):
    """A `best/` as `BestCheckpoints` leaves it: `entries` `(step, value)`
    best first, weights `set_weights(model, step)`."""
    best = []
    for step, value in entries:
        set_weights(model, step)
        checkpoint = tf.train.Checkpoint(model=model)
        checkpoint.save_counter  # noqa: B018  (so that `write` saves it, as BestCheckpoints does)
        checkpoint.write(os.path.join(run.best_dir, f"ckpt-{step}"))
        best.append({"name": f"ckpt-{step}", "step": step, "value": value})
    history = [{"step": s, "loss": None, metric: v} for s, v in sorted(entries)]
    with open(os.path.join(run.best_dir, "index.json"), "w") as f:
        json.dump({"metric": metric, "keep": len(entries), "history": history, "best": best}, f)


def loaded_equals_step(run, selector, step, capsys=None):
    model = run.load_model(selector, quiet=True)
    reference = kt.Transformer(run.load_config())
    reference.build()
    set_weights(reference, step)
    for a, b in zip(weights(model), weights(reference)):
        np.testing.assert_array_equal(a, b)
    return True


# Vocabularies ----------------------------------------------------------------


def test_shared_and_separate_vocabularies(tmp_path, tiny_config):
    source = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    target = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=390))

    shared = RunDirectory(str(tmp_path / "shared"))
    shared.save_config(tiny_config)
    assert not shared.exists()
    shared.save_tokenizers(source)
    assert shared.exists() and shared.shared_vocabulary()
    assert sorted(os.listdir(shared.path)) == ["config.json", "vocab.model"]
    a, b = shared.load_tokenizers()
    assert a is b and a.vocab_size == source.vocab_size
    assert shared.load_tokenizer().vocab_size == source.vocab_size

    separate = RunDirectory(str(tmp_path / "separate"))
    separate.save_config(tiny_config)
    separate.save_tokenizers(source, target)
    assert not os.path.exists(separate.file("vocab.model"))
    assert separate.exists() and not separate.shared_vocabulary()
    a, b = separate.load_tokenizers()
    assert (a.vocab_size, b.vocab_size) == (source.vocab_size, target.vocab_size)
    with pytest.raises(ValueError, match="load_tokenizers"):
        separate.load_tokenizer()

    # Half a separate layout is not a run directory.
    os.remove(separate.file("tgt_vocab.model"))
    assert not separate.exists()
    with pytest.raises(FileNotFoundError, match="src_vocab.model"):
        separate.load_tokenizers()


# Selectors -------------------------------------------------------------------


def test_last_best_prefix_and_auto_without_averaging(tmp_path, tiny_config, capsys):
    run, model = make_run(tmp_path, tiny_config)
    prefix, reason = run.resolve_checkpoint("last")
    assert prefix == os.path.join(run.checkpoint_dir, "ckpt-300")
    assert reason == "checkpoints/ckpt-300: the latest training checkpoint"
    assert run.resolve_checkpoint() == (prefix, reason)
    assert run.resolve_checkpoint("auto") == (prefix, reason)
    with pytest.raises(FileNotFoundError, match="index.json"):
        run.resolve_checkpoint("best")
    with pytest.raises(FileNotFoundError, match="kt-average"):
        run.resolve_checkpoint("averaged")

    # A prefix, absolute or relative to the run directory.
    named = os.path.join(run.checkpoint_dir, "ckpt-100")
    assert run.resolve_checkpoint(named)[0] == named
    assert run.resolve_checkpoint("checkpoints/ckpt-100") == (
        named, "checkpoints/ckpt-100: a training checkpoint (named by --checkpoint)")
    with pytest.raises(FileNotFoundError, match="ckpt-150.index"):
        run.resolve_checkpoint("checkpoints/ckpt-150")
    with pytest.raises(ValueError, match="Unknown checkpoint selector"):
        run.resolve_checkpoint("newest:3")

    # With best/, auto prefers the best checkpoint.
    save_best(run, model, [(200, 31.5), (300, 30.0)])
    prefix, reason = run.resolve_checkpoint("best")
    assert prefix == os.path.join(run.best_dir, "ckpt-200")
    assert reason == ("best/ckpt-200: the best of 2 validations by validation BLEU "
                      "(31.50 at step 200)")
    assert run.resolve_checkpoint() == (prefix, reason)
    assert loaded_equals_step(run, None, 200)
    assert loaded_equals_step(run, "last", 300)
    assert loaded_equals_step(run, "checkpoints/ckpt-100", 100)

    # load_model says what it loaded.
    capsys.readouterr()
    run.load_model("best")
    assert capsys.readouterr().err == f"Loaded {reason}\n"


def test_nothing_to_load_names_the_directories(tmp_path, tiny_config):
    run, _ = make_run(tmp_path, tiny_config, steps=())
    with pytest.raises(FileNotFoundError, match="No training checkpoint in .*checkpoints"):
        run.resolve_checkpoint()
    with pytest.raises(FileNotFoundError, match="No checkpoints in"):
        run.resolve_checkpoint(averaged_if_asked(run, "last:2"))
    with pytest.raises(FileNotFoundError, match="No best checkpoints in .*best"):
        run.resolve_checkpoint(averaged_if_asked(run, "best:2"))


def test_averaged_sources_and_staleness(tmp_path, tiny_config, capsys):
    run, model = make_run(tmp_path, tiny_config)
    output, inputs = average_checkpoints(run, 2)
    with open(os.path.join(run.averaged_dir, "sources.json")) as f:
        sources = json.load(f)
    assert sources == {
        "output": "ckpt-300", "chosen": "last", "num": 2, "newest_training_step": 300,
        "sources": [{"prefix": "checkpoints/ckpt-200", "step": 200},
                    {"prefix": "checkpoints/ckpt-300", "step": 300}],
    }
    # auto: the fresh average.
    prefix, reason = run.resolve_checkpoint()
    assert prefix == output == os.path.join(run.averaged_dir, "ckpt-300")
    assert reason == "averaged/ckpt-300: the average of ckpt-200..ckpt-300 (last 2)"
    assert run.averaged_staleness() == (False, None)

    # Training goes on after averaging: auto refuses, naming both.
    save_training_checkpoint(run, model, 400)
    with pytest.raises(ValueError) as error:
        run.resolve_checkpoint("auto")
    message = str(error.value)
    for part in ("stale", "ckpt-200..ckpt-300", "checkpoints/ckpt-400", "kt-average",
                 "--checkpoint last", "--checkpoint averaged"):
        assert part in message, (part, message)
    # Explicitly: loaded, and the reason says it is stale.
    prefix, reason = run.resolve_checkpoint("averaged")
    assert prefix == output
    assert "STALE" in reason and "older than checkpoints/ckpt-400" in reason
    capsys.readouterr()
    run.load_model("averaged")
    assert "STALE" in capsys.readouterr().err
    assert "STALE" in run.resolve_checkpoint(output)[1]  # named by its prefix too
    assert loaded_equals_step(run, "last", 400)

    # Averaging again makes it fresh.
    average_checkpoints(run, 2)
    assert run.resolve_checkpoint()[0] == os.path.join(run.averaged_dir, "ckpt-400")


def test_averaged_without_sources_is_used_only_when_not_older(tmp_path, tiny_config):
    run, model = make_run(tmp_path, tiny_config)
    output, _ = average_checkpoints(run, 2)
    os.remove(os.path.join(run.averaged_dir, "sources.json"))  # an older run's averaged/
    prefix, reason = run.resolve_checkpoint()
    assert prefix == output and "not recorded" in reason
    assert run.averaged_staleness() == (None, None)
    save_training_checkpoint(run, model, 400)
    prefix, reason = run.resolve_checkpoint()
    assert prefix == os.path.join(run.checkpoint_dir, "ckpt-400")
    assert "averaged/ckpt-300 not used" in reason
    assert "possibly stale" in run.resolve_checkpoint("averaged")[1]


def test_sources_of_another_average_do_not_count(tmp_path, tiny_config):
    # A crash between the checkpoint and sources.json leaves no record, never
    # a wrong one: a sources.json naming another checkpoint is ignored.
    run, _ = make_run(tmp_path, tiny_config)
    average_checkpoints(run, 2)
    path = os.path.join(run.averaged_dir, "sources.json")
    with open(path) as f:
        sources = json.load(f)
    sources["output"] = "ckpt-200"
    with open(path, "w") as f:
        json.dump(sources, f)
    assert run.averaged_sources() is None


@pytest.mark.parametrize("selector", ["last:2", "best:2"])
def test_best_k_and_last_k_average_the_right_checkpoints(tmp_path, tiny_config, selector):
    run, model = make_run(tmp_path, tiny_config, steps=(100, 200, 300, 400))
    # best by BLEU: 300, 100, 400 (so best:2 is {100, 300}, last:2 is {300, 400}).
    save_best(run, model, [(300, 20.0), (100, 18.0), (400, 11.0)])
    expected_steps = [300, 400] if selector == "last:2" else [100, 300]
    # The run directory writes no checkpoint: the averaging is its caller's.
    with pytest.raises(ValueError, match="averages checkpoints first"):
        run.resolve_checkpoint(selector)
    assert run.averaged_checkpoint() is None
    assert averaged_if_asked(run, "best") == "best"
    prefix, reason = run.resolve_checkpoint(averaged_if_asked(run, selector))
    assert prefix == os.path.join(run.averaged_dir, f"ckpt-{expected_steps[-1]}")
    if selector == "last:2":
        assert reason == "averaged/ckpt-400: the average of ckpt-300..ckpt-400 (last 2)"
    else:
        assert reason == ("averaged/ckpt-300: the average of the best 2 by validation BLEU "
                          "(ckpt-300 20.00, ckpt-100 18.00)")
    with open(os.path.join(run.averaged_dir, "sources.json")) as f:
        sources = json.load(f)
    assert sources["chosen"] == selector.split(":")[0]
    assert [s["step"] for s in sources["sources"]] == expected_steps
    assert sources["newest_training_step"] == 400

    manual = []
    for step in expected_steps:
        set_weights(model, step)
        manual.append(weights(model))
    averaged = run.load_model(prefix, quiet=True)
    for i, got in enumerate(weights(averaged)):
        if np.issubdtype(got.dtype, np.floating):
            np.testing.assert_allclose(got, np.mean([m[i] for m in manual], axis=0),
                                       rtol=1e-6, atol=1e-7)
    # An average of best checkpoints is not stale while training has not
    # gone past the step it was made at, though best/ckpt-300 < ckpt-400.
    assert run.averaged_staleness() == (False, None)
    assert run.resolve_checkpoint()[0] == prefix
    with pytest.raises(ValueError, match="keeps only 3"):
        averaged_if_asked(run, "best:4")


# Commands --------------------------------------------------------------------


def test_kt_average_from_best_and_kt_export_say_what_they_use(tmp_path, tiny_config, capsys,
                                                             monkeypatch):
    from keras_transformer import export as export_package
    from keras_transformer.cli import average, export

    run, model = make_run(tmp_path, tiny_config, steps=(100, 200, 300))
    save_best(run, model, [(200, 25.0), (100, 24.0), (300, 20.0)])
    assert average.main(["--run-dir", run.path, "--from", "best", "--num", "2"]) == 0
    out = capsys.readouterr().out
    assert "Averaged 2 checkpoints (ckpt-100, ckpt-200)" in out
    assert "the best 2 by validation BLEU (ckpt-200 25.00, ckpt-100 24.00)" in out
    assert average.main(["--run-dir", run.path, "--from", "best", "--checkpoints",
                         "ckpt-100"]) == 2
    assert "--from best" in capsys.readouterr().err

    # kt-export: which checkpoint on stderr, the SavedModel path last on stdout.
    loaded = []
    monkeypatch.setattr(export_package, "translator_from_run_directory",
                        lambda run, checkpoint, **options: loaded.append(checkpoint))
    monkeypatch.setattr(export_package, "export_translator",
                        lambda translator, output_dir, name, version, examples: "saved/run/1")
    assert export.main(["--run-dir", run.path, "--checkpoint", "best"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "saved/run/1\n"
    assert captured.err.splitlines()[0] == (
        "Exporting best/ckpt-200: the best of 3 validations by validation BLEU "
        "(25.00 at step 200)")
    assert loaded == [os.path.join(run.best_dir, "ckpt-200")]  # resolved once, passed on
    assert export.main(["--run-dir", run.path]) == 0  # auto: the fresh average
    assert capsys.readouterr().err.startswith("Exporting averaged/ckpt-200: the average of")

    save_training_checkpoint(run, model, 400)  # training went on
    assert export.main(["--run-dir", run.path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "stale" in err and "checkpoints/ckpt-400" in err
    assert export.main(["--run-dir", run.path, "--checkpoint", "last:2"]) == 0
    assert capsys.readouterr().err.startswith(
        "Exporting averaged/ckpt-400: the average of ckpt-300..ckpt-400 (last 2)")
