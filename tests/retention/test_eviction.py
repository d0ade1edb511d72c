"""Retention (``eviction=``): what stays after each write, checked against a Python model.

Each write's eviction runs in the write's transaction, so every committed state is checked.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expstore import DataRow, ReplayBuffer, StorageError
from expstore.samplers import UniformSampler
from tests.helpers import make_row

POLICIES = ("fifo", "max_reward", "task_fifo")


@dataclass(frozen=True)
class Kept:
    key: int
    id: str
    task: str
    reward: float | None


def model_after_write(kept: list[Kept], policy: str, capacity: int) -> list[Kept]:
    """What the buffer should hold after a write, by the documented policy."""
    if len(kept) <= capacity:
        return kept
    if policy == "fifo":
        return kept[-capacity:]
    if policy == "max_reward":
        # Highest reward first, rows without a reward last, newer before older on ties.
        ranked = sorted(kept, key=lambda k: (k.reward is None, -(k.reward or 0.0), -k.key))
        survivors = {k.key for k in ranked[:capacity]}
        return [k for k in kept if k.key in survivors]
    # task_fifo: keep the most recently written tasks (by their newest row) while they fit;
    # whole tasks only.
    last_key: dict[str, int] = {}
    size: dict[str, int] = {}
    for k in kept:
        last_key[k.task] = k.key
        size[k.task] = size.get(k.task, 0) + 1
    held, kept_tasks = 0, set[str]()
    for task in sorted(last_key, key=last_key.__getitem__, reverse=True):
        held += size[task]
        if held > capacity:
            break
        kept_tasks.add(task)
    return [k for k in kept if k.task in kept_tasks]


def run_against_model(
    buffer: ReplayBuffer, batches: list[list[DataRow]], policy: str, capacity: int
) -> None:
    kept: list[Kept] = []
    keys = itertools.count()
    for batch in batches:
        buffer.store_batch(batch)
        kept += [Kept(next(keys), r.id, r.exp_meta.task_id, r.exp_data.reward_t) for r in batch]
        kept = model_after_write(kept, policy, capacity)
        stored = [r.id for r in buffer.query()]
        assert stored == [k.id for k in kept], f"after storing {[r.id for r in batch]}"
        assert len(stored) <= capacity


def random_batches(seed: int, writes: int = 14) -> list[list[DataRow]]:
    rng = np.random.default_rng(seed)
    rewards = [None, 0.0, 1.0, 1.0, 2.0, 5.0]
    step = itertools.count()
    batches = []
    for _ in range(writes):
        size = int(rng.integers(1, 7))
        batches.append(
            [
                make_row(
                    f"t{int(rng.integers(0, 6))}",
                    step=next(step),
                    reward=rewards[int(rng.integers(0, len(rewards)))],
                )
                for _ in range(size)
            ]
        )
    return batches


@pytest.mark.parametrize("policy", POLICIES)
def test_each_write_leaves_what_the_policy_says(db_url: str, buffer_name: str, policy: str) -> None:
    for seed in range(3):
        name = f"{buffer_name}_{seed}"
        with ReplayBuffer(db_url, name=name, capacity=10, eviction=policy) as buffer:
            run_against_model(buffer, random_batches(seed), policy, 10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    capacity=st.integers(1, 8),
    batches=st.lists(
        st.lists(
            st.tuples(st.sampled_from("abcd"), st.sampled_from([None, 0.0, 1.0, 3.0])),
            min_size=1,
            max_size=5,
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_retention_matches_the_model_for_any_writes(
    policy: str, capacity: int, batches: list[list[tuple[str, float | None]]]
) -> None:
    rows = [[make_row(task, reward=reward) for task, reward in batch] for batch in batches]
    with ReplayBuffer(capacity=capacity, eviction=policy) as buffer:  # in-memory SQLite
        run_against_model(buffer, rows, policy, capacity)


def test_fifo_drops_the_oldest_rows(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=3) as buffer:  # fifo is the default
        rows = [make_row("t", step=i) for i in range(5)]
        for row in rows:
            buffer.store(row)
        assert [r.id for r in buffer.query()] == [r.id for r in rows[2:]]


def test_max_reward_keeps_the_best_rows_and_breaks_ties_by_recency(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=3, eviction="max_reward") as buffer:
        old_one, none, best, new_one, low = (
            make_row("t", reward=1.0),
            make_row("t", reward=None),
            make_row("t", reward=9.0),
            make_row("t", reward=1.0),
            make_row("t", reward=-5.0),
        )
        buffer.store_batch([old_one, none, best])
        assert {r.id for r in buffer.query()} == {old_one.id, none.id, best.id}
        buffer.store_batch([new_one, low])  # the row without a reward goes, then the lowest
        assert {r.id for r in buffer.query()} == {best.id, new_one.id, old_one.id}
        buffer.store(make_row("t", reward=2.0))  # of the two 1.0 rows, the older goes
        assert sorted(r.exp_data.reward_t or 0.0 for r in buffer.query()) == [1.0, 2.0, 9.0]
        assert new_one.id in {r.id for r in buffer.query()}


def test_task_fifo_evicts_whole_tasks_oldest_first(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=5, eviction="task_fifo") as buffer:
        buffer.store_batch([make_row("a", step=i) for i in range(3)])
        buffer.store_batch([make_row("b", step=i) for i in range(2)])
        buffer.store_batch([make_row("c", step=0)])  # 6 rows: task a (oldest) goes whole
        assert sorted({r.exp_meta.task_id for r in buffer.query()}) == ["b", "c"]
        assert len(buffer) == 3
        for task in ("b", "c"):
            assert len(buffer.get_by_task_id(task)) == {"b": 2, "c": 1}[task]


def test_task_fifo_never_evicts_the_task_being_written(db_url: str, buffer_name: str) -> None:
    """Two tasks written a step at a time: the one written least recently goes whole, the
    rows just stored always stay."""
    with ReplayBuffer(db_url, name=buffer_name, capacity=4, eviction="task_fifo") as buffer:
        for step in range(3):
            for task in ("a", "b"):
                row = make_row(task, step=step)
                buffer.store(row)
                assert row.id in {r.id for r in buffer.query()}
                assert len(buffer) <= 4
        # After a2 (5 rows): b, written before a2, went whole; then b2 started b again.
        held = {t: [r.exp_meta.step for r in buffer.get_by_task_id(t)] for t in ("a", "b")}
        assert held == {"a": [0, 1, 2], "b": [2]}


def test_a_failed_write_evicts_nothing(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=3) as buffer:
        rows = [make_row("t", step=i) for i in range(3)]
        buffer.store_batch(rows)
        with pytest.raises(StorageError, match="already stored"):
            buffer.store_batch([make_row("t", step=9), rows[0]])  # rows[0]'s id is taken
        assert [r.id for r in buffer.query()] == [r.id for r in rows]


def test_samplers_never_return_evicted_rows(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=10) as buffer:
        sampler = UniformSampler(seed=0)
        for start in range(0, 40, 5):
            buffer.store_batch([make_row("t", step=start + i) for i in range(5)])
            steps = {r.exp_meta.step for r in sampler.sample(buffer.storage, 30)}
            assert min(steps) >= max(0, start + 5 - 10)


def test_a_handle_without_capacity_evicts_by_the_buffers_retention(
    db_url: str, buffer_name: str
) -> None:
    """Capacity and eviction live with the buffer: an actor that opens it without them
    still evicts, so the buffer never outgrows what the trainer asked for."""
    with (
        ReplayBuffer(db_url, name=buffer_name, capacity=5, eviction="max_reward") as trainer,
        ReplayBuffer(db_url, name=buffer_name) as actor,
    ):
        assert (actor.storage.capacity, actor.storage.eviction) == (5, "max_reward")
        actor.store_batch([make_row("t", step=i, reward=float(i)) for i in range(50)])
        assert len(trainer) == 5
        assert sorted(r.exp_data.reward_t for r in trainer.query()) == [45, 46, 47, 48, 49]


@pytest.mark.parametrize(
    ("asked", "shown"),
    [
        ({"capacity": 6}, "capacity=6"),
        ({"eviction": "task_fifo"}, "eviction='task_fifo'"),
        ({"capacity": 5, "eviction": "max_reward"}, "capacity=5, eviction='max_reward'"),
    ],
)
def test_a_handle_asking_for_another_retention_is_refused(
    db_url: str, buffer_name: str, asked: dict[str, object], shown: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=5) as first:
        first.store_batch([make_row("t", step=i) for i in range(5)])
        message = (
            rf"buffer '{buffer_name}' keeps capacity=5 with eviction='fifo'.*asked for "
            rf"{re.escape(shown)}\. Open it without capacity=/eviction=.*set_retention"
        )
        with pytest.raises(ValueError, match=message):
            ReplayBuffer(db_url, name=buffer_name, **asked)  # type: ignore[arg-type]
        with ReplayBuffer(db_url, name=buffer_name, capacity=5, eviction="fifo") as same:
            assert len(same) == 5  # the same retention, spelled out, is fine
        assert len(first) == 5 and first.storage.capacity == 5


def test_set_retention_changes_it_for_every_writer_and_evicts_now(
    db_url: str, buffer_name: str
) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name, capacity=10) as one,
        ReplayBuffer(db_url, name=buffer_name) as other,
    ):
        one.store_batch([make_row("t", step=i, reward=float(-i)) for i in range(10)])
        assert other.set_retention(4, "max_reward") == 6
        assert sorted(r.exp_meta.step for r in one.query()) == [0, 1, 2, 3]
        # The first handle, opened with capacity=10 and fifo, now writes by the new rules.
        one.store(make_row("t", step=10, reward=-100.0))
        assert sorted(r.exp_meta.step for r in one.query()) == [0, 1, 2, 3]
        assert (one.storage.capacity, one.storage.eviction) == (4, "max_reward")
        with ReplayBuffer(db_url, name=buffer_name, capacity=4, eviction="max_reward"):
            pass  # what it keeps now
        assert one.set_retention(None) == 0  # unlimited, eviction kept
        one.store_batch([make_row("u", step=i) for i in range(6)])
        assert len(other) == 10
        with pytest.raises(ValueError, match="capacity must be None or an int >= 1, got 0"):
            one.set_retention(0)
        with pytest.raises(ValueError, match="eviction must be one of"):
            one.set_retention(3, "lifo")
        assert len(other) == 10


def test_retention_reads_back_what_set_retention_set(db_url: str, buffer_name: str) -> None:
    """One way to read the setting, for every handle: ``retention()``."""
    from expstore.retention.capacity import RetentionSetting

    with (
        ReplayBuffer(db_url, name=buffer_name) as buf,
        ReplayBuffer(db_url, name=buffer_name) as other,
    ):
        assert buf.retention() == RetentionSetting(None, "fifo", None, 100_000)
        buf.set_retention(50, "stale", stale_after=3, tombstones=10)
        assert other.retention() == RetentionSetting(50, "stale", 3, 10)
        buf.set_retention(None)  # unlimited; the policy and its k stay
        assert other.retention() == RetentionSetting(None, "stale", 3, 10)
        with pytest.raises(ValueError, match="stale_after"):
            buf.set_retention(10, "stale", stale_after=-1)
        assert other.retention() == RetentionSetting(None, "stale", 3, 10)  # nothing changed
