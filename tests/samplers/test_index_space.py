"""IndexKeySpace: the key index held in memory answers as the database's key space does.

A sampler is written once (``choose_flat``); over a key index it runs over an
IndexKeySpace. Each primitive a sampler asks of it gives the database's answer for the same
rows, and the samplers' draws over either space follow the same distribution.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from expstore import GroupSampler, GroupStat, ReplayBuffer
from expstore.group_summaries import GroupSpec
from expstore.query import QueryBuilder
from expstore.samplers import (
    LatestSampler,
    RecencySampler,
    SliceSampler,
    StalenessAwareSampler,
    StratifiedSampler,
)
from expstore.samplers.index_space import IndexKeySpace
from expstore.samplers.state import DerivedArrays
from expstore.storage.base import KeySpace
from tests.helpers import make_row
from tests.samplers.stats import chi_square_p

P_MIN = 1e-3
COLUMNS = ("task_id", "agent_id", "step", "policy_version")


def _fill(buffer: ReplayBuffer) -> None:
    """48 rows: tasks t0-t5 of 8 steps, agents a0-a2 (task by task), versions 0-5; task t4
    misses step 3 (a gap), and t5 repeats step 2."""
    rows = []
    for i in range(48):
        task = i // 8
        step = i % 8
        if task == 4 and step == 3:
            step = 9
        if task == 5 and step == 3:
            step = 2
        rows.append(make_row(f"t{task}", f"a{task % 3}", step, version=task, reward=float(i)))
    buffer.store_batch(rows)
    buffer.set_policy_version(5)


def _both(
    buffer: ReplayBuffer,
    ask: Callable[[KeySpace], Any],
    condition: Any = None,
    max_staleness: int | None = None,
) -> tuple[Any, Any]:
    """``ask`` over the database's key space and over the matching rows' key index."""
    storage = buffer.storage
    by_database = storage.key_space(condition, ask, max_staleness=max_staleness)
    index = storage.key_index(condition, COLUMNS)
    if max_staleness is not None:
        keep = index["policy_version"] >= 5 - max_staleness
        index = {k: v[keep] for k, v in index.items() if isinstance(v, np.ndarray)}
    listed = IndexKeySpace(
        index, DerivedArrays(), query_condition=condition, max_staleness=max_staleness
    )
    return by_database, ask(listed)


AGENT_1 = QueryBuilder().eq("exp_meta.agent_id", "a1").build()


@pytest.mark.parametrize(("condition", "max_staleness"), [(None, None), (AGENT_1, None), (None, 2)])
def test_first_matching_finds_the_databases_row(
    buffer: ReplayBuffer, condition: Any, max_staleness: int | None
) -> None:
    _fill(buffer)
    keys = np.array(buffer.storage.key_index(None)["key"])

    def ask(space: KeySpace) -> list[int | None]:
        return [
            space.first_matching(name, value, int(start))
            for name, values in (("agent_id", ["a0", "a1", "a2", "a9"]), ("task_id", ["t1", "t4"]))
            for value in values
            for start in (keys[0], keys[10], keys[30], keys[-1] + 1)
        ]

    by_database, listed = _both(buffer, ask, condition, max_staleness)
    assert by_database == listed
    assert any(k is not None for k in listed) and None in listed


@pytest.mark.parametrize(("condition", "max_staleness"), [(None, None), (AGENT_1, None), (None, 2)])
def test_count_by_counts_the_matching_rows_as_the_database(
    buffer: ReplayBuffer, condition: Any, max_staleness: int | None
) -> None:
    _fill(buffer)

    def ask(space: KeySpace) -> list[dict[Any, int]]:
        return [
            space.count_by("agent_id", ["a0", "a1", "a2", "a9"]),
            space.count_by("task_id", ["t0", "t3", "t5"]),
        ]

    by_database, listed = _both(buffer, ask, condition, max_staleness)
    assert by_database == listed
    assert listed[0]


def test_rows_of_lists_rows_value_by_value_in_order_as_the_database(buffer: ReplayBuffer) -> None:
    _fill(buffer)

    def ask(space: KeySpace) -> list[list[int]]:
        return [
            space.rows_of("task_id", ["t5", "t0", "t4"], ("step",)).tolist(),
            space.rows_of("agent_id", ["a2"], ()).tolist(),
        ]

    by_database, listed = _both(buffer, ask)
    assert by_database == listed
    assert len(listed[0]) == 24


@pytest.mark.parametrize(("condition", "max_staleness"), [(None, None), (AGENT_1, None), (None, 2)])
def test_in_ranges_finds_the_rows_of_each_span_as_the_database(
    buffer: ReplayBuffer, condition: Any, max_staleness: int | None
) -> None:
    _fill(buffer)
    spans = [(("t1",), 2, 5), (("t4",), 0, 9), (("t5",), 2, 2), (("t9",), 0, 9), (("t3",), 7, 7)]

    def ask(space: KeySpace) -> list[tuple[Any, ...]]:
        return sorted(space.in_ranges(("task_id",), "step", spans))

    by_database, listed = _both(buffer, ask, condition, max_staleness)
    assert by_database == listed
    assert listed

    def ask_two(space: KeySpace) -> list[tuple[Any, ...]]:  # a trajectory by two columns
        spans = [(("t1", "a1"), 0, 3), (("t1", "a0"), 0, 3), (("t2", "a2"), 1, 6)]
        return sorted(space.in_ranges(("task_id", "agent_id"), "step", spans))

    by_database, listed = _both(buffer, ask_two, condition, max_staleness)
    assert by_database == listed


def test_distinct_lists_the_values_the_database_lists(buffer: ReplayBuffer) -> None:
    _fill(buffer)
    by_database, listed = _both(buffer, lambda space: space.distinct("agent_id"))
    assert by_database is not None and listed is not None
    assert sorted(by_database) == sorted(listed) == ["a0", "a1", "a2"]


def _draws(
    buffer: ReplayBuffer, make: Callable[[], Any], flat: bool, calls: int, batch: int, **kw: Any
) -> list[int]:
    sampler = make()
    sampler.flat = flat
    drawn: list[int] = []
    for _ in range(calls):
        sampler.sample(buffer.storage, batch, **kw)
        drawn += sampler.last_keys.tolist()
    return drawn


def test_latest_gives_the_same_rows_over_either_space(buffer: ReplayBuffer) -> None:
    _fill(buffer)
    for batch in (1, 5, 48, 60):
        over = [_draws(buffer, LatestSampler, flat, 1, batch) for flat in (True, False)]
        assert over[0] == over[1]
        assert over[0] == sorted(over[0], reverse=True)


def test_recency_follows_the_same_distribution_over_either_space(buffer: ReplayBuffer) -> None:
    _fill(buffer)
    keys = np.array(buffer.storage.key_index(None)["key"])
    weights = np.arange(1, 49, dtype=np.float64) ** 2.0
    for flat in (True, False):
        # The first row of each batch follows the weights exactly.
        firsts = [
            _draws(buffer, lambda s=s: RecencySampler(power=2.0, seed=s), flat, 1, 4)[0]
            for s in range(1500)
        ]
        counts = np.array([firsts.count(k) for k in keys])
        assert chi_square_p(counts, weights) > P_MIN


def test_staleness_follows_the_same_distribution_over_either_space(buffer: ReplayBuffer) -> None:
    _fill(buffer)
    # Rows without a version count as fresh (weight 1) however far behind the rest are.
    buffer.store_batch([make_row("unversioned", "a0", i) for i in range(8)])
    buffer.set_policy_version(8)
    keys = np.array(buffer.storage.key_index(None)["key"])
    versions = np.repeat(np.arange(6), 8)
    weights = np.concatenate([1.0 / (8 - versions + 1.0), np.ones(8)])
    for flat in (True, False):
        drawn = _draws(buffer, lambda: StalenessAwareSampler(seed=1), flat, 40, 256)
        counts = np.array([drawn.count(k) for k in keys])
        assert chi_square_p(counts, weights) > P_MIN
        assert chi_square_p(counts, np.ones(56)) < 1e-6


def test_stratified_gives_each_group_its_share_over_either_space(buffer: ReplayBuffer) -> None:
    _fill(buffer)
    buffer.store_batch([make_row("rare", "a9", 0, version=5)])
    keys = buffer.storage.key_index(None, ("agent_id",))
    agent_of = dict(zip(keys["key"].tolist(), keys["agent_id"].tolist(), strict=True))
    for flat in (True, False):
        for condition in (None, QueryBuilder().ne("exp_meta.agent_id", "a0").build()):
            drawn = _draws(
                buffer,
                lambda: StratifiedSampler(by="exp_meta.agent_id", seed=2),
                flat,
                1,
                36,
                query_condition=condition,
            )
            groups = Counter(agent_of[k] for k in drawn)
            expected = ["a1", "a2", "a9"] if condition is not None else ["a0", "a1", "a2", "a9"]
            assert sorted(groups) == expected
            assert set(groups.values()) == {36 // len(expected)}


TRAJECTORIES = [("task_id",), ("task_id", "agent_id"), ("agent_id",)]


@pytest.mark.parametrize(("condition", "max_staleness"), [(None, None), (AGENT_1, None), (None, 2)])
def test_runs_and_windows_are_the_databases(
    buffer: ReplayBuffer, condition: Any, max_staleness: int | None
) -> None:
    _fill(buffer)
    # Every row of the buffer, matching or not (0 rows in its run: not a matching row).
    every = buffer.storage.key_index(None, COLUMNS)
    every = {k: v for k, v in every.items() if isinstance(v, np.ndarray)}

    def ask(space: KeySpace) -> list[Any]:
        found = []
        for columns in TRAJECTORIES:
            for limit in (1, 2, 3, 5, 9):
                found.append(space.runs_from(columns, "step", every, limit).tolist())
            for length in (1, 3, 6):
                found.append(space.windows(columns, "step", every, length).tolist())
        return found

    by_database, listed = _both(buffer, ask, condition, max_staleness)
    assert by_database == listed
    by_task = listed[4]  # runs by task (up to 9): t4's gap and t5's repeated step cut some
    assert 0 in by_task or condition is None and max_staleness is None
    assert {8, 3} <= set(by_task)


def _groups_space(buffer: ReplayBuffer, spec: GroupSpec, condition: Any, max_staleness: Any):
    return IndexKeySpace.of_groups(
        spec,
        buffer.storage.groups(condition, spec),
        DerivedArrays(),
        query_condition=condition,
        max_staleness=max_staleness,
    )


SPECS = [
    GroupSpec("task_id", 8),
    GroupSpec("task_id", 4, GroupStat.mean("reward_t") > 20),
    GroupSpec("agent_id", 16, GroupStat.spread("reward_t") > 0),
    GroupSpec("agent_id", 12),
]


@pytest.mark.parametrize("spec", SPECS, ids=["8", "4 mean", "agent 16 spread", "agent 12"])
@pytest.mark.parametrize(("condition", "max_staleness"), [(None, None), (AGENT_1, None), (None, 2)])
def test_group_summaries_and_counts_are_the_databases(
    buffer: ReplayBuffer, spec: GroupSpec, condition: Any, max_staleness: int | None
) -> None:
    """The summaries of every group made a key space answer as the database's key space."""
    _fill(buffer)
    buffer.store_batch([make_row("t6", "a0", s, version=5, reward=1.0) for s in range(3)])
    keys = buffer.storage.key_index(None)["key"]

    def ask(space: KeySpace) -> tuple[Any, ...]:
        found = space.group_summaries(spec, keys)
        assert found is not None
        order = np.argsort(found["first"])
        summaries = {name: found[name][order].tolist() for name in sorted(found)}
        return space.group_counts(spec), summaries

    by_database = buffer.storage.key_space(condition, ask, max_staleness=max_staleness)
    listed = ask(_groups_space(buffer, spec, condition, max_staleness))
    assert by_database == listed
    assert sum(listed[0]) > 0


def test_slice_windows_follow_the_same_distribution_over_either_space(
    buffer: ReplayBuffer,
) -> None:
    _fill(buffer)
    index = buffer.storage.key_index(None, COLUMNS)
    space = IndexKeySpace(index, DerivedArrays())
    table = space.windows(("task_id",), "step", index, 3)
    windows = [tuple(w) for w in table.tolist() if w[0] >= 0]
    assert len(windows) == 6 * 6 - 3 - 3  # t4's gap and t5's repeat leave 3 fewer each
    for flat in (True, False):
        buffer.storage.forget_caches()
        sampler = SliceSampler(3, seed=7)
        sampler.flat = flat
        drawn: list[tuple[int, ...]] = []
        for _ in range(60):
            sampler.sample(buffer.storage, 3 * 20)
            drawn += [tuple(w) for w in sampler.last_keys.reshape(-1, 3).tolist()]
        assert bool(buffer.storage.index.entries) is not flat  # over the space asked for
        assert set(drawn) <= set(windows)
        counts = [drawn.count(w) for w in windows]
        assert chi_square_p(counts, np.ones(len(windows))) > P_MIN


@pytest.mark.parametrize("replacement", [False, True])
def test_group_draws_follow_the_same_distribution_over_either_space(
    buffer: ReplayBuffer, replacement: bool
) -> None:
    _fill(buffer)  # by task, 4 rows: t2-t5 fresh under max_staleness=3, all varied
    buffer.store_batch([make_row("t6", "a0", s, version=5, reward=1.0) for s in range(4)])
    buffer.store_batch([make_row("t7", "a0", s, version=5, reward=1.0) for s in range(2)])
    ready = ["t2", "t3", "t4", "t5"]  # t6's rewards are equal, t7 waits, t0-t1 stale
    for over_key_space in (True, False):
        sampler = GroupSampler(
            "task_id", 4, varied_reward=True, max_staleness=3, replacement=replacement, seed=8
        )
        if over_key_space:
            sampler.summaries_up_to = 0
        else:
            sampler.flat = False
        buffer.storage.group_index.clear()
        drawn: list[str] = []
        for _ in range(150):
            rows = buffer.sample(sampler, batch_size=8)
            names = [r.exp_meta.task_id for r in rows]
            assert len(names) == 8 and names[0] == names[3] and names[4] == names[7]
            assert replacement or names[0] != names[4]
            drawn += names[::4]
        assert bool(buffer.storage.group_index.entries) is not over_key_space
        assert sorted(set(drawn)) == ready
        assert chi_square_p([drawn.count(t) for t in ready], np.ones(4)) > P_MIN
        assert sampler.last_counts == (4, 1, 1, 2)
