"""LatestSampler: the newest matching rows."""

from __future__ import annotations

from expstore import ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import LatestSampler
from tests.helpers import make_rows


def test_returns_the_newest_rows_newest_first(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(20, tasks=2))
    rows = LatestSampler().sample(buffer.storage, 3)
    assert [r.exp_data.state["i"] for r in rows] == [19, 18, 17]
    cond = QueryBuilder().eq("exp_meta.task_id", "task0").build()
    rows = LatestSampler().sample(buffer.storage, 3, cond)
    assert [r.exp_data.state["i"] for r in rows] == [18, 16, 14]


def test_sees_rows_stored_after_the_first_call(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(5))
    sampler = LatestSampler()
    sampler.sample(buffer.storage, 2)
    newer = make_rows(2)
    buffer.store_batch(newer)
    assert [r.id for r in sampler.sample(buffer.storage, 2)] == [newer[1].id, newer[0].id]
