"""The model is backend-neutral: forward, backward, `fit` and decoding run
with KERAS_BACKEND=jax, without TensorFlow (issue 5: train and time on hosts
that have JAX but no TensorFlow).

The backend is fixed when Keras is imported, so the check runs in a fresh
process (tests/support/jax_check.py). It uses this interpreter when JAX is
installed here, else the interpreter named by KT_JAX_PYTHON (e.g. a venv with
only `jax keras pytest numpy`), and is skipped when neither has JAX.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# Another Python environment (.venv-jax): the end-to-end tier
# (docs/testing.md#tiers).
pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def jax_python():
    """An interpreter with JAX (this one, else KT_JAX_PYTHON); skips without."""
    if importlib.util.find_spec("jax") is not None:
        return sys.executable
    candidate = os.environ.get("KT_JAX_PYTHON")
    if candidate:
        probe = subprocess.run([candidate, "-c", "import jax"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    pytest.skip("JAX is not installed (pip install 'jax[cpu]', or set KT_JAX_PYTHON)")


# On the CPU unless the caller names a platform (JAX_PLATFORMS=cuda on a GPU
# host). The JAX interpreter may have no install of the library: it imports
# it, and the check itself, from the checkout.
JAX_ENV = {**os.environ, "KERAS_BACKEND": "jax",
           "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "PYTHONPATH": ROOT}


@pytest.fixture(scope="module")
def jax_report(jax_python):
    result = subprocess.run([jax_python, "-m", "tests.support.jax_check"], capture_output=True,
                            text=True, env=JAX_ENV, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_backward_pass_reaches_every_weight(jax_report):
    assert jax_report["weights"] > 50
    assert jax_report["weights_with_zero_gradient"] == []


def test_fit_learns_on_jax(jax_report):
    assert jax_report["loss_last_epoch"] < 0.2 * jax_report["loss_first_epoch"]
    assert jax_report["accuracy_last_epoch"] > 0.9


def test_kv_cache_matches_full_forward_on_jax(jax_report):
    assert jax_report["cache_vs_full_max_abs_diff"] < 1e-4


def test_searches_jit_compile_on_jax(jax_report):
    assert jax_report["beam_hypotheses_end_with_eos"]


def test_sampling_jit_compiles_on_jax(jax_report):
    assert jax_report["sampling_at_temperature_0_equals_greedy"]
    assert jax_report["sampling_reproducible"] and jax_report["sampling_seeds_differ"]


def test_tensorflow_is_not_needed(jax_report):
    assert not jax_report["tensorflow_imported"]


def test_training_speed_layers_on_jax(jax_report):
    # 16-bit dropout keeps 1 - 6554/65536 of the elements (5 sigma of
    # 262,144 draws is 0.003) and preserves the mean; the closed-form
    # LayerNorm gradient equals Keras's.
    assert abs(jax_report["dropout_kept_fraction"] - jax_report["dropout_expected_kept"]) < 0.003
    assert abs(jax_report["dropout_mean"] - 1.0) < 0.004
    assert jax_report["dropout_odd_shape_ok"]
    assert jax_report["layer_norm_grad_max_abs_diff"] < 1e-4


def test_fit_with_dropout_and_the_paper_optimizer_on_jax(jax_report):
    assert jax_report["transformer_adam_on_jax"] == "Adam"
    assert jax_report["dropout_fit_last_loss"] < 0.8 * jax_report["dropout_fit_first_loss"]


BENCHMARK = ["-m", "benchmarks", "jax"]


def test_keras_masks_are_padding_masks_on_jax(jax_report):
    result = jax_report["keras_masks"]
    assert max(result["encoder_eager"], result["decoder_eager"],
               result["decoder_functional"]) < 1e-6
    assert result["encoder_output_mask_kept"]


def test_jax_benchmark_reports_throughput_and_utilisation(jax_python, tmp_path):
    """`python -m benchmarks jax` (GPU hosts without TensorFlow) runs each
    config x precision in its own process and reports issue 5's figures."""
    out = tmp_path / "report.json"
    result = subprocess.run(
        [jax_python, *BENCHMARK, "--config", "tiny", "--precision", "float32,mixed_bfloat16",
         "--train-shapes", "4x6x5,2x3x4", "--translate-shapes", "2x5", "--rounds", "1",
         "--train-steps", "2", "--translate-repeats", "1", "--peak-size", "256",
         "--set", "dropout=0.2", "--set", "num_layers=1", "--json", str(out)],
        capture_output=True, text=True, env=JAX_ENV, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = json.loads(out.read_text())["reports"]
    assert [r["precision"] for r in reports] == ["float32", "mixed_bfloat16"]
    for report in reports:
        assert report["overrides"] == ["dropout=0.2", "num_layers=1"]
        dtype = "bfloat16" if report["precision"] == "mixed_bfloat16" else "float32"
        assert report["matmul_peak_tflops"][dtype] > 0
        assert [t["shape"] for t in report["train"]] == ["4x6x5", "2x3x4"]
        for train in report["train"]:
            assert train["target_tokens_per_s"] > 0
            assert 0 < train["fraction_of_matmul_peak"] < 1
            assert train["loss_first_step"] > 0 and train["loss_after"] > 0
        (translate,) = report["translate"]
        assert translate["shape"] == "2x5" and translate["sentences_per_s"] > 0
        assert report["tensorflow_imported"] is False
    assert "MFU" in result.stdout and "sentences/s" in result.stdout


def test_jax_benchmark_refuses_another_backend(jax_python):
    result = subprocess.run(
        [jax_python, *BENCHMARK, "--config", "tiny", "--in-process", "--what", "translate"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**JAX_ENV, "KERAS_BACKEND": "numpy"})
    assert result.returncode != 0
    assert "needs 'jax'" in result.stderr + result.stdout
