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
