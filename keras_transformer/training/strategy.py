"""Choosing the `tf.distribute` strategy and the precision policy."""

import json
import os
import warnings

import keras
import tensorflow as tf

STRATEGIES = ("one_device", "mirrored", "multi_worker_mirrored")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


def split_cpu(num_devices):
    """Splits the host CPU into `num_devices` logical devices (for testing
    `MirroredStrategy` without GPUs). Must run before TensorFlow initialises
    its devices."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices
        )
    except RuntimeError as e:
        raise RuntimeError(
            f"Cannot split the CPU into {num_devices} logical devices: TensorFlow is "
            f"already initialised ({e}). Call this first thing in the program."
        ) from None


def make_strategy(name=None, logical_cpus=0):
    """A `tf.distribute.Strategy`.

    `one_device` is TensorFlow's default strategy (the one a script without
    `tf.distribute` runs under; the first GPU if any, else the CPU), not
    `OneDeviceStrategy`: that one reads every pass of a dataset through a
    `MultiDeviceIterator` whose per-device iterator is always autotuned, and
    deleting one (Keras does at each validation) can wait up to a minute for
    its autotuning thread with every core idle (docs/performance.md).

    Args:
        name: `one_device`, `mirrored` (every visible GPU; the logical CPUs
            when `logical_cpus` > 1) or `multi_worker_mirrored` (the cluster in
            `TF_CONFIG`). None: `mirrored` when more than one GPU is visible,
            else `one_device`.
        logical_cpus: split the CPU into this many devices first (testing).
    """
    if name is not None and name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; expected one of {STRATEGIES}.")
    if logical_cpus > 1:
        split_cpu(logical_cpus)
    if name == "multi_worker_mirrored":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy multi_worker_mirrored needs TF_CONFIG, e.g. "
                '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                '"task": {"type": "worker", "index": 0}} on the first worker.'
            )
        json.loads(os.environ["TF_CONFIG"])  # a clear JSON error early
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name is None:
        name = "mirrored" if len(gpus) > 1 else "one_device"
    if name == "mirrored":
        if not gpus and logical_cpus > 1:
            return tf.distribute.MirroredStrategy(
                [d.name for d in tf.config.list_logical_devices("CPU")]
            )
        return tf.distribute.MirroredStrategy()
    if tf.distribute.has_strategy():
        raise ValueError("make_strategy('one_device') is called inside another "
                         f"strategy's scope ({describe(tf.distribute.get_strategy())}).")
    return tf.distribute.get_strategy()


def describe(strategy):
    """The strategy's name for logs: its class, or "one device" for
    TensorFlow's default strategy."""
    if is_default(strategy):
        return "one device"
    return type(strategy).__name__


def is_default(strategy):
    """True for TensorFlow's default strategy (no `tf.distribute` wrapper)."""
    with strategy.scope():
        return not tf.distribute.has_strategy()


def replicas_per_worker(strategy):
    """How many replicas this worker's input pipeline feeds (1 under the
    default strategy, which has no device list)."""
    if is_default(strategy):
        return 1
    return len(strategy.extended.worker_devices)


def is_chief(strategy):
    """True on the worker that writes checkpoints, logs and the run directory."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


def one_worker(strategy):
    """True unless `strategy` runs on a cluster of workers (TF_CONFIG)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver is None or not resolver.task_type


def worker_id(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return 0
    return resolver.task_id


# CPU flags (as /proc/cpuinfo spells them) of the bfloat16 matmul
# instructions oneDNN uses: AVX512-BF16 (AMD Zen 4 and later, Intel Cooper
# Lake) and AMX (Intel Sapphire Rapids and later).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bfloat16(cpuinfo="/proc/cpuinfo"):
    """Whether this host multiplies bfloat16 matrices in hardware: every
    visible GPU has compute capability 8.0 (Ampere) or later, or, with no GPU,
    the CPU has one of `BF16_CPU_FLAGS`. None when it cannot tell (no GPU
    details, or no readable `cpuinfo`, e.g. not on Linux).

    Elsewhere bfloat16 matmuls are converted to float32 and back, so
    `mixed_bfloat16` trains slower than float32 there (docs/performance.md).
    """
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability")
                        for gpu in gpus]
        if any(c is None for c in capabilities):
            return None
        return all(tuple(c) >= (8, 0) for c in capabilities)
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    if not flags:
        return None
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def choose_precision(requested="auto"):
    """Resolves kt-train's `--precision`: returns `(precision, reason)`.

    `auto` takes `mixed_bfloat16` where the host multiplies bfloat16 in
    hardware (`native_bfloat16()`) and `float32` elsewhere, including when it
    cannot tell; any of `PRECISIONS` is returned as given. `reason` is a
    clause for the log, e.g. "auto: no bfloat16 matmul hardware".
    """
    if requested != "auto":
        if requested not in PRECISIONS:
            raise ValueError(f"Unknown precision {requested!r}; expected 'auto' or one of "
                             f"{PRECISIONS}.")
        return requested, "as requested"
    native = native_bfloat16()
    if native:
        where = ("every GPU runs bfloat16 natively" if tf.config.list_physical_devices("GPU")
                 else f"this CPU multiplies bfloat16 in hardware ({'/'.join(BF16_CPU_FLAGS)})")
        return "mixed_bfloat16", f"auto: {where}"
    if native is None:
        return "float32", "auto: bfloat16 hardware could not be detected"
    return "float32", "auto: no bfloat16 matmul hardware"


def set_precision(precision):
    """Sets the global Keras dtype policy (`float32`, `mixed_bfloat16`,
    `mixed_float16`); call before building the model.

    `mixed_bfloat16` on a host without bfloat16 hardware (`native_bfloat16()`
    is False) is allowed but warns: it is slower than float32 there.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown precision {precision!r}; expected one of {PRECISIONS}.")
    if precision == "mixed_bfloat16" and native_bfloat16() is False:
        warnings.warn(
            "mixed_bfloat16 on a host without bfloat16 matmul hardware (no GPU of "
            f"compute capability 8.0 or later, no CPU flag among {BF16_CPU_FLAGS}): "
            "bfloat16 matmuls run converted to float32, so training is slower than in "
            "float32 (docs/performance.md). "
            "Use --precision float32 here.", stacklevel=2)
    keras.config.set_dtype_policy(precision)
