"""`python -m benchmarks working-set` (benchmarks/decode_working_set.py): its loops multiply by the weights it
says they do (so the bytes and rates it prints are about the decoder's
step), and it prints every part and the penalty (tiny config, one round)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import decode_working_set
from benchmarks.bench_config import make_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def whole(weight, axis=1):
    """A stored weight (its column blocks; row blocks of the table) as one
    float32 array."""
    return np.concatenate([p.numpy().astype(np.float32) for p in weight], axis=axis)


def numpy_step(part, x):
    """The step the docstring describes, in NumPy, on the part's weights."""
    h = x
    for wq, wk, wv, wo, cq, co, w1, w2 in [[whole(w) for w in ws] for ws in part.layers]:
        h = np.tanh(np.tanh(h @ wq + h @ wk + h @ wv) @ wo)
        h = np.tanh(np.tanh(h @ cq) @ co)
        h = np.tanh(np.maximum(h @ w1, 0) @ w2)
    if part.table is not None:
        h = np.tanh((h @ whole(part.table, axis=0).T)[:, : h.shape[1]])
    return x + 1e-3 * h


@pytest.mark.parametrize("layers, projection, blocks",
                         [(2, True, 1), (1, False, 1), (0, True, 1), (2, True, 2), (1, True, 3)])
def test_the_loop_multiplies_by_the_decoders_and_the_tables_weights(layers, projection, blocks):
    config = make_config("tiny")
    part = decode_working_set.StepPart(config, layers, projection, rows=3, steps=2, seed=0,
                                       blocks=blocks)
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    assert [whole(w).shape for w in (part.layers[0] if layers else [])] == (
        [(d, d)] * 6 + [(d, f), (f, d)] if layers else [])
    assert all(len(w) == blocks for ws in part.layers for w in ws)
    if projection:
        assert len(part.table) == blocks and whole(part.table, axis=0).shape == (v, d)
    assert part.products == 8 * layers + projection
    assert part.bytes == 4 * (layers * (6 * d * d + 2 * d * f) + projection * v * d)
    expected = numpy_step(part, numpy_step(part, part.x.numpy()))
    np.testing.assert_allclose(part.run(part.x).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_bfloat16_weights_are_stored_in_half_the_bytes_and_multiply_as_float32():
    config = make_config("tiny")
    part = decode_working_set.StepPart(config, 1, True, rows=3, steps=2, seed=0,
                                       dtype="bfloat16")
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    assert all(p.dtype.name == "bfloat16" for w in part.layers[0] + [part.table] for p in w)
    assert part.bytes == 2 * (6 * d * d + 2 * d * f + v * d)
    out = part.run(part.x)
    assert out.dtype.name == "float32"
    # Activations are rounded to bfloat16 (8 bits of mantissa) before each
    # product; values stay within tanh's range, so 2^-8 relative per product
    # over the loop's few products stays far below 0.05.
    expected = numpy_step(part, numpy_step(part, part.x.numpy()))
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=0.05)


@pytest.mark.e2e
@pytest.mark.parametrize("blocks", [1, 2])
def test_prints_every_part_and_the_penalty(blocks):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "working-set", "--config", "tiny", "--steps", "2",
         "--rounds", "2", "--repeats", "1", "--column-blocks", str(blocks)],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tiny: float32 weights, 4 rows, 2 steps a loop, median of 2 rounds")
    rows = {line[:18].strip(): line[18:].split() for line in lines[2:-1]}
    assert list(rows) == ["layer 1", "layers 1-2", "projection", "whole step",
                          "whole step, 1 row"] + (["whole, 2 blocks"] if blocks == 2 else [])
    assert rows["whole step"][0] == rows["whole step, 1 row"][0]
    config = make_config("tiny")
    layer_mb = 4 * (6 * config.d_model ** 2 + 2 * config.d_model * config.d_ff) / 1e6
    assert float(rows["layer 1"][0]) == pytest.approx(layer_mb, abs=0.005)
    if blocks == 2:  # the same weights' bytes, in blocks
        assert rows["whole, 2 blocks"][0] == rows["whole step"][0]
    for name, values in rows.items():
        ms, rounds = float(values[1]), [float(t) for t in values[5:]]
        # The median of the rounds, which are printed to 0.1 ms.
        assert ms > 0 and len(rounds) == 2, name
        assert min(rounds) - 0.05 <= ms <= max(rounds) + 0.05, name
    assert lines[-1].startswith("penalty ") and float(lines[-1].split()[1]) > 0


@pytest.mark.parametrize("flag", ["--rows", "--column-blocks"])
def test_refuses_a_count_below_one(flag, capsys):
    with pytest.raises(SystemExit):
        decode_working_set.main([flag, "0"])
    assert f"{flag} must be at least 1" in capsys.readouterr().err
