"""Tolerances for float32 results that may be summed in another order.

oneDNN (AVX-512 hosts) and Eigen (AVX2 hosts) accumulate a float32 dot
product in different orders and block sizes, and a product computed in
slices or through a transposed copy may take yet another. None of them is
wrong: each sum of `n` products carries a rounding error bounded by
`gamma_n * sum_i |a_i b_i|`, with `gamma_n = n u / (1 - n u)` and
`u = 2**-24` (Higham, "Accuracy and Stability of Numerical Algorithms",
section 3.1). Two orders differ by at most twice that. Equivalence tests
take their tolerance from this bound, computed from the operands, never
from what one machine printed.
"""

import numpy as np

UNIT_ROUNDOFF = 2.0**-24


def gamma(n):
    """`n u / (1 - n u)`: the relative error bound of a float32 sum of `n` terms."""
    return n * UNIT_ROUNDOFF / (1.0 - n * UNIT_ROUNDOFF)


def matmul_bound(a, b):
    """Elementwise bound on the difference between two float32 evaluations
    of `a @ b` that sum in different orders: `2 gamma_n |a| @ |b|`, with
    `n` the inner dimension. `a`: `(..., m, n)`, `b`: `(..., n, k)`."""
    a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    # One more term for the rounding of the stored result.
    return 2.0 * gamma(a.shape[-1] + 1) * (a @ b)


def assert_matmul_close(actual, expected, a, b):
    """Asserts that `actual` and `expected`, two float32 evaluations of
    `a @ b`, differ by no more than float32 summation order allows."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    bound = matmul_bound(a, b)
    excess = np.abs(actual.astype(np.float64) - expected) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"at {worst}: {actual[worst]} vs {expected[worst]}, difference "
        f"{abs(float(actual[worst]) - float(expected[worst])):.3g} exceeds the float32 "
        f"summation-order bound {bound[worst]:.3g}")


def assert_close_in_ulps(actual, expected, ulps=64):
    """Asserts that two float32 evaluations of one composite computation (a
    layer: several matmuls, a softmax, a normalisation) agree within `ulps`
    units in the last place of the output's scale, `max(1, max|expected|)`.

    Each operation's summation order may differ between paths (oneDNN,
    Eigen, a fused or a traced graph); its error is a few ulps, and a stack
    of a few operations on unit-scale values stays within tens of them. A
    real difference (a skipped residual, dropout applied) is of the order
    of the values themselves, far above the bound."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.abs(expected).max()))
    bound = ulps * float(np.finfo(np.float32).eps) * scale
    worst = np.unravel_index(np.argmax(np.abs(actual - expected)), actual.shape)
    difference = abs(float(actual[worst]) - float(expected[worst]))
    assert difference <= bound, (
        f"at {worst}: {actual[worst]} vs {expected[worst]}, difference {difference:.3g} "
        f"exceeds {ulps} ulps of the output's scale {scale:.3g} ({bound:.3g})")
