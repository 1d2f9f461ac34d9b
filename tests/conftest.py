import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest

import keras_transformer as kt

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")

# Seconds each module's tests took in the default run, for the modules over
# MODULE_SECONDS_CUTOFF (`KT_PRINT_MODULE_SECONDS=1 bash scripts/test.sh`:
# two xdist workers on the 2-core CI host, 2026-11-24). `scripts/test.sh`
# hands modules to workers in collection order (`--dist loadscope
# --no-loadscope-reorder`), and this order puts the longest first: xdist's
# own order (most tests first) left the one-test modules, the demo's ~3 min
# among them, to the end, with one worker idle meanwhile.
MODULE_SECONDS_CUTOFF = 15
MODULE_SECONDS = {
    "test_demo.py": 211, "test_jax_backend.py": 199, "test_export.py": 143,
    "test_train_cli.py": 139, "test_distributed.py": 139, "test_benchmark.py": 129,
    "test_multi30k_recipe.py": 71, "test_benchmark_translation.py": 70,
    "test_checkpoints.py": 69, "test_translate_cli.py": 60,
    "test_transformer.py": 57, "test_visualization.py": 33,
    "test_tensorflow_kernels.py": 31, "test_beam_search.py": 30,
    "test_compiled_attention.py": 30, "test_eigen_slices.py": 25, "test_dense.py": 19,
}


def pytest_collection_modifyitems(config, items):
    """Longest modules first (stable: a module's tests keep their order)."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))


# The table is kept by hand, so each full run checks it against what it
# measured (setup, call and teardown of every test, summed per module; under
# xdist the controller receives every worker's reports).
_MEASURED_SECONDS = {}


def pytest_runtest_logreport(report):
    module = os.path.basename(report.nodeid.split("::")[0])
    _MEASURED_SECONDS[module] = _MEASURED_SECONDS.get(module, 0.0) + report.duration


def stale_module_seconds(measured, table, threshold=45, factor=3.0):
    """Modules that `table` (module -> seconds) puts too late for what
    `measured` (the same, from one run) says they take: `{module: (table
    seconds or None, measured seconds scaled)}` for each one that took more
    than `factor` times its table entry, or that is missing from the table
    and took over `threshold` seconds. A module listed too long only runs
    early, which costs nothing, so it is not reported. Both limits leave
    room for one run's noise: beside the other worker's load, one module's
    time moved by up to 3x between runs on the CI host.

    `measured` is first scaled so that the table's modules take as long in
    total as the table says: a faster or slower machine changes every
    module alike and leaves the order as it was, so it is not staleness.
    """
    timed = sum(measured.get(name, 0.0) for name in table)
    if timed <= 0:
        return {}
    scale = sum(table.values()) / timed
    stale = {}
    for name, seconds in measured.items():
        seconds *= scale
        expected = table.get(name)
        if seconds > (threshold if expected is None else expected * factor):
            stale[name] = (expected, round(seconds))
    return stale


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):  # the controller reports for all workers
        return
    if os.environ.get("KT_PRINT_MODULE_SECONDS"):
        # To refresh the table: this run's seconds of every module it lists.
        measured = {name: round(seconds) for name, seconds in sorted(
            _MEASURED_SECONDS.items(), key=lambda kv: -kv[1])
            if seconds > MODULE_SECONDS_CUTOFF}
        terminalreporter.write_sep("-", "seconds per module (KT_PRINT_MODULE_SECONDS)")
        terminalreporter.write_line(repr(measured))
    # Only a full default run measures every module as the table does.
    if config.option.keyword or not set(MODULE_SECONDS) <= set(_MEASURED_SECONDS):
        return
    stale = stale_module_seconds(_MEASURED_SECONDS, MODULE_SECONDS)
    if stale:
        terminalreporter.write_sep("-", "tests/conftest.py MODULE_SECONDS is out of date")
        for name, (expected, seconds) in sorted(stale.items(), key=lambda kv: -kv[1][1]):
            terminalreporter.write_line(
                f"{name}: {'not listed' if expected is None else f'{expected} s listed'}, "
                f"{seconds} s measured (scaled to the table's total)")


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def tiny_config():
    return kt.get_config("tiny", vocab_size=40, dropout=0.0)


def random_ids(shape, low=4, high=40, seed=0):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype("int32")


def train_on_one_batch(config, steps, jit_compile=False):
    """Trains `config`'s model from seed 0 on one random batch (4 sentences,
    source 7 and target 6 ids) for `steps` steps.

    Returns: `(losses, weights)`.
    """
    rng = np.random.default_rng(2)
    source = rng.integers(4, config.vocab_size, (4, 7)).astype("int32")
    target = rng.integers(4, config.vocab_size, (4, 6)).astype("int32")
    keras.utils.set_random_seed(0)
    model = kt.Transformer(config)
    model.compile(optimizer=kt.transformer_adam(config.d_model), jit_compile=jit_compile,
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing,
                                                    pad_id=config.pad_id))
    losses = [float(model.train_on_batch((source, target[:, :-1]), target[:, 1:]))
              for _ in range(steps)]
    return losses, [w.numpy() for w in model.weights]


def train_with_and_without_eigen(monkeypatch, config, calls, steps=3):
    """`train_on_one_batch` twice: with TensorFlow's kernels taken as
    oneDNN's, then as Eigen's (`tensorflow_kernels.multiplies_with_eigen`),
    asserting that the first run added nothing to `calls` (a spy's list).

    Returns: `{eigen: (losses, weights)}` for `eigen` False and True.
    """
    from keras_transformer import tensorflow_kernels

    runs = {}
    for eigen in (False, True):
        monkeypatch.setattr(tensorflow_kernels, "multiplies_with_eigen", lambda: eigen)
        runs[eigen] = train_on_one_batch(config, steps)
        if not eigen:
            assert calls == []
    return runs
