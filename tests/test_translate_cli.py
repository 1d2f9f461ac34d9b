"""kt-export, kt-translate and kt-evaluate (keras_transformer/cli/) on a
hand-made run directory."""

import io
import json

import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.cli import evaluate, export, translate
from keras_transformer.run_directory import RunDirectory
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from test_tokenizer import CORPUS

SOURCES = ["Ein Mann fährt mit dem Fahrrad.", "", "Die Mädchen überqueren die Straße."]


def make_run_directory(path):
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, max_length=16,
                           pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                           eos_id=tokenizer.eos_id)
    run = RunDirectory(path)
    run.save_config(config)
    run.save_tokenizer(tokenizer)
    model = kt.Transformer(config)
    model.build()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                         run.checkpoint_dir, max_to_keep=2)
    manager.save(checkpoint_number=100)
    return run


def test_export_translate_and_evaluate(tmp_path, capsys):
    run = make_run_directory(str(tmp_path / "de_en"))
    source = tmp_path / "test.de"
    source.write_bytes("\n".join(SOURCES).encode("utf-8") + b"\n\xff\xfe\n")
    reference = tmp_path / "test.en"
    reference.write_text("A man rides a bike.\n\nThe girls cross the street.\nNothing.\n")

    exported = export.export([
        "--run-dir", run.path, "--output-dir", str(tmp_path / "saved_models"),
        "--beam-size", "2", "--extra-length", "3",
    ])
    assert exported == str(tmp_path / "saved_models" / "de_en" / "1")
    assert capsys.readouterr().out == exported + "\n"

    out = io.StringIO()
    from_saved, saved_scores = translate.translate(
        ["--saved-model", str(tmp_path / "saved_models" / "de_en"), "--input", str(source),
         "--scores"], stdout=out,
    )
    lines = out.getvalue().split("\n")[:-1]
    assert len(lines) == 4 and lines[1] == "0.0000\t"
    assert from_saved[1] == "" and from_saved[0]
    # The default above ran the SavedModel's translate_xla; its XLA-free
    # serving_default gives the same.
    saved_no_xla, saved_no_xla_scores = translate.translate(
        ["--saved-model", exported, "--input", str(source), "--scores", "--no-xla"],
        stdout=io.StringIO(),
    )
    assert saved_no_xla == from_saved
    assert saved_no_xla_scores == pytest.approx(saved_scores, abs=1e-4)

    out = io.StringIO()
    from_run, run_scores = translate.translate(
        ["--run-dir", run.path, "--input", str(source), "--beam-size", "2",
         "--extra-length", "3"], stdout=out,
    )
    assert from_run == from_saved  # same checkpoint restored, same decoding (XLA here)
    without_xla, _ = translate.translate(
        ["--run-dir", run.path, "--input", str(source), "--beam-size", "2",
         "--extra-length", "3", "--no-xla"], stdout=io.StringIO(),
    )
    assert without_xla == from_saved
    assert run_scores == pytest.approx(saved_scores, abs=1e-4)
    assert out.getvalue() == "".join(t + "\n" for t in from_run)

    out = io.StringIO()
    scores = evaluate.evaluate(
        ["--saved-model", exported, "--source", str(source), "--reference", str(reference),
         "--hypotheses", str(tmp_path / "hyp"), "--json"], stdout=out,
    )
    printed = json.loads(out.getvalue())
    assert printed["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "chrF2|nrefs:1" in printed["chrf_text"]
    assert 0.0 <= scores["bleu"] <= 100.0 and 0.0 <= scores["chrf"] <= 100.0
    assert (tmp_path / "hyp").read_text(encoding="utf-8").split("\n")[:-1] == from_saved

    # The command's main: the same lines on stdout, and exit status 0.
    capsys.readouterr()
    assert translate.main(["--saved-model", exported, "--input", str(source)]) == 0
    assert capsys.readouterr().out == "".join(t + "\n" for t in from_saved)


def test_a_mismatched_reference_is_a_clear_error(tmp_path):
    source = tmp_path / "a"
    source.write_text("x\ny\n")
    reference = tmp_path / "b"
    reference.write_text("x\n")
    with pytest.raises(SystemExit):
        evaluate.main(["--run-dir", str(tmp_path), "--source", str(source),
                       "--reference", str(reference)])


def test_a_model_checkpoint_holds_every_weight(tmp_path):
    # Export reads the model back through `tf.train.Checkpoint(model=...)`;
    # the encoder/decoder stacks keep their layers in lists, which TF's
    # checkpoint graph only sees through the layers' attribute aliases.
    config = kt.get_config("tiny", vocab_size=40, norm_first=True)
    model = kt.Transformer(config)
    model.build()
    prefix = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    stored = [n for n, _ in tf.train.list_variables(prefix) if n.startswith("model/")]
    assert len(stored) == len(model.weights)
