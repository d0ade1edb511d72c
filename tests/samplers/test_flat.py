"""Draws over the key space (expstore.samplers.flat): the same distributions as over the key
index, without holding the buffer's keys, on both backends."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from expstore import EmptyBufferError, ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import (
    PrioritizedSampler,
    RecencySampler,
    StratifiedSampler,
    UniformSampler,
)
from expstore.samplers.flat import draw_ranks
from tests.helpers import make_row, make_rows
from tests.samplers.stats import chi_square_p

P_MIN = 1e-4  # a correct sampler fails one of these tests about once in 10,000 runs


def _keys(buffer: ReplayBuffer) -> np.ndarray:
    return np.array(buffer.storage.key_index(None)["key"])


def _draw(buffer: ReplayBuffer, sampler, calls: int, batch: int, condition=None) -> np.ndarray:
    drawn = []
    for _ in range(calls):
        sampler.sample(buffer.storage, batch, condition)
        drawn.append(sampler.last_keys)
    return np.concatenate(drawn)


def _holds_no_index(buffer: ReplayBuffer) -> bool:
    return not buffer.storage.index.entries


def _gappy(buffer: ReplayBuffer, db_url: str, buffer_name: str) -> None:
    """60 rows of this buffer with every fifth deleted, mixed with another buffer's rows."""
    with ReplayBuffer(db_url, name=buffer_name + "_other") as other:
        for start in range(0, 60, 10):
            buffer.store_batch(make_rows(10, agents=3)[:10] if start == 0 else _more(start))
            other.store_batch(make_rows(5))
    buffer.delete(QueryBuilder().eq("exp_meta.step", 1).build())


def _more(start: int):
    rows = make_rows(start + 10, agents=3)[start:]
    return rows


def test_uniform_over_matching_rows_skips_gaps_other_buffers_and_deleted_rows(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    _gappy(buffer, db_url, buffer_name)
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    matching = np.array(buffer.storage.key_index(cond)["key"])
    buffer.storage.forget_caches()
    sampler = UniformSampler(seed=1)
    drawn = _draw(buffer, sampler, 150, 40, cond)
    assert _holds_no_index(buffer)  # drawn over the key space
    assert set(drawn.tolist()) <= set(matching.tolist())
    counts = np.array([(drawn == k).sum() for k in matching])
    assert chi_square_p(counts, np.ones(len(matching))) > P_MIN


def test_uniform_without_a_condition_on_dense_keys_never_probes(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(50))
    keys = _keys(buffer)
    buffer.storage.forget_caches()
    drawn = _draw(buffer, UniformSampler(seed=2), 100, 50)
    assert _holds_no_index(buffer)
    counts = np.array([(drawn == k).sum() for k in keys])
    assert chi_square_p(counts, np.ones(len(keys))) > P_MIN


def test_uniform_with_max_staleness_draws_only_fresh_rows(buffer: ReplayBuffer) -> None:
    rows = make_rows(40)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = i // 10  # versions 0..3
    buffer.store_batch(rows)
    buffer.set_policy_version(3)
    at_least_2 = QueryBuilder().gte("exp_meta.policy_version", 2).build()
    fresh = set(buffer.storage.key_index(at_least_2)["key"].tolist())
    buffer.storage.forget_caches()
    drawn = _draw(buffer, UniformSampler(seed=3, max_staleness=1), 40, 20)
    assert _holds_no_index(buffer)
    assert set(drawn.tolist()) == fresh


def test_a_condition_few_rows_meet_falls_back_to_the_key_index(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(400, agents=200))  # one agent holds 2 rows: 0.5%
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent7").build()
    wanted = set(buffer.storage.key_index(cond)["key"].tolist())
    buffer.storage.forget_caches()
    sampler = UniformSampler(seed=4)
    drawn = _draw(buffer, sampler, 20, 8, cond)
    assert set(drawn.tolist()) == wanted
    assert not _holds_no_index(buffer)  # it gave up on rejection and read the index
    nothing = QueryBuilder().eq("exp_meta.agent_id", "nobody").build()
    with pytest.raises(EmptyBufferError, match="no rows match"):
        UniformSampler(seed=4).sample(buffer.storage, 8, nothing)


def test_prioritized_draws_in_proportion_and_weighs_as_the_key_index_does(
    buffer: ReplayBuffer,
) -> None:
    buffer.store_batch(make_rows(30))
    rows = buffer.storage.fetch_keys(_keys(buffer))
    # Ten rows keep no priority (they count as the largest, 8.0).
    buffer.update_priorities([r.id for r in rows[:20]], [0.5 + (i % 8) for i in range(20)])
    keys = _keys(buffer)
    priority = np.array(buffer.storage.key_index(None, ("priority",))["priority"])
    priority = np.where(np.isnan(priority), np.nanmax(priority), priority)
    buffer.storage.forget_caches()
    flat = PrioritizedSampler(alpha=0.8, beta=0.5, seed=5)
    drawn = _draw(buffer, flat, 200, 30)
    assert _holds_no_index(buffer)
    counts = np.array([(drawn == k).sum() for k in keys])
    assert chi_square_p(counts, (priority + 1e-6) ** 0.8) > P_MIN
    flat.sample(buffer.storage, 16)
    # (N P_i)^-beta normalised by the least likely row's
    likelihood = (priority + 1e-6) ** 0.8
    expected = (likelihood / likelihood.min()) ** -0.5
    at = np.searchsorted(keys, flat.last_keys)
    np.testing.assert_allclose(flat.last_weights, expected[at], rtol=1e-6)


def _prioritized_narrowed(buffer: ReplayBuffer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """60 rows of agents 0-2 and policy versions 0-3 (current 3), 45 holding a priority:
    agent0's and the oldest rows' the lowest, so the least matching one lies beyond them
    in the priority index. Returns (keys, agents, versions, priorities with unset rows at
    the largest stored one)."""
    rows = make_rows(60, agents=3)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = i // 15
    buffer.store_batch(rows)
    buffer.set_policy_version(3)
    keys = _keys(buffer)
    stored = buffer.storage.fetch_keys(keys)
    agents = np.array([int(r.exp_meta.agent_id[-1]) for r in stored])
    versions = np.array([r.exp_meta.policy_version for r in stored])
    given = {
        r.id: (0.01 * i if agents[i] == 0 or versions[i] == 0 else 0.5 + (i % 7))
        for i, r in enumerate(stored[:45])
    }
    buffer.update_priorities(list(given), list(given.values()))
    priority = np.array([given.get(r.id, max(given.values())) for r in stored])
    return keys, agents, versions, priority


@pytest.mark.parametrize("narrowed", ["condition", "max_staleness", "consume_after"])
def test_prioritized_under_a_condition_or_staleness_draws_over_the_key_space(
    buffer: ReplayBuffer, narrowed: str
) -> None:
    """The least likely matching row (the weights' normaliser) is found at the low end of
    the priority index, past rows that do not match; draws and weights are those of the
    key index, and no key index is read."""
    keys, agents, versions, priority = _prioritized_narrowed(buffer)
    cond, options, matching = None, {}, np.ones(len(keys), dtype=bool)
    if narrowed == "condition":
        cond = QueryBuilder().ne("exp_meta.agent_id", "agent0").build()
        matching = agents != 0
    elif narrowed == "max_staleness":
        options, matching = {"max_staleness": 2}, versions >= 1
    else:
        options = {"consume_after": 1}
        spent = keys[agents != 0][:10]  # drawn once already: spent
        buffer.storage.count_draws(spent, 1)
        matching = ~np.isin(keys, spent)
    buffer.storage.forget_caches()
    weight = (priority + 1e-6) ** 0.8
    least = weight[matching].min()
    sampler = PrioritizedSampler(alpha=0.8, beta=0.5, seed=6, **options)
    for _ in range(3 if narrowed == "consume_after" else 200):
        sampler.sample(buffer.storage, 8, cond)
        at = np.searchsorted(keys, sampler.last_keys)
        assert matching[at].all()
        np.testing.assert_allclose(sampler.last_weights, (weight[at] / least) ** -0.5, rtol=1e-6)
    assert _holds_no_index(buffer)
    if narrowed != "consume_after":
        drawn = _draw(buffer, sampler, 200, 20, cond)
        counts = np.array([(drawn == k).sum() for k in keys[matching]])
        assert chi_square_p(counts, weight[matching]) > P_MIN


@pytest.mark.parametrize("narrowed", ["max_staleness", "consume_after"])
@pytest.mark.parametrize("flat", [True, False], ids=["key space", "key index"])
def test_prioritized_rows_without_a_priority_count_as_the_buffers_largest(
    buffer: ReplayBuffer, narrowed: str, flat: bool
) -> None:
    """Rows left out by max_staleness or consume_after still hold the buffer's largest
    priority, which rows without one count as, on both paths (found by review: over the
    key index they counted as the largest among the rows left in)."""
    rows = make_rows(20)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 0 if i < 10 else 1
    buffer.store_batch(rows)
    buffer.set_policy_version(1)
    keys = _keys(buffer)
    ids = [r.id for r in buffer.storage.fetch_keys(keys)]
    buffer.update_priorities(ids[:15], [10.0] * 10 + [1.0] * 5)  # the last 5: none
    if narrowed == "max_staleness":
        options: dict[str, int] = {"max_staleness": 0}
    else:
        options = {"consume_after": 1}
        buffer.storage.count_draws(keys[:10], 1)  # the rows of priority 10: spent
    buffer.storage.forget_caches()
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=0, **options)
    sampler.flat = flat
    sampler.sample(buffer.storage, 8)
    at = np.searchsorted(keys, sampler.last_keys)
    assert (at >= 10).all()
    # priority 1 against the largest, 10: weights (P / P_min) ** -1 of 1.0 and 0.1
    np.testing.assert_allclose(sampler.last_weights, np.where(at < 15, 1.0, 0.1), rtol=1e-6)


def test_prioritized_keeps_the_least_matching_priority_up_to_date(buffer: ReplayBuffer) -> None:
    """The least matching priority is found past the lowest entries when they match
    nothing (walks too short: then as far as it takes), then kept from draw to draw as
    priorities are updated, its row goes stale and the policy version is set back; the
    weights stay the key index's all along, and no key index is read."""
    keys, agents, versions, priority = _prioritized_narrowed(buffer)
    ids = [r.id for r in buffer.storage.fetch_keys(keys)]
    buffer.storage.forget_caches()
    cond = QueryBuilder().ne("exp_meta.agent_id", "agent0").build()
    sampler = PrioritizedSampler(alpha=0.8, beta=0.5, seed=7, max_staleness=2)
    # The 25 lowest priorities are agent0's or version 0's, matching neither.
    sampler.walks = (2, 4, None)
    current = 3
    stored = np.where(np.arange(len(keys)) < 45, priority, np.nan)  # the last 15: none

    def check() -> None:
        matching = (agents != 0) & (versions >= current - 2)
        weight = (np.where(np.isnan(stored), np.nanmax(stored), stored) + 1e-6) ** 0.8
        for _ in range(3):
            sampler.sample(buffer.storage, 8, cond)
            at = np.searchsorted(keys, sampler.last_keys)
            assert matching[at].all()
            least = weight[matching].min()
            np.testing.assert_allclose(sampler.last_weights, (weight[at] / least) ** -0.5, 1e-6)

    def set_priority(i: int, value: float) -> None:
        buffer.update_priorities([ids[i]], [value])
        stored[i] = value

    check()
    matching = (agents != 0) & (versions >= 1)
    lowest = int(np.flatnonzero(matching)[np.argmin(priority[matching])])
    set_priority(int(np.flatnonzero(matching)[-1]), 0.002)  # a new least, by the log
    check()
    set_priority(int(np.flatnonzero(matching)[-1]), 9.0)  # the least's row raised
    check()
    set_priority(lowest, 0.004)  # another
    check()
    buffer.set_policy_version(4)  # version 1 goes stale: the least's row among them
    current = 4
    assert versions[lowest] == 1  # the least's row among them
    check()
    buffer.set_policy_version(3, force=True)  # set back: version 1 is fresh again
    current = 3
    check()
    assert _holds_no_index(buffer)


def test_the_least_fresh_priority_is_read_from_the_fresh_keys_alone(buffer: ReplayBuffer) -> None:
    """Under max_staleness, past the short walks, the least priority is read from the
    priorities of the keys from the first fresh row on, not by walking the stale rows'
    entries; a stale row written late among the fresh keys, with the lowest priority of
    all, is still left out."""
    rows = make_rows(30)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 0 if i < 20 else 1
    buffer.store_batch(rows)
    late = make_rows(1)
    late[0].exp_meta.policy_version = 0  # a late rollout of the old policy
    buffer.store_batch(late)
    buffer.set_policy_version(1)
    keys = _keys(buffer)
    ids = [r.id for r in buffer.storage.fetch_keys(keys)]
    given = {ids[i]: 0.01 * (i + 1) for i in range(20)}  # stale: the lowest
    given.update({ids[i]: 2.0 + i for i in range(20, 25)})
    given[ids[25]] = 1.5  # the least fresh one; 26-29 hold none (the largest, 26.0)
    given[ids[30]] = 0.001  # the late stale row
    buffer.update_priorities(list(given), list(given.values()))
    buffer.storage.forget_caches()
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=3, max_staleness=0)
    sampler.walks = (2, 4, None)
    weight = np.array([given.get(i, 26.0) for i in ids])
    for _ in range(3):
        sampler.sample(buffer.storage, 6)
        at = np.searchsorted(keys, sampler.last_keys)
        assert ((at >= 20) & (at < 30)).all()
        np.testing.assert_allclose(sampler.last_weights, 1.5 / weight[at], rtol=1e-6)
    cached = buffer.sql.handle._statements  # type: ignore[attr-defined]
    # the form reading the fresh keys (a walk that went as far as it takes, key range)
    assert any(k[0] == "least priority" and k[-2:] == (True, "fresh keys") for k in cached)
    assert _holds_no_index(buffer)


@pytest.mark.parametrize("on", ["exp_meta.agent_id", "exp_data.state.agent"])
@pytest.mark.parametrize("held", [True, False], ids=["held", "none held"])
def test_the_least_priority_past_the_walks_under_a_condition(
    buffer: ReplayBuffer, db_url: str, held: bool, on: str
) -> None:
    """Past the short walks, under a condition alone: the least matching priority (none:
    the unset rows' largest) is the least of all the matching priorities (the condition
    on an indexed column), or found by walking on (SQLite, a condition on the payload)."""
    rows = make_rows(30, agents=3)
    for row in rows:
        row.exp_data.state["agent"] = row.exp_meta.agent_id
    buffer.store_batch(rows)
    keys = _keys(buffer)
    stored = buffer.storage.fetch_keys(keys)
    agents = np.array([int(r.exp_meta.agent_id[-1]) for r in stored])
    given = {r.id: 0.01 * (i + 1) for i, r in enumerate(stored) if agents[i] != 1}
    if held:
        given[stored[28].id] = 0.5  # agent1's only priority
    buffer.update_priorities(list(given), list(given.values()))
    buffer.storage.forget_caches()
    cond = QueryBuilder().eq(on, "agent1").build()
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=5)
    sampler.walks = (2, 4, None)
    largest = max(given.values())
    weight = np.array([given.get(r.id, largest) for r in stored])
    least = 0.5 if held else largest
    for _ in range(3):
        sampler.sample(buffer.storage, 6, cond)
        at = np.searchsorted(keys, sampler.last_keys)
        assert (agents[at] == 1).all()
        np.testing.assert_allclose(sampler.last_weights, least / weight[at], rtol=1e-6)
    indexed = db_url.startswith("postgresql") or on.startswith("exp_meta")
    form = "least of all" if indexed else "walk"
    cached = buffer.sql.handle._statements  # type: ignore[attr-defined]
    assert any(k[0] == "least priority" and k[2:4] == (True, form) for k in cached)
    assert _holds_no_index(buffer)


def test_a_prioritized_sampler_moved_to_another_buffer_finds_its_least_again() -> None:
    """Two in-memory buffers share a URL and a buffer id; the least matching priority one
    gave is not the other's (found by review: the second got the first's weights)."""
    cond = QueryBuilder().ne("exp_meta.agent_id", "agent0").build()

    def filled(least: float) -> ReplayBuffer:
        buffer = ReplayBuffer()
        buffer.store_batch(make_rows(40))
        ids = [r.id for r in buffer.query(cond)]
        buffer.update_priorities(ids, [least] + [1.0] * (len(ids) - 1))
        return buffer

    first, second = filled(0.01), filled(1.0)
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=0)
    sampler.sample(first.storage, 4, cond)
    sampler.sample(second.storage, 4, cond)
    assert _holds_no_index(second)
    np.testing.assert_allclose(sampler.last_weights, 1.0)


@pytest.mark.parametrize("power", [2.0, 0.5, -0.5])
def test_ranks_follow_rank_plus_one_to_the_power(power: float) -> None:
    rng = np.random.default_rng(6)
    count = 40
    firsts = []
    for _ in range(8000):
        ranks = draw_ranks(count, 5, power, rng)
        assert ranks is not None and len(set(ranks.tolist())) == 5
        firsts.append(ranks[0])
    counts = np.bincount(firsts, minlength=count)
    assert chi_square_p(counts, np.arange(1, count + 1, dtype=float) ** power) > P_MIN
    # the test notices a wrong power
    assert chi_square_p(counts, np.arange(1, count + 1, dtype=float) ** (power + 0.5)) < P_MIN


def test_ranks_decline_what_rejection_cannot_do_well() -> None:
    rng = np.random.default_rng(0)
    assert draw_ranks(10, 5, 1.0, rng) is None  # most of the rows: the key index serves
    assert draw_ranks(1000, 5, -3.0, rng) is None  # too steep towards old rows
    assert draw_ranks(100_000, 10, 64.0, rng) is None  # exp() would overflow: the index serves
    assert draw_ranks(10**8, 10, 40.0, rng) is None
    zero = draw_ranks(1000, 10, 0.0, rng)
    assert zero is not None and len(set(zero.tolist())) == 10


def test_recency_over_dense_keys_draws_by_rank(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(60))
    keys = _keys(buffer)
    buffer.storage.forget_caches()
    sampler = RecencySampler(power=1.0, seed=7)
    firsts = []
    for _ in range(1500):
        sampler.sample(buffer.storage, 3)
        assert len(set(sampler.last_keys.tolist())) == 3
        firsts.append(int(sampler.last_keys[0]))
    assert _holds_no_index(buffer)
    counts = np.array([firsts.count(k) for k in keys.tolist()])
    assert chi_square_p(counts, np.arange(1, 61, dtype=float)) > P_MIN


def test_recency_leaves_out_late_stale_rows_among_the_fresh(buffer: ReplayBuffer) -> None:
    """Under max_staleness, rows of an old version written among the fresh ones (late
    rollouts) are left out of the ranks, which stay those among the fresh rows; with more
    of them than a draw leaves out, the key index serves."""
    rows = make_rows(60)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 0 if i < 20 or 35 <= i < 45 else 1  # 35-44: late
        if i == 50:
            row.exp_meta.policy_version = None  # no version: fresh
    buffer.store_batch(rows)
    buffer.set_policy_version(1)
    keys = _keys(buffer)
    versions = [r.exp_meta.policy_version for r in buffer.storage.fetch_keys(keys)]
    fresh = keys[[v is None or v >= 1 for v in versions]]
    buffer.storage.forget_caches()
    sampler = RecencySampler(power=1.0, seed=3, max_staleness=0)
    firsts = []
    for _ in range(2000):
        sampler.sample(buffer.storage, 3)
        assert np.isin(sampler.last_keys, fresh).all()
        assert len(set(sampler.last_keys.tolist())) == 3
        firsts.append(int(sampler.last_keys[0]))
    assert _holds_no_index(buffer)
    counts = np.array([firsts.count(k) for k in fresh.tolist()])
    assert chi_square_p(counts, np.arange(1, len(fresh) + 1, dtype=float)) > P_MIN
    # the test notices ranks counted over the keys, the late rows among them
    by_key = (fresh - fresh[0] + 1).astype(float)
    assert chi_square_p(counts, by_key) < P_MIN
    sampler.late_keys = 3  # 10 late rows: more than it leaves out
    sampler.sample(buffer.storage, 3)
    assert np.isin(sampler.last_keys, fresh).all()
    assert not _holds_no_index(buffer)


@pytest.mark.parametrize("versions", [1024, 1], ids=["by version", "by key range"])
def test_recency_follows_late_rows_written_since(
    db_url: str, buffer_name: str, versions: int
) -> None:
    """The late rows are read once per oldest fresh version, then among the rows written
    since: a late row stored between draws is left out too, whether they are read by
    stale version or (more stale versions than that: a long run) by key range."""
    from expstore.storage import Tuning

    with ReplayBuffer(db_url, name=buffer_name, tuning=Tuning(fresh_versions=versions)) as buffer:
        rows = make_rows(60)
        for i, row in enumerate(rows):
            row.exp_meta.policy_version = i // 10 if i < 20 else (0 if i == 35 else 3)
        buffer.store_batch(rows)
        buffer.set_policy_version(3)
        buffer.storage.forget_caches()
        sampler = RecencySampler(power=0.0, seed=4, max_staleness=0)

        def drawn_versions() -> set[int]:
            found: set[int] = set()
            for _ in range(40):
                sampler.sample(buffer.storage, 3)
                found |= {
                    r.exp_meta.policy_version for r in buffer.storage.fetch_keys(sampler.last_keys)
                }
            return found

        assert drawn_versions() == {3}
        late = make_rows(4)
        for i, row in enumerate(late):
            row.exp_meta.policy_version = 1 if i == 1 else 3
        buffer.store_batch(late)
        assert drawn_versions() == {3}
        assert _holds_no_index(buffer)


def test_recency_with_gaps_uses_the_key_index(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(60))
    buffer.delete(QueryBuilder().eq("exp_meta.step", 3).build())
    buffer.storage.forget_caches()
    RecencySampler(seed=0).sample(buffer.storage, 3)
    assert not _holds_no_index(buffer)  # ranks are not key offsets: the index serves


def test_stratified_gives_each_group_its_share_uniformly_within(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    _gappy(buffer, db_url, buffer_name)
    index = buffer.storage.key_index(None, ("agent_id",))
    keys, agents = np.array(index["key"]), index["agent_id"].tolist()
    buffer.storage.forget_caches()
    sampler = StratifiedSampler(by="exp_meta.agent_id", seed=8)
    drawn = []
    for _ in range(200):
        sampler.sample(buffer.storage, 7, None)  # 3 groups: 2 each, one more for one
        batch = sampler.last_keys
        shares = sorted(agents[int(np.searchsorted(keys, k))] for k in batch.tolist())
        per = {a: shares.count(a) for a in set(agents)}
        assert sorted(per.values()) == [2, 2, 3]
        drawn.append(batch)
    assert _holds_no_index(buffer)
    drawn_all = np.concatenate(drawn)
    for agent in set(agents):
        mine = keys[[a == agent for a in agents]]
        counts = np.array([(drawn_all == k).sum() for k in mine])
        assert chi_square_p(counts, np.ones(len(mine))) > P_MIN


@pytest.mark.parametrize("narrowed", ["condition", "max_staleness", "consume_after"])
def test_stratified_under_a_condition_or_staleness_draws_over_the_key_space(
    buffer: ReplayBuffer, narrowed: str
) -> None:
    """The groups are the values the matching rows hold: agent 3's rows are all left out
    (filtered, stale or spent), so it gets no share; the others an equal one each, uniform
    within, and no key index is read."""
    rows = make_rows(80, agents=4)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 0 if i % 4 == 3 or i < 16 else 1
    buffer.store_batch(rows)
    buffer.set_policy_version(1)
    index = buffer.storage.key_index(None, ("agent_id", "policy_version"))
    keys, agents = np.array(index["key"]), np.array(index["agent_id"].tolist())
    versions = np.array(index["policy_version"])
    cond, options = None, {}
    matching = agents != "agent3"
    if narrowed == "condition":
        cond = QueryBuilder().ne("exp_meta.agent_id", "agent3").build()
    elif narrowed == "max_staleness":
        options, matching = {"max_staleness": 0}, versions == 1
    else:
        options = {"consume_after": 1}
        buffer.storage.count_draws(keys[agents == "agent3"], 1)
    buffer.storage.forget_caches()
    sampler = StratifiedSampler(by="exp_meta.agent_id", seed=9, **options)
    drawn = []
    for _ in range(1 if narrowed == "consume_after" else 150):
        sampler.sample(buffer.storage, 6, cond)  # 3 groups: 2 each
        at = np.searchsorted(keys, sampler.last_keys)
        assert matching[at].all()
        assert sorted(Counter(agents[at].tolist()).values()) == [2, 2, 2]
        drawn.append(sampler.last_keys)
    assert _holds_no_index(buffer)
    if narrowed != "consume_after":
        drawn_all = np.concatenate(drawn)
        for agent in ("agent0", "agent1", "agent2"):
            mine = keys[(agents == agent) & matching]
            counts = np.array([(drawn_all == k).sum() for k in mine])
            assert chi_square_p(counts, np.ones(len(mine))) > P_MIN


def test_stratified_finds_a_groups_matching_rows_past_its_first_rows(buffer: ReplayBuffer) -> None:
    """Each agent's first rows match nothing (a condition no index covers): the values
    held are found as far as it takes, without a key index."""
    buffer.store_batch(make_rows(40, agents=2))
    buffer.storage.forget_caches()
    late = QueryBuilder().gte("exp_data.state.i", 30).build()
    sampler = StratifiedSampler(by="exp_meta.agent_id", seed=10)
    sampler.sample(buffer.storage, 4, late)
    assert _holds_no_index(buffer)
    drawn = buffer.storage.fetch_keys(sampler.last_keys)
    assert all(r.exp_data.state["i"] >= 30 for r in drawn)
    assert sorted(r.exp_meta.agent_id for r in drawn) == ["agent0", "agent0", "agent1", "agent1"]


def test_stratified_keeps_the_values_held_up_to_date(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values the matching rows hold are kept from draw to draw: a value whose rows
    all went stale loses its share, and gains it again from a row written since; values
    whose rows still match are not looked for again."""
    from expstore.storage.key_space import SqlKeySpace as KeySpace

    looked: list[tuple[str, int]] = []
    first_matching = KeySpace.first_matching

    def counted(space: KeySpace, name: str, value: Any, start: int) -> int | None:
        looked.append((value, start))
        return first_matching(space, name, value, start)

    monkeypatch.setattr(KeySpace, "first_matching", counted)
    rows = make_rows(40, agents=2)
    for i, row in enumerate(rows):
        row.exp_meta.policy_version = 0 if i < 20 else 1
        if i < 20 and i % 3 == 2:
            row.exp_meta.agent_id = "agent2"  # agent2: version 0 alone
    buffer.store_batch(rows)
    buffer.set_policy_version(1)
    last = int(_keys(buffer)[-1])
    buffer.storage.forget_caches()
    cond = QueryBuilder().gte("exp_data.state.i", 10).build()
    sampler = StratifiedSampler(by="exp_meta.agent_id", seed=4, max_staleness=1)

    def shares() -> dict[str, int]:
        sampler.sample(buffer.storage, 6, cond)
        drawn = buffer.storage.fetch_keys(sampler.last_keys)
        current = buffer.policy_version()
        assert all(r.exp_data.state["i"] >= 10 for r in drawn)
        assert all(r.exp_meta.policy_version >= current - 1 for r in drawn)
        return dict(Counter(r.exp_meta.agent_id for r in drawn))

    assert shares() == {"agent0": 2, "agent1": 2, "agent2": 2}
    assert len(looked) == 3
    looked.clear()
    assert shares() == {"agent0": 2, "agent1": 2, "agent2": 2}  # from what was found
    assert looked == []
    buffer.set_policy_version(2)  # version 0 goes stale: agent2's rows with it
    assert shares() == {"agent0": 3, "agent1": 3}
    assert {v for v, _ in looked} == {"agent0", "agent1", "agent2"}  # their rows went stale
    looked.clear()
    new = make_rows(1)
    new[0].exp_meta.agent_id, new[0].exp_meta.policy_version = "agent2", 2
    new[0].exp_data.state["i"] = 50
    buffer.store_batch(new)
    assert shares() == {"agent0": 2, "agent1": 2, "agent2": 2}
    assert [v for v, _ in looked] == ["agent2"]  # among the row written since alone
    assert looked[0][1] > last
    assert _holds_no_index(buffer)


def test_the_values_held_are_found_under_the_version_the_draw_read(
    buffer: ReplayBuffer, db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process moves the policy version on during a draw, then sets it back: what
    the draw found is kept under the version it read first, so it must have been found
    under that version (one snapshot), or a value would lose its share for good (found
    by review)."""
    from expstore.storage.key_space import SqlKeySpace as KeySpace

    buffer.store_batch([make_row("t", "agent0", i, version=5) for i in range(10)])
    buffer.store_batch([make_row("t", "agent1", i, version=8) for i in range(10)])
    buffer.set_policy_version(5)
    first_matching = KeySpace.first_matching
    with ReplayBuffer(db_url, name=buffer_name) as other:
        moves = [lambda: other.set_policy_version(8)]

        def moved(space: KeySpace, name: str, value: Any, start: int) -> int | None:
            if moves:
                moves.pop()()
            return first_matching(space, name, value, start)

        monkeypatch.setattr(KeySpace, "first_matching", moved)
        sampler = StratifiedSampler(by="exp_meta.agent_id", seed=0, max_staleness=1)
        sampler.sample(buffer.storage, 4)
        assert not moves
        other.set_policy_version(5, force=True)
    for _ in range(3):
        sampler.sample(buffer.storage, 4)
        drawn = buffer.storage.fetch_keys(sampler.last_keys)
        assert Counter(r.exp_meta.agent_id for r in drawn) == {"agent0": 2, "agent1": 2}


def test_the_same_seed_gives_the_same_batches_over_the_key_space(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(80, agents=4))
    cond = QueryBuilder().eq("exp_meta.agent_id", "agent2").build()
    for make in (
        lambda: UniformSampler(seed=9),
        lambda: PrioritizedSampler(seed=9),
        lambda: RecencySampler(seed=9),
        lambda: StratifiedSampler(seed=9),
    ):
        a, b = make(), make()
        condition = cond if isinstance(a, UniformSampler) else None
        first = _draw(buffer, a, 5, 8, condition)
        assert np.array_equal(first, _draw(buffer, b, 5, 8, condition))


@pytest.mark.parametrize("length", [1, 3])
def test_slice_windows_over_the_key_space_are_uniform_over_every_window(
    buffer: ReplayBuffer, db_url: str, buffer_name: str, length: int
) -> None:
    from expstore.samplers import SliceSampler
    from tests.helpers import make_row

    # Trajectories with a gap, a repeated step, one too short, another agent's steps in
    # the same task (split by traj_key), a step the condition leaves out, and another
    # buffer's rows between them: the same windows as the key index finds.
    rows = [make_row("long", "a", s, reward=0.0) for s in range(12)]
    rows += [make_row("gap", "a", s, reward=0.0) for s in (0, 1, 2, 3, 5, 6, 7, 8)]
    rows += [make_row("twice", "a", s, reward=0.0) for s in (0, 1, 2, 2, 3, 4, 5)]
    rows += [make_row("thrice", "a", s, reward=0.0) for s in (0, 1, 1, 1, 2, 3)]
    rows += [make_row("short", "a", s, reward=0.0) for s in range(2)]
    rows += [make_row("long", "b", s, reward=0.0) for s in range(4)]
    rows += [make_row("cut", "a", s, reward=-1.0 if s == 4 else 0.0) for s in range(9)]
    with ReplayBuffer(db_url, name=buffer_name + "_other") as other:
        for at in range(0, len(rows), 8):
            buffer.store_batch(rows[at : at + 8])
            other.store_batch(make_rows(3))
    cond = QueryBuilder().gte("exp_data.reward_t", 0).build()
    index = SliceSampler(length, traj_key=("task_id", "agent_id"), seed=0)
    every = {tuple(w) for w in _windows(index, buffer, cond)}
    buffer.storage.forget_caches()
    sampler = SliceSampler(length, traj_key=("task_id", "agent_id"), seed=1)
    drawn = _draw(buffer, sampler, 120, 10 * length, cond).reshape(-1, length).tolist()
    drawn = [tuple(w) for w in drawn]
    assert _holds_no_index(buffer)  # drawn over the key space
    assert set(drawn) <= every and len(set(drawn)) == len(every)
    windows = sorted(every)
    counts = np.array([drawn.count(w) for w in windows])
    assert chi_square_p(counts, np.ones(len(windows))) > P_MIN


def _windows(sampler, buffer: ReplayBuffer, cond) -> list[list[int]]:
    """Every window the key index path can draw (the one starting at each row that starts
    one, by the key index held in memory)."""
    index = buffer.storage.key_index(cond, sampler.index_columns())
    space = sampler.index_space(index, cond)
    table = space.windows(sampler.traj_key, "step", index, sampler.slice_len)
    return [window for window in table.tolist() if window[0] >= 0]


def test_slice_over_the_key_space_gives_up_for_the_key_index_when_windows_are_rare(
    buffer: ReplayBuffer,
) -> None:
    from expstore.samplers import SliceSampler
    from tests.helpers import make_row

    # 400 tasks of one step and one task of 4 steps: 1 row in 101 starts a window.
    buffer.store_batch([make_row(f"one{i}", "a", 0) for i in range(400)])
    buffer.store_batch([make_row("four", "a", s) for s in range(4)])
    sampler = SliceSampler(4, seed=0)
    got = sampler.sample(buffer.storage, 8, None)
    assert [r.exp_meta.task_id for r in got] == ["four"] * 8
    assert [r.exp_meta.step for r in got] == [0, 1, 2, 3] * 2


@pytest.mark.parametrize("flat", [True, False], ids=["key space", "key index"])
def test_slices_at_the_largest_steps_a_row_can_have(buffer: ReplayBuffer, flat: bool) -> None:
    from expstore.samplers import SliceSampler
    from tests.helpers import make_row

    top = 2**63 - 1
    buffer.store_batch([make_row("end", "a", s) for s in (top - 2, top - 1, top)])
    sampler = SliceSampler(2, seed=0)
    sampler.flat = flat
    got = sampler.sample(buffer.storage, 8, None)
    steps = [r.exp_meta.step for r in got]
    assert set(zip(steps[::2], steps[1::2], strict=True)) <= {(top - 2, top - 1), (top - 1, top)}


@pytest.mark.parametrize("flat", [True, False], ids=["key space", "key index"])
def test_slices_of_an_empty_buffer_say_it_is_empty_before_the_batch_size(
    buffer: ReplayBuffer, flat: bool
) -> None:
    from expstore.errors import InvalidArgumentError
    from expstore.samplers import SliceSampler
    from tests.helpers import make_row

    sampler = SliceSampler(2, seed=0)
    sampler.flat = flat
    with pytest.raises(EmptyBufferError):
        sampler.sample(buffer.storage, 5, None)
    buffer.store_batch([make_row("t", "a", s) for s in range(3)])
    with pytest.raises(InvalidArgumentError, match="multiple of 2"):
        sampler.sample(buffer.storage, 5, None)
