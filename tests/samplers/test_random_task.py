"""RandomTaskSampler and ReplayBuffer.sample_task."""

from __future__ import annotations

import numpy as np

from expstore import ReplayBuffer
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
