"""RewardWeightedSampler: probability proportional to exp(reward / temperature)."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import EmptyBufferError, ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import RewardWeightedSampler
from tests.helpers import make_row
from tests.samplers.stats import chi_square_p, make_index, positions


@pytest.mark.parametrize("temperature", [0.5, 1.0, 4.0])
def test_draws_follow_a_softmax_over_rewards(temperature: float) -> None:
    reward = np.array([-1.0, 0.0, 0.5, 1.0, 2.0])
    index = make_index(5, reward_t=reward)
    sampler = RewardWeightedSampler(temperature=temperature, seed=0)
    drawn = positions(index, sampler.sample_keys(index, 30_000, sampler.rng))
    counts = np.bincount(drawn, minlength=5)
    assert chi_square_p(counts, np.exp(reward / temperature)) > 1e-3
    assert chi_square_p(counts, np.exp(reward / (temperature * 3))) < 1e-6


def test_rows_without_a_reward_are_never_drawn() -> None:
    index = make_index(4, reward_t=np.array([np.nan, 1.0, np.nan, 1.0]))
    sampler = RewardWeightedSampler(seed=0)
    drawn = positions(index, sampler.sample_keys(index, 1000, sampler.rng))
    assert set(drawn.tolist()) == {1, 3}


def test_huge_rewards_do_not_overflow() -> None:
    index = make_index(3, reward_t=np.array([1000.0, 2000.0, 2000.0]))
    sampler = RewardWeightedSampler(temperature=1.0, seed=0)
    drawn = positions(index, sampler.sample_keys(index, 2000, sampler.rng))
    assert set(drawn.tolist()) == {1, 2}


def test_no_reward_among_matching_rows_names_the_condition(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("a", step=0, reward=None), make_row("b", step=0, reward=1.0)])
    cond = QueryBuilder().eq("exp_meta.task_id", "a").build()
    with pytest.raises(EmptyBufferError, match="no matching row has a reward_t") as caught:
        RewardWeightedSampler().sample(buffer.storage, 2, cond)
    assert str(cond) in str(caught.value)
    rows = RewardWeightedSampler(seed=0).sample(buffer.storage, 5)
    assert {r.exp_meta.task_id for r in rows} == {"b"}


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), None])
def test_temperature_must_be_positive(bad: object) -> None:
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        RewardWeightedSampler(temperature=bad)  # type: ignore[arg-type]
