"""RewardWeightedSampler: probability proportional to exp(reward / temperature)."""

from __future__ import annotations

import warnings

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


@pytest.mark.parametrize(
    ("reward", "temperature", "expected"),
    [
        # r / T overflows to inf: inf - inf would be NaN and starve every rewarded row.
        ([1e308, 0.0, np.nan], 0.5, [1.0, 0.0, 0.0]),
        # r - rmax overflows to -inf: that row gets weight 0, not NaN.
        ([1e308, -1e308, np.nan, 1e308], 1e-300, [1.0, 0.0, 0.0, 1.0]),
        ([-1e308, -1e308, np.nan], 1e-300, [1.0, 1.0, 0.0]),
        ([1.0, 1.0 + 1e-12, np.nan], 1e-300, [0.0, 1.0, 0.0]),
    ],
)
def test_extreme_rewards_and_temperatures_keep_the_softmax(
    reward: list[float], temperature: float, expected: list[float]
) -> None:
    index = make_index(len(reward), reward_t=np.array(reward))
    sampler = RewardWeightedSampler(temperature=temperature, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value RuntimeWarning
        drawn = positions(index, sampler.sample_keys(index, 4000, sampler.rng))
    counts = np.bincount(drawn, minlength=len(reward))
    assert set(drawn.tolist()) == {i for i, p in enumerate(expected) if p}
    assert chi_square_p(counts, expected) > 1e-3


def test_infinite_rewards_in_an_index_share_the_draws() -> None:
    index = make_index(4, reward_t=np.array([np.inf, 5.0, np.inf, -np.inf]))
    sampler = RewardWeightedSampler(temperature=2.0, seed=0)
    drawn = positions(index, sampler.sample_keys(index, 1000, sampler.rng))
    assert set(drawn.tolist()) == {0, 2}
    index = make_index(2, reward_t=np.array([-np.inf, -np.inf]))
    drawn = positions(index, sampler.sample_keys(index, 1000, sampler.rng))
    assert set(drawn.tolist()) == {0, 1}


def test_extreme_rewards_from_storage_never_draw_unrewarded_rows(buffer: ReplayBuffer) -> None:
    buffer.store_batch(
        [
            make_row("top", step=0, reward=1e308),
            make_row("low", step=0, reward=-1e308),
            make_row("zero", step=0, reward=0.0),
            make_row("none", step=0, reward=None),
        ]
    )
    for temperature in (0.5, 1e-300):
        rows = RewardWeightedSampler(temperature=temperature, seed=0).sample(buffer.storage, 200)
        assert {r.exp_meta.task_id for r in rows} == {"top"}


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


@pytest.mark.parametrize("filtered", [False, True])
def test_over_the_key_space_draws_follow_the_softmax_without_a_key_index(
    buffer: ReplayBuffer, filtered: bool
) -> None:
    rewards = [-1.0, 0.0, 0.5, 1.0, 2.0, None, 1.5, -0.5]
    buffer.store_batch([make_row("t", f"agent{i % 2}", i, reward=r) for i, r in enumerate(rewards)])
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent0").build() if filtered else None
    sampler = RewardWeightedSampler(temperature=1.0, seed=3)
    drawn = []
    for _ in range(150):
        sampler.sample(buffer.storage, 40, cond)
        drawn.append(sampler.last_keys)
    assert not buffer.storage.index.entries  # over the key space, no key index held
    keys = np.array(buffer.storage.key_index(cond, ("reward_t",))["key"])
    reward = np.array(buffer.storage.key_index(cond, ("reward_t",))["reward_t"])
    counts = np.array([(np.concatenate(drawn) == k).sum() for k in keys])
    weight = np.where(np.isnan(reward), 0.0, np.exp(np.nan_to_num(reward, nan=0.0)))
    assert counts[weight == 0].sum() == 0  # the row without a reward, never
    assert chi_square_p(counts[weight > 0], weight[weight > 0]) > 1e-4


def test_a_steep_softmax_draws_the_top_row_either_way(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("t", "a", i, reward=float(i)) for i in range(50)])
    for flat in (True, False):
        sampler = RewardWeightedSampler(temperature=0.01, seed=0)  # one row holds it all
        sampler.flat = flat
        rows = sampler.sample(buffer.storage, 20)
        assert {r.exp_meta.step for r in rows} == {49}
