"""Goodness-of-fit by hand (no scipy): Pearson's chi-square and its p-value."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _upper_gamma_regularized(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a), by series (x < a + 1) or continued fraction."""
    if x <= 0:
        return 1.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    # Lentz's continued fraction for Q
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h


def chi_square_p(
    observed: Sequence[float] | np.ndarray, expected_probs: Sequence[float] | np.ndarray
) -> float:
    """The p-value of Pearson's chi-square test of ``observed`` counts against probabilities."""
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(expected_probs, dtype=np.float64)
    probs = probs / probs.sum()
    expected = probs * observed.sum()
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a count fell where the probability is zero"
    statistic = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    return _upper_gamma_regularized(dof / 2, statistic / 2)


def make_index(n: int, **columns: np.ndarray) -> dict[str, np.ndarray]:
    """A key index like storage.key_index() gives: gappy ascending keys, read-only arrays."""
    index = {"key": 100 + 3 * np.arange(n, dtype=np.int64), **columns}
    for array in index.values():
        array.flags.writeable = False
    return index


def positions(index: dict[str, np.ndarray], keys: np.ndarray) -> np.ndarray:
    """Where each key sits in the index."""
    found = np.searchsorted(index["key"], keys)
    assert np.array_equal(index["key"][found], keys), "a sampler returned a key not in the index"
    return found
