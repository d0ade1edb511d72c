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

from expstore import ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import (
    LatestSampler,
    RecencySampler,
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
