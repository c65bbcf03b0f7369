"""Tolerances for comparing two different computations of the same value, worked out from
rounding-error analysis so that they hold on any CPU and any thread count.

A sum of ``terms`` products of k factors, evaluated in floating point in any order or nesting
(BLAS kernels chosen per CPU, FMA, numpy's pairwise sums, a different thread count), lies within
gamma_m * sum|products| of the exact value, where u = eps / 2 is the unit roundoff,
gamma_m = m u / (1 - m u) and m = terms + k - 1 bounds the roundings one product meets on its way
into the result: k - 1 multiplications and at most terms - 1 additions (Higham, Accuracy and
Stability of Numerical Algorithms, 2nd ed., Sec. 3.1). Two evaluations differ by at most twice
that, and with every factor bounded by its magnitude, sum|products| <= terms * prod(magnitudes).

Bit-for-bit equality stays the rule where the same code runs twice (same seed, resume).
"""

import math

import numpy as np


def rounding_atol(*magnitudes: float, terms: int, dtype=np.float32) -> float:
    """Largest |x - y| between two ``dtype`` evaluations of one sum of ``terms`` products whose
    factors are at most ``magnitudes`` in absolute value."""
    unit = float(np.finfo(dtype).eps) / 2
    m = terms + len(magnitudes) - 1
    assert m * unit < 0.5, "too many terms for a rounding bound in this precision"
    return 2 * m * unit / (1 - m * unit) * terms * math.prod(float(v) for v in magnitudes)


def float32_atol(*magnitudes: float, terms: int) -> float:
    return rounding_atol(*magnitudes, terms=terms, dtype=np.float32)


def float64_atol(*magnitudes: float, terms: int) -> float:
    return rounding_atol(*magnitudes, terms=terms, dtype=np.float64)


# A float64 value rounded once to float32 moves by at most half a float32 spacing: this relative
# tolerance, plus FLOAT32_TINY in absolute terms for results in the subnormal range.
FLOAT32_ROUNDING = float(np.finfo(np.float32).eps) / 2
FLOAT32_TINY = 2.0 ** -150

# Whole networks (attention, norms, GELU) compared against another implementation run in float64
# on both sides: each layer of these tiny test models (fan-in <= 128, weights and normalised
# activations O(1)) adds about fan-in * eps64 ~ 3e-14 rounding, a few layers ~1e-13. This leaves a
# margin of 1000 for error growth between layers and is still 1e8 below any real mismatch (a
# missing block, a wrong mask or a misplaced adapter changes logits by 1e-2 or more).
NETWORK_FLOAT64_ATOL = 1e-10


def assert_rounded_mean(actual: np.ndarray, tensors, weights=None):
    """``actual`` is the (weighted) mean of ``tensors`` summed in float64 and rounded once to
    float32, as the server aggregates: the two float64 sums, of len(tensors) products with
    weights normalised to sum 1, differ by at most float64_atol(max|x|, 1); then one rounding."""
    stack = np.stack([np.asarray(t, np.float64) for t in tensors])
    expected = np.average(stack, axis=0, weights=weights)
    atol = float64_atol(np.abs(stack).max(), 1.0, terms=len(tensors) + 1) + FLOAT32_TINY
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=FLOAT32_ROUNDING, atol=atol)
