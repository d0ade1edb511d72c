"""The hand-written chi-square helper the statistical tests rely on."""

from __future__ import annotations

import numpy as np

from tests.samplers.stats import _upper_gamma_regularized, chi_square_p


def test_chi_square_p_matches_known_values() -> None:
    # chi2(1) at 3.841 -> 0.05; chi2(10) at 18.307 -> 0.05; chi2(4) at 13.277 -> 0.01
    assert abs(_upper_gamma_regularized(0.5, 3.841 / 2) - 0.05) < 1e-3
    assert abs(_upper_gamma_regularized(5, 18.307 / 2) - 0.05) < 1e-3
    assert abs(_upper_gamma_regularized(2, 13.277 / 2) - 0.01) < 1e-3


def test_chi_square_p_rejects_a_wrong_distribution() -> None:
    rng = np.random.default_rng(0)
    counts = np.bincount(rng.integers(0, 10, 5000), minlength=10)
    assert chi_square_p(counts, np.ones(10)) > 0.01
    assert chi_square_p(counts, np.arange(1, 11)) < 1e-6
