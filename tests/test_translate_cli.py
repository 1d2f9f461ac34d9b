"""kt-export, kt-translate and kt-evaluate (keras_transformer/cli/) on a
hand-made run directory: 1-best, n-best and sampling, from the run
directory and from its export."""

import contextlib
import io
import json
import os
import subprocess
import sys

import keras
import pytest
import sacrebleu
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.cli import evaluate, export, translate
from keras_transformer.run_directory import RunDirectory
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from test_tokenizer import CORPUS

SOURCES = ["Ein Mann fährt mit dem Fahrrad.", "", "Die Mädchen überqueren die Straße."]


def make_run_directory(path, num_layers=None):
    """A run directory of an untrained tiny model at step 100: its config,
    vocabulary and checkpoint. `num_layers` overrides the preset's 2 for
    tests of the commands' plumbing, where depth checks nothing and a
    shallower model traces sooner."""
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    depth = {} if num_layers is None else {"num_layers": num_layers}
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, max_length=16,
                           pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                           eos_id=tokenizer.eos_id, **depth)
    run = RunDirectory(path)
    run.save_config(config)
    run.save_tokenizer(tokenizer)
    model = kt.Transformer(config)
    model.build()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                         run.checkpoint_dir, max_to_keep=2)
    manager.save(checkpoint_number=100)
    return run


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A run directory, its test set and its export (beam 2, extra length
    3), shared by the tests of this module."""
    tmp_path = tmp_path_factory.mktemp("cli")
    # Module fixtures are set up before the per-test seeding: seed here, so
    # the weights are the same whichever test runs first. Seed 5's untrained
    # one-layer model writes several tokens a line, which kt-evaluate's
    # score of a translation against itself needs (BLEU counts 4-grams).
    keras.utils.set_random_seed(5)
    run = make_run_directory(str(tmp_path / "de_en"), num_layers=1)
    source = tmp_path / "test.de"
    source.write_bytes("\n".join(SOURCES).encode("utf-8") + b"\n\xff\xfe\n")
    reference = tmp_path / "test.en"
    reference.write_text("A man rides a bike.\n\nThe girls cross the street.\nNothing.\n")
    examples = tmp_path / "examples.txt"
    examples.write_text("Ein Mann fährt Rad.\n\n  Zwei Hunde.  \n")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exported = export.export([
            "--run-dir", run.path, "--output-dir", str(tmp_path / "saved_models"),
            "--beam-size", "2", "--extra-length", "3", "--examples", str(examples),
        ])
    return dict(tmp_path=tmp_path, run=run, source=source, reference=reference,
                exported=exported, printed=printed.getvalue())


def test_export_stores_the_example_sentences(exported_run):
    from keras_transformer.export import read_examples

    # Stripped, blank lines skipped; an export without them has none.
    assert read_examples(exported_run["exported"]) == ["Ein Mann fährt Rad.", "Zwei Hunde."]
    assert read_examples(str(exported_run["tmp_path"])) == []


def test_export_translate_and_evaluate(exported_run, capsys):
    tmp_path, run, exported = (exported_run[k] for k in ("tmp_path", "run", "exported"))
    source, reference = exported_run["source"], exported_run["reference"]
    assert exported == str(tmp_path / "saved_models" / "de_en" / "1")
    assert exported_run["printed"] == exported + "\n"

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
    assert (tmp_path / "hyp").read_text(encoding="utf-8").split("\n")[:-1] == from_saved
    # The weights are untrained, so no documented BLEU applies; what the
    # docs claim is that kt-evaluate scores the detokenized output with
    # sacreBLEU: its scores are sacreBLEU's of the translations it wrote
    # against the reference lines, exactly (sacreBLEU counts in Python, the
    # same on every CPU).
    references = reference.read_text().split("\n")[:-1]
    assert scores["bleu"] == sacrebleu.corpus_bleu(from_saved, [references]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(from_saved, [references]).score
    # Scored against its own translations, a pipeline that pairs each
    # translation with its reference line scores 100; a shifted, dropped or
    # re-tokenized line falls below.
    own = evaluate.evaluate(
        ["--saved-model", exported, "--source", str(source), "--reference", str(tmp_path / "hyp")],
        stdout=io.StringIO())
    assert own["bleu"] == pytest.approx(100.0) and own["chrf"] == pytest.approx(100.0), (
        own, from_saved)

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


def parse_nbest(text):
    """`i ||| translation ||| score` lines -> list per i of (text, score)."""
    rows = {}
    for line in text.split("\n")[:-1]:
        index, translation, score = line.split(" ||| ")
        rows.setdefault(int(index), []).append((translation, float(score)))
    assert sorted(rows) == list(range(len(rows)))
    return [rows[i] for i in range(len(rows))]


def test_n_best_lines_from_the_run_directory_and_the_saved_model(exported_run):
    from keras_transformer.export.saved_model import SavedModelTranslator

    run, exported, source = (exported_run[k] for k in ("run", "exported", "source"))
    api = SavedModelTranslator(exported).translate_nbest(
        read_source(source), 3, beam_size=3, extra_length=3)
    outputs = {}
    for model in (["--run-dir", run.path], ["--saved-model", exported]):
        out = io.StringIO()
        returned = translate.translate(model + ["--input", str(source), "--n-best", "3",
                                                "--beam-size", "3", "--extra-length", "3"],
                                       stdout=out)
        outputs[model[0]] = out.getvalue()
        assert returned == api or model[0] == "--run-dir"
        lines = parse_nbest(out.getvalue())
        assert len(lines) == 4 and all(len(row) == 3 for row in lines)  # 3 a line, best first
        for row, expected in zip(lines, api):
            assert [t for t, _ in row] == [t for t, _ in expected]
            assert [s for _, s in row] == pytest.approx([s for _, s in expected], abs=2e-4)
            assert [s for _, s in row] == sorted((s for _, s in row), reverse=True)
        assert lines[1] == [("", 0.0)] * 3  # the empty line
    assert outputs["--run-dir"] == outputs["--saved-model"]
    assert outputs["--saved-model"].startswith("0 ||| ")
    # Without --beam-size the beam is max(n, the export's 2): the first of
    # a 2-best list is the 1-best translation at beam 2.
    one_best, _ = translate.translate(["--saved-model", exported, "--input", str(source)],
                                      stdout=io.StringIO())
    two_best = translate.translate(["--saved-model", exported, "--input", str(source),
                                    "--n-best", "2"], stdout=io.StringIO())
    assert [row[0][0] for row in two_best] == one_best


def read_source(path):
    from keras_transformer.cli.common import read_lines

    return read_lines(str(path))


@pytest.mark.e2e
def test_sampling_with_a_seed_is_reproducible_across_processes(exported_run):
    run, exported, source = (exported_run[k] for k in ("run", "exported", "source"))
    command = [sys.executable, "-m", "keras_transformer.cli.translate", "--saved-model",
               exported, "--input", str(source), "--sampling", "--seed", "3",
               "--temperature", "1.5", "--top-p", "0.95", "--scores"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The same command in this process, whose random state the tests' seeding
    # and every earlier test have moved: the same samples and scores.
    here = io.StringIO()
    translate.translate(command[3:], stdout=here)
    assert here.getvalue() == done.stdout
    lines = done.stdout.split("\n")[:-1]
    assert len(lines) == 4 and lines[1] == "0.0000\t"
    # In-process, from the run directory (same checkpoint): the same samples;
    # another seed gives others.
    options = ["--input", str(source), "--sampling", "--seed", "3", "--temperature", "1.5",
               "--top-p", "0.95", "--scores", "--extra-length", "3"]
    out = io.StringIO()
    translate.translate(["--run-dir", run.path] + options, stdout=out)
    assert [line.split("\t")[1] for line in out.getvalue().split("\n")[:-1]] == [
        line.split("\t")[1] for line in lines]
    other = io.StringIO()
    translate.translate(["--saved-model", exported] + options[:4] + ["4"] + options[5:],
                        stdout=other)
    assert other.getvalue() != done.stdout
    # Temperature 0 samples the greedy translation, the same from the export
    # and from the run directory.
    greedy, _ = translate.translate(["--saved-model", exported, "--input", str(source),
                                     "--sampling", "--temperature", "0"], stdout=io.StringIO())
    from_run, _ = translate.translate(["--run-dir", run.path, "--input", str(source),
                                       "--sampling", "--temperature", "0", "--extra-length",
                                       "3"], stdout=io.StringIO())
    assert greedy == from_run


@pytest.mark.parametrize("flags, message", [
    (["--n-best", "3", "--beam-size", "2"], "--n-best (3) must be at most --beam-size (2)"),
    (["--n-best", "0"], "--n-best must be at least 1"),
    (["--n-best", "2", "--sampling"], "--n-best applies to beam search, not to --sampling"),
    (["--n-best", "2", "--scores"], "--scores does not apply to --n-best"),
    (["--sampling", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--sampling", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--sampling", "--temperature", "-1"], "--temperature must be >= 0"),
    (["--sampling", "--top-k", "-1"], "--top-k must be >= 0"),
    (["--sampling", "--beam-size", "4"], "--beam-size applies to beam search"),
    (["--temperature", "0.5"], "--temperature needs --sampling"),
    (["--seed", "1"], "--seed needs --sampling"),
])
def test_flags_that_cannot_work_are_usage_errors_naming_the_flag(tmp_path, capsys, flags,
                                                                 message):
    # Checked before any model is loaded (the run directory does not exist).
    with pytest.raises(SystemExit) as exit_info:
        translate.translate(["--run-dir", str(tmp_path / "missing")] + flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
