"""The precision policy and the check for bfloat16 hardware."""

import warnings

import keras
import pytest
import tensorflow as tf

from keras_transformer.training import strategy

ZEN3_FLAGS = "fpu sse sse2 avx f16c fma avx2 bmi2 vaes vpclmulqdq"
ZEN4_FLAGS = ZEN3_FLAGS + " avx512f avx512bw avx512_bf16 avx512_vnni"
SAPPHIRE_RAPIDS_FLAGS = ZEN3_FLAGS + " avx512f amx_bf16 amx_tile amx_int8"


def cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    cores = "".join(f"processor\t: {i}\nmodel name\t: CPU\nflags\t\t: {flags}\n\n"
                    for i in range(2))
    path.write_text(cores)
    return str(path)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [] if kind == "GPU" else ["CPU"])


@pytest.fixture
def restore_policy():
    yield
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("flags, expected", [
    (ZEN3_FLAGS, False), (ZEN4_FLAGS, True), (SAPPHIRE_RAPIDS_FLAGS, True)])
def test_native_bfloat16_reads_the_cpu_flags(tmp_path, no_gpu, flags, expected):
    assert strategy.native_bfloat16(cpuinfo(tmp_path, flags)) is expected


def test_native_bfloat16_is_unknown_without_cpuinfo(tmp_path, no_gpu):
    assert strategy.native_bfloat16(str(tmp_path / "missing")) is None
    empty = tmp_path / "empty"
    empty.write_text("processor\t: 0\n")
    assert strategy.native_bfloat16(str(empty)) is None


@pytest.mark.parametrize("capabilities, expected", [
    ([(8, 0)], True), ([(9, 0), (8, 6)], True), ([(7, 0)], False), ([(8, 0), (7, 5)], False),
    ([None], None)])
def test_native_bfloat16_on_gpus_asks_for_ampere(monkeypatch, tmp_path, capabilities, expected):
    gpus = [f"GPU:{i}" for i in range(len(capabilities))]
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: gpus if kind == "GPU" else ["CPU"])
    details = dict(zip(gpus, capabilities))
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda gpu: {} if details[gpu] is None
                        else {"compute_capability": details[gpu]})
    # The CPU's flags do not matter once there is a GPU.
    assert strategy.native_bfloat16(cpuinfo(tmp_path, ZEN4_FLAGS)) is expected


def test_mixed_bfloat16_without_hardware_warns_and_still_applies(monkeypatch, restore_policy):
    monkeypatch.setattr(strategy, "native_bfloat16", lambda: False)
    with pytest.warns(UserWarning, match="without bfloat16 matmul hardware.*"
                                         "Use --precision float32"):
        strategy.set_precision("mixed_bfloat16")
    assert keras.config.dtype_policy().name == "mixed_bfloat16"


@pytest.mark.parametrize("precision, native", [
    ("mixed_bfloat16", True), ("mixed_bfloat16", None), ("float32", False),
    ("mixed_float16", False)])
def test_no_warning_otherwise(monkeypatch, restore_policy, precision, native):
    monkeypatch.setattr(strategy, "native_bfloat16", lambda: native)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy.set_precision(precision)
    assert keras.config.dtype_policy().name == precision


def test_set_precision_checks_its_argument(restore_policy):
    with pytest.raises(ValueError, match="Unknown precision 'bfloat16'.*mixed_bfloat16"):
        strategy.set_precision("bfloat16")


@pytest.mark.parametrize("native, expected, reason", [
    (True, "mixed_bfloat16", "auto: this CPU multiplies bfloat16 in hardware"),
    (False, "float32", "auto: no bfloat16 matmul hardware"),
    (None, "float32", "auto: bfloat16 hardware could not be detected")])
def test_auto_precision_follows_the_hardware(monkeypatch, no_gpu, native, expected, reason):
    monkeypatch.setattr(strategy, "native_bfloat16", lambda: native)
    precision, why = strategy.choose_precision("auto")
    assert precision == expected and why.startswith(reason)


def test_auto_precision_on_the_cpus_kinds(monkeypatch, tmp_path, no_gpu):
    read = strategy.native_bfloat16
    for flags, expected in ((ZEN3_FLAGS, "float32"), (ZEN4_FLAGS, "mixed_bfloat16"),
                            (SAPPHIRE_RAPIDS_FLAGS, "mixed_bfloat16")):
        path = cpuinfo(tmp_path, flags)
        monkeypatch.setattr(strategy, "native_bfloat16", lambda path=path: read(path))
        assert strategy.choose_precision("auto")[0] == expected


@pytest.mark.parametrize("precision", strategy.PRECISIONS)
def test_a_requested_precision_is_kept(monkeypatch, precision):
    monkeypatch.setattr(strategy, "native_bfloat16", lambda: True)
    assert strategy.choose_precision(precision) == (precision, "as requested")


def test_choose_precision_checks_its_argument():
    with pytest.raises(ValueError, match="Unknown precision 'bf16'; expected 'auto' or one of"):
        strategy.choose_precision("bf16")
