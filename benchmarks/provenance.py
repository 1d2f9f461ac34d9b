"""What a result file records about where it was measured: the CPU (model,
cores, the instruction sets that choose TensorFlow's kernels), the kernels
TensorFlow multiplies float32 with, the commit and the command."""

import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Flags that decide which kernels TensorFlow takes and whether bfloat16 is native.
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "fma")


def cpu(cpuinfo="/proc/cpuinfo"):
    """`{"model", "cores", "flags"}` of this machine's CPU (flags limited to
    `NOTABLE_FLAGS`); the model is `platform.processor()` where there is no
    `/proc/cpuinfo`."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(),
            "flags": [flag for flag in NOTABLE_FLAGS if flag in flags]}


def commit():
    """The checkout's commit, with "+changes" when the tree differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def matmul_kernels():
    """"onednn", "eigen" or "gpu": what TensorFlow multiplies float32 with here."""
    from keras_transformer.kernels import platform as tf_platform

    if tf_platform.has_gpu():
        return "gpu"
    return "onednn" if tf_platform.tensorflow_uses_onednn() else "eigen"


def record(command=None):
    """The provenance fields of a result file."""
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu(), "commit": commit(),
            "command": command or " ".join(sys.argv)}


def cpu_kind(cpu_fields):
    """The results files' CPU prefix: "avx512" or "avx2" by the widest
    vector instructions of `cpu()`'s fields (a Zen 3 AVX2 host is written
    "zen3-avx2" by hand)."""
    flags = set(cpu_fields["flags"])
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "cpu"


def result_path(fields, kind):
    """`benchmarks/results/<cpu kind>_<date>_<commit>_<kind>.json` for a
    result whose provenance is `fields` (`record()`)."""
    return os.path.join(ROOT, "benchmarks", "results",
                        f"{cpu_kind(fields['cpu'])}_{time.strftime('%Y-%m-%d')}_"
                        f"{fields['commit'].split('+')[0]}_{kind}.json")


def write_result(document, fields, kind, path=None):
    """Writes `document` as JSON to `path`, by default `result_path(fields,
    kind)` (`fields`: `record()`'s); prints and returns the path."""
    import json

    path = path or result_path(fields, kind)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2)
        f.write("\n")
    print(f"wrote {path}")
    return path
