"""RandomTaskSampler and ReplayBuffer.sample_task."""

from __future__ import annotations

import numpy as np

from expstore import RateLimiter, ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import RandomTaskSample, RandomTaskSampler
from tests.helpers import make_row
from tests.samplers.stats import chi_square_p


def _store_uneven_tasks(buffer: ReplayBuffer) -> None:
    rows = [make_row("big", "a1", s) for s in range(40)]
    rows += [make_row("mid", "a2", s) for s in range(5)]
    rows += [make_row("small", "a1", 0)]
    buffer.store_batch(rows)


def test_each_task_is_equally_likely_whatever_its_row_count(buffer: ReplayBuffer) -> None:
    _store_uneven_tasks(buffer)
    sampler = RandomTaskSampler(seed=0)
    tasks = ["big", "mid", "small"]
    counts = dict.fromkeys(tasks, 0)
    for _ in range(3000):
        (task,) = sampler.sample_task_ids(buffer.storage, 1)
        counts[task] += 1
    assert chi_square_p([counts[t] for t in tasks], np.ones(3)) > 1e-3


def test_a_batch_larger_than_the_tasks_returns_each_task_once(buffer: ReplayBuffer) -> None:
    _store_uneven_tasks(buffer)
    ids = RandomTaskSample(seed=0).sample_task_ids(buffer.storage, 1000)
    assert sorted(ids) == ["big", "mid", "small"]


def test_the_alias_is_the_same_class() -> None:
    assert RandomTaskSample is RandomTaskSampler


def test_sample_task_returns_every_row_of_chosen_tasks_in_step_order(buffer: ReplayBuffer) -> None:
    rows = [make_row("t1", "a1", s, execute_time=10.0 - s) for s in (2, 0, 1)]
    rows += [make_row("t1", "a2", 1, execute_time=0.5)]  # same step, earlier time
    rows += [make_row("t2", "a2", s) for s in range(3)]
    buffer.store_batch(rows)
    cond = QueryBuilder().eq("exp_meta.agent_id", "a1").build()  # matches t1 only
    (task_rows,) = buffer.sample_task(query_condition=cond, batch_size=5)
    assert len(task_rows) == 4  # all of t1's rows, not only those of a1
    assert [(r.exp_meta.step, r.exp_meta.agent_id) for r in task_rows] == [
        (0, "a1"),
        (1, "a2"),
        (1, "a1"),
        (2, "a1"),
    ]


def test_sample_tasks_groups_rows_in_the_order_tasks_were_chosen(buffer: ReplayBuffer) -> None:
    _store_uneven_tasks(buffer)
    sampler = RandomTaskSampler(seed=3)
    grouped = sampler.sample_tasks(buffer.storage, 2)
    assert len(grouped) == 2
    assert all(all(r.exp_meta.task_id == t for r in rs) for t, rs in grouped.items())
    flat = RandomTaskSampler(seed=3).sample(buffer.storage, 2)
    assert [r.id for r in flat] == [r.id for rs in grouped.values() for r in rs]


def _many_uneven_tasks(buffer: ReplayBuffer) -> list[str]:
    sizes = [1, 2, 3, 5, 8, 13, 21, 1, 4, 9]
    rows = [make_row(f"t{i}", f"a{i % 2}", s) for i, n in enumerate(sizes) for s in range(n)]
    buffer.store_batch(rows[::-1])  # insertion order unlike step order
    return [f"t{i}" for i in range(len(sizes))]


def test_over_the_key_space_tasks_are_equally_likely_and_whole(buffer: ReplayBuffer) -> None:
    tasks = _many_uneven_tasks(buffer)
    sampler = RandomTaskSampler(seed=1)
    counts = dict.fromkeys(tasks, 0)
    for _ in range(600):
        rows = sampler.sample(buffer.storage, 3)
        chosen = list(dict.fromkeys(r.exp_meta.task_id for r in rows))
        assert len(chosen) == 3  # distinct tasks, each whole and in step order
        for task in chosen:
            steps = [r.exp_meta.step for r in rows if r.exp_meta.task_id == task]
            assert steps == sorted(steps) == list(range(len(steps)))
            counts[task] += 1
    assert not buffer.storage.index.entries  # no key index held
    assert chi_square_p([counts[t] for t in tasks], np.ones(len(tasks))) > 1e-4


def test_over_the_key_space_the_condition_decides_which_tasks_are_eligible(
    buffer: ReplayBuffer,
) -> None:
    _many_uneven_tasks(buffer)
    cond = QueryBuilder().eq("exp_meta.agent_id", "a1").build()  # t1, t3, t5, t7, t9
    sampler = RandomTaskSampler(seed=2)
    seen: set[str] = set()
    for _ in range(100):
        rows = sampler.sample(buffer.storage, 2, cond)
        seen |= {r.exp_meta.task_id for r in rows}
    assert seen == {"t1", "t3", "t5", "t7", "t9"}
    everything = sampler.sample(buffer.storage, 50, cond)  # more than there are: all
    assert sorted({r.exp_meta.task_id for r in everything}) == sorted(seen)


def test_over_the_key_space_many_tasks_are_counted_and_read_in_chunks(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    """Task lists go to the database in chunks (a driver caps bound parameters; found by
    review on Postgres past 65,535 tasks): chunks of 4 here give the same draw."""
    from expstore.storage import Tuning

    _many_uneven_tasks(buffer)
    expected = RandomTaskSampler(seed=5).sample(buffer.storage, 6)
    with ReplayBuffer(db_url, name=buffer_name, tuning=Tuning(probe_chunk=4)) as chunked:
        rows = RandomTaskSampler(seed=5).sample(chunked.storage, 6)
        assert not chunked.storage.index.entries
    assert [r.id for r in rows] == [r.id for r in expected]
    assert len({r.exp_meta.task_id for r in rows}) == 6 and not buffer.storage.index.entries


def test_sample_task_is_counted_by_the_rate_limit_like_sample(buffer: ReplayBuffer) -> None:
    _store_uneven_tasks(buffer)  # 46 rows: 40 + 5 + 1
    buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=0.05))
    (task_rows,) = buffer.sample_task(RandomTaskSampler(seed=0), batch_size=1)
    stats = buffer.rate_limit_stats()
    assert stats is not None and stats.sampled == len(task_rows)  # each row drawn counts


def test_sample_task_rows_are_served_by_the_row_cache(buffer: ReplayBuffer) -> None:
    _store_uneven_tasks(buffer)
    first = buffer.sample_task(RandomTaskSampler(seed=0), batch_size=3)
    misses = buffer.cache_stats().misses
    assert misses == 46  # every row of the three tasks, read once
    again = buffer.sample_task(RandomTaskSampler(seed=0), batch_size=3)
    stats = buffer.cache_stats()
    assert (stats.misses, stats.hits) == (46, 46)  # then served from the cache
    assert sorted(map(len, again)) == sorted(map(len, first)) == [1, 5, 40]
