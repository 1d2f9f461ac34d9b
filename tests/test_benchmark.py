"""`python -m benchmarks` and its subcommands run end to end (tiny config,
one round) and report what issue 5 asks for; the real numbers are in
docs/performance.md."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run(*args, check=True, subcommand="speed"):
    return subprocess.run([sys.executable, "-m", "benchmarks", subcommand, *args],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600,
                          check=check)


def test_help_lists_every_subcommand():
    from benchmarks.__main__ import SUBCOMMANDS

    result = subprocess.run([sys.executable, "-m", "benchmarks", "--help"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(SUBCOMMANDS)
    assert {"speed", "training", "savedmodel", "profile-train", "profile-search", "working-set",
            "jax"} <= set(listed)
    unknown = subprocess.run([sys.executable, "-m", "benchmarks", "nope"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert unknown.returncode == 2 and "unknown subcommand 'nope'" in unknown.stderr


@pytest.mark.e2e
def test_benchmark_reports_throughput_utilisation_and_latency(tmp_path):
    out = tmp_path / "report.json"
    result = run("--config", "tiny", "--precision", "mixed_bfloat16",
                 "--what", "train,translate,latency", "--rounds", "1", "--train-steps", "1",
                 "--translate-repeats", "1", "--latency-requests", "5", "--peak-size", "256",
                 "--json", str(out))
    report = json.loads(out.read_text())
    assert report["precision"] == {"keras_transformer": "mixed_bfloat16"}
    train = report["train"]["keras_transformer"]
    assert train["target_tokens_per_s"] > 0
    assert 0 < train["fraction_of_matmul_peak"] < 2
    assert "bfloat16" in report["matmul_peak_gflops"]
    # The peak is the best of two sizes: Eigen is slow at power-of-two ones.
    assert report["matmul_peak_sizes"] == [256, 240]
    assert "best of 256^2 and 240^2 chains" in result.stdout
    assert report["translate"]["keras_transformer"]["sentences_per_s"] > 0
    latency = report["latency"]
    for name in ("serving_default", "translate_xla"):
        assert 0 < latency[name]["p50_ms"] <= latency[name]["p95_ms"]
    assert latency["vocab_size"] > 1000 and latency["source_tokens"] > 5
    assert "target tokens/s" in result.stdout and "translate_xla" in result.stdout


def test_missing_model_garden_is_a_clear_error():
    from benchmarks import model_garden_reference

    if model_garden_reference.available():
        pytest.skip("Model Garden is installed here")
    result = run("--reference", "model_garden", "--what", "train", check=False)
    assert result.returncode != 0
    assert "bash benchmarks/install_model_garden.sh" in result.stderr


def test_jax_benchmark_parses_shapes_and_overrides():
    from benchmarks import bench_config, jax_benchmark

    assert jax_benchmark.parse_shapes("64x32x32,384x64x64", 3) == [(64, 32, 32), (384, 64, 64)]
    assert jax_benchmark.parse_shapes("32x20", 2) == [(32, 20)]
    for bad in ("64x32", "64x0x32", "axbxc"):
        with pytest.raises(Exception, match="expected 3 positive integers"):
            jax_benchmark.parse_shapes(bad, 3)
    config = bench_config.make_config("bench", ["dropout=0.0", "num_layers=2"])
    assert (config.dropout, config.num_layers, config.d_model, config.vocab_size) == (
        0.0, 2, 256, 8192)
    assert bench_config.make_config("base").d_model == 512
    with pytest.raises(SystemExit, match="expected key=value"):
        bench_config.make_config("bench", ["dropout"])


@pytest.mark.e2e
def test_search_profile_breaks_thunk_time_down_by_kind():
    result = run("--config", "tiny", "--searches", "1", "--top", "40", "--batch", "2",
                 "--source-length", "6",
                 subcommand="profile-search")
    lines = result.stdout.splitlines()
    assert "2 sentences x 6 tokens" in lines[0] and "ms per search unprofiled" in lines[0]
    total = float(lines[1].split()[2])
    kinds = {line.split()[0]: float(line.split()[1]) for line in lines[2:]}
    assert total > 0 and any(k.startswith("MatMul") or k == "dot" for k in kinds)
    assert any("fusion" in k for k in kinds)  # the loop's fused elementwise work
    # The kinds are a breakdown of the total. Both are printed rounded (the
    # total to 0.1 ms, each kind to 0.01 ms), so their sums may differ by
    # that much and no more.
    assert sum(kinds.values()) <= total + 0.05 + 0.005 * len(kinds)


def test_search_profile_counts_the_thunks_the_calling_thread_runs():
    """XLA:CPU runs some thunks (with one intra-op thread, all) on the
    calling thread: those inside its ThunkExecutor count, the function
    around them, loops and the thread pool's listener do not."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks.profile_search import thunk_times

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    names = ("translate", "ThunkExecutor::Execute", "MatMul.3", "while.1", "add_fusion.7",
             "ThreadpoolListener::Record", "MatMul.9")
    for i, name in enumerate(names, 1):
        plane.event_metadata[i].id = i
        plane.event_metadata[i].name = name

    def add(line, name, start_us, us):
        line.events.add(metadata_id=names.index(name) + 1, offset_ps=start_us * 10**6,
                        duration_ps=us * 10**6)

    caller = plane.lines.add(name="python")
    add(caller, "translate", 0, 100)
    add(caller, "ThunkExecutor::Execute", 10, 50)
    add(caller, "ThunkExecutor::Execute", 20, 10)  # a loop body's, nested
    add(caller, "while.1", 15, 30)
    add(caller, "MatMul.3", 22, 4)
    add(caller, "add_fusion.7", 40, 2)
    add(caller, "ThreadpoolListener::Record", 30, 1)
    add(caller, "MatMul.3", 70, 5)  # after the executor ended
    pool = plane.lines.add(name="tf_numa_-1_Eigen/123")
    add(pool, "MatMul.9", 5, 8)
    add(pool, "ThreadpoolListener::Record", 1, 1)
    # Two searches: per search, MatMul (4 + 8 us) / 2 in one call, the
    # fusion 2 us / 2 in half a call.
    assert thunk_times(space, 2) == {"MatMul": (pytest.approx(0.006), 1.0),
                                     "add_fusion": (pytest.approx(0.001), 0.5)}


@pytest.mark.e2e
def test_training_profile_splits_thread_time_into_groups_and_kinds():
    from benchmarks import profile_train

    # Event names as the trace has them: ops "<name>:<type>", thunks after
    # their HLO instruction, the runtime's own events "Class::Method".
    assert profile_train.classify("transformer/MatMul_2:MatMul") == ("matmul", "MatMul")
    assert profile_train.classify("dense/BiasAdd:_MklFusedMatMul") == ("matmul",
                                                                       "_MklFusedMatMul")
    assert profile_train.classify("gradients/Transpose:Transpose") == ("ops", "Transpose")
    assert profile_train.classify("MatMul_1.2") == ("matmul", "MatMul_1")
    assert profile_train.classify("dot.3") == ("matmul", "dot")
    assert profile_train.classify("subtract_exponential_fusion.1") == (
        "xla", "subtract_exponential_fusion")
    assert profile_train.classify("ExecutorState::Process") == ("runtime",
                                                                "ExecutorState::Process")

    result = run("--config", "tiny", "--steps", "1", "--batch", "4", "--length", "8",
                 "--top", "200", subcommand="profile-train")
    lines = result.stdout.splitlines()
    assert "tiny, float32, 4 x 8 tokens" in lines[0] and "ms per step unprofiled" in lines[0]
    total = float(lines[1].split()[1])
    groups = {line.split()[0]: float(line.split()[1]) for line in lines[2:6]}
    assert set(groups) == set(profile_train.GROUPS)
    assert groups["matmul"] > 0 and groups["ops"] > 0
    assert abs(sum(groups.values()) - total) < 0.01 * total + 0.5
    assert lines[6] == "by kind:"
    kinds = {tuple(line.split()[:2]): float(line.split()[2]) for line in lines[7:]}
    assert ("ops", "ResourceApplyAdam") in kinds  # the optimizer's update is in the step
    assert abs(sum(kinds.values()) - total) < 0.01 * total + 0.5


def test_self_times_subtract_nested_events():
    from types import SimpleNamespace as Event

    from benchmarks import profile_train

    outer = Event(offset_ps=0, duration_ps=100)
    inner = Event(offset_ps=10, duration_ps=30)
    innermost = Event(offset_ps=15, duration_ps=5)
    after = Event(offset_ps=120, duration_ps=7)
    times = {id(e): ps for e, ps in profile_train.self_times([after, inner, outer, innermost])}
    assert [times[id(e)] for e in (outer, inner, innermost, after)] == [70, 25, 5, 7]


def test_input_pipeline_benchmark_times_both_streams(tmp_path):
    from benchmarks import input_pipeline
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
    from support.processes import write_corpus

    write_corpus(str(tmp_path))
    with open(tmp_path / "train.en") as f:
        sentences = f.read().splitlines()
    SubwordTokenizer(train_sentencepiece(sentences, vocab_size=400)).save(
        str(tmp_path / "v.model"))
    out = tmp_path / "pipeline.json"
    report = input_pipeline.main([
        "--data", str(tmp_path), "--src-lang", "en", "--tgt-lang", "de", "--vocab",
        str(tmp_path / "v.model"), "--batch-tokens", "64", "--max-length", "32",
        "--nbest", "4", "--warmup", "2", "--updates", "3", "--rounds", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == report
    names = ["tokenize once", "subword sampling alpha 0.2, 4-best"]
    assert list(report["setup"]) == names and len(report["rounds"]) == 2
    for row in report["rounds"]:
        assert list(row) == names
        assert all(r["cpu_ms_per_update"] >= 0 and r["wall_ms_per_update"] > 0
                   for r in row.values())
    assert report["cpu"]["cores"] and report["commit"]


def test_multi30k_jax_batches_hold_every_pair_within_the_token_budget(tmp_path):
    """`python -m benchmarks multi30k-jax`'s data side (no accelerator):
    prepare's ids round-trip, training batches stay within the budget with
    eos/bos in place, and evaluation batches hold every pair once."""
    import numpy as np
    from test_tokenizer import CORPUS

    from benchmarks import multi30k_jax as m
    from keras_transformer.tokenizer import train_sentencepiece

    data = tmp_path / "data"
    data.mkdir()
    for split in m.SPLITS:
        for lang in ("en", "de"):
            (data / f"{split}.{lang}").write_text("".join(s + "\n" for s in CORPUS))
    (tmp_path / "vocab.model").write_bytes(train_sentencepiece(CORPUS, vocab_size=400))
    m.main(["prepare", "--data", str(data), "--vocab", str(tmp_path / "vocab.model"),
            "--output", str(tmp_path / "ids.npz")])
    splits, vocab_size = m.load_ids(str(tmp_path / "ids.npz"))
    sources, targets = splits["train"]
    assert vocab_size > 256 and len(sources) == len(CORPUS)
    stream = m.training_batches(sources, targets, 64, seed=1)
    for _ in range(20):
        (source, target_in), target_out = next(stream)
        assert source.size < 64 + source.shape[1] and source.shape[1] in m.BOUNDS
        assert np.all(target_in[:, 0] == m.BOS)
        assert np.all((target_out == m.EOS).sum(1) == 1) and np.all((source == m.EOS).sum(1) == 1)
    seen = [int(row[row != m.PAD][:-1].sum()) for (s, _), _ in m.evaluation_batches(
        *splits["val"], batch_tokens=64) for row in s]
    assert sorted(seen) == sorted(int(x.sum()) for x in splits["val"][0])


def test_corpus_input_is_all_different_sentences_up_to_the_cap(tmp_path):
    """Copies of a sentence sorted into one batch end their searches together
    and would flatter the whole-file window: the input has none up to the
    cap."""
    from benchmarks.corpus import main, write_input

    path = str(tmp_path / "in.txt")
    write_input(path, 300, distinct=200)
    lines = open(path, encoding="utf-8").read().splitlines()
    assert len(lines) == 300 and len(set(lines[:200])) == 200
    assert lines[200:] == lines[:100]
    with pytest.raises(SystemExit):
        main(["--saved-model", "m", "--parts", "memory,speed"])


@pytest.mark.e2e
def test_serve_engines_times_a_shipped_export_on_a_sentence_file(tmp_path):
    """`serve-engines --ctranslate2-export`: the shipped int8 export, the
    sentences of `--source-file`, the export's own search defaults; parts
    that need a run directory are refused."""
    export = os.path.join(ROOT, "saved_models", "multi30k_en_de_ct2", "1")
    pytest.importorskip("ctranslate2")
    refused = run("--ctranslate2-export", export, "--parts", "overhead,load", check=False,
                  subcommand="serve-engines")
    assert refused.returncode == 2 and "--parts overhead,threads at most, not load" in (
        refused.stderr)
    missing = run("--ctranslate2-export", str(tmp_path), "--parts", "threads", check=False,
                  subcommand="serve-engines")
    assert missing.returncode == 2 and (
        f"--ctranslate2-export: {tmp_path}: not a CTranslate2 export of this package"
        in missing.stderr)
    sources = tmp_path / "sources.en"
    sources.write_text("A dog runs on the beach.\n\nTwo men play football.\nA red car.\n")
    out = tmp_path / "report.json"
    run("--ctranslate2-export", export, "--source-file", str(sources), "--parts", "threads",
        "--singles", "3", "--json", str(out), subcommand="serve-engines")
    report = json.loads(out.read_text())
    with open(os.path.join(export, "keras_transformer.json")) as f:
        assert report["defaults"] == json.load(f)["defaults"]
    assert report["args"]["ctranslate2_export"] == export
    assert 0 < report["threads"]["intra_1_p50_ms"] < 10_000
    assert 0 < report["threads"]["intra_2_p50_ms"] < 10_000


@pytest.mark.e2e
def test_serve_engines_overhead_times_every_contender_against_the_engine(tmp_path):
    """`serve-engines --parts overhead`: kt-serve, the plainest HTTP server
    and kt-serve's design without its application each answer every
    request with CTranslate2's own translations, and each gets a ratio to
    CTranslate2 alone."""
    export = os.path.join(ROOT, "saved_models", "multi30k_en_de_ct2", "1")
    pytest.importorskip("ctranslate2")
    sources = tmp_path / "sources.en"
    sources.write_text("A dog runs on the beach.\nTwo men play football.\nA red car.\n"
                       "A woman reads a book in the park.\n")
    out = tmp_path / "report.json"
    run("--ctranslate2-export", export, "--source-file", str(sources), "--parts", "overhead",
        "--overhead-rounds", "1", "--batch", "2", "--batches", "2", "--json", str(out),
        subcommand="serve-engines")
    overhead = json.loads(out.read_text())["overhead"]
    contenders = ("translator", "kt_serve", "plain_http", "bare_uvicorn")
    assert overhead["identical_to_raw"] == {**dict.fromkeys(contenders, 4), "of": 4}
    for name in contenders:
        assert 0 < overhead[f"{name}_over_raw_median"] < 10


def test_a_second_result_of_the_same_day_and_commit_gets_its_own_file(tmp_path):
    import time

    from benchmarks import harness

    fields = {"cpu": {"flags": ["avx2", "avx512f"]}, "commit": "abc1234+changes"}
    first = harness.result_path(fields, "serve-engines", str(tmp_path))
    assert os.path.basename(first) == (
        f"avx512_{time.strftime('%Y-%m-%d')}_abc1234_serve-engines.json")
    harness.write_json({"run": 1}, first)
    second = harness.result_path(fields, "serve-engines", str(tmp_path))
    assert second == first[:-len(".json")] + "-2.json"
    harness.write_json({"run": 2}, second)
    assert harness.result_path(fields, "serve-engines", str(tmp_path)).endswith("-3.json")
    assert json.loads(open(first).read()) == {"run": 1}
