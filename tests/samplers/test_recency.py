"""RecencySampler: weight (rank + 1) ** power by insertion order, without replacement."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.samplers import RecencySampler
from tests.helpers import make_rows
from tests.samplers.stats import chi_square_p, make_index, positions


@pytest.mark.parametrize("power", [0.0, 1.0, 2.5, -1.0])
def test_a_draw_follows_rank_plus_one_to_the_power(power: float) -> None:
    n = 12
    index = make_index(n)
    sampler = RecencySampler(power=power, seed=0)
    counts = np.zeros(n)
    for _ in range(6000):
        first = positions(index, sampler.sample_keys(index, 1, sampler.rng))
        counts[first] += 1
    weights = np.arange(1, n + 1, dtype=float) ** power
    assert chi_square_p(counts, weights) > 1e-3
    if power > 0:
        assert counts[-1] > counts[0]


def test_the_test_would_notice_the_wrong_power() -> None:
    index = make_index(12)
    sampler = RecencySampler(power=1.0, seed=0)
    draws = [positions(index, sampler.sample_keys(index, 1, sampler.rng))[0] for _ in range(6000)]
    counts = np.bincount(draws, minlength=12)
    assert chi_square_p(counts, np.arange(1, 13, dtype=float) ** 2) < 1e-6


def test_a_batch_holds_distinct_rows_drawn_successively() -> None:
    # Two of three rows with weights 1, 4, 9: P({a, b}) = P(a then b) + P(b then a).
    index = make_index(3)
    sampler = RecencySampler(power=2.0, seed=1)
    pairs = [
        frozenset(positions(index, sampler.sample_keys(index, 2, sampler.rng)).tolist())
        for _ in range(6000)
    ]
    assert all(len(p) == 2 for p in pairs)
    w = np.array([1.0, 4.0, 9.0])
    total = w.sum()

    def p_pair(a: int, b: int) -> float:
        return float(w[a] / total * w[b] / (total - w[a]) + w[b] / total * w[a] / (total - w[b]))

    combos = [frozenset({0, 1}), frozenset({0, 2}), frozenset({1, 2})]
    counts = [pairs.count(c) for c in combos]
    assert chi_square_p(counts, [p_pair(*sorted(c)) for c in combos]) > 1e-3


def test_huge_powers_do_not_overflow() -> None:
    index = make_index(10)  # 10 ** 500 overflows a float64; its log does not
    sampler = RecencySampler(power=500.0, seed=0)
    keys = sampler.sample_keys(index, 3, sampler.rng)
    assert positions(index, keys).tolist() == [9, 8, 7]


def test_recency_is_by_insertion_among_matching_rows(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(30))
    rows = RecencySampler(power=60.0, seed=0).sample(buffer.storage, 2)
    assert sorted(r.exp_data.state["i"] for r in rows) == [28, 29]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", None])
def test_power_must_be_a_finite_number(bad: object) -> None:
    with pytest.raises(ValueError, match="power must be a finite number"):
        RecencySampler(power=bad)  # type: ignore[arg-type]
