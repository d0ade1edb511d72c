"""UniformSampler: uniform draws; epochs without replacement."""

from __future__ import annotations

import numpy as np

from expstore import ReplayBuffer
from expstore.query import QueryBuilder
from expstore.samplers import UniformSampler
from tests.helpers import make_rows
from tests.samplers.stats import chi_square_p, make_index, positions


def test_with_replacement_every_row_is_equally_likely() -> None:
    index = make_index(20)
    sampler = UniformSampler(seed=0)
    drawn = positions(index, sampler.sample_keys(index, 20_000, sampler.rng))
    assert chi_square_p(np.bincount(drawn, minlength=20), np.ones(20)) > 1e-3


def test_without_replacement_each_row_once_per_epoch_across_calls(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(10))
    sampler = UniformSampler(replacement=False, seed=0)
    first_epoch = [r.id for _ in range(3) for r in sampler.sample(buffer.storage, 3)]
    last_of_epoch = sampler.sample(buffer.storage, 3)  # only one row left: a short batch
    assert len(last_of_epoch) == 1
    first_epoch += [r.id for r in last_of_epoch]
    assert sorted(first_epoch) == sorted(r.id for r in buffer.query())
    second_epoch = [r.id for _ in range(2) for r in sampler.sample(buffer.storage, 5)]
    assert sorted(second_epoch) == sorted(first_epoch)
    assert second_epoch != first_epoch  # a fresh order


def test_without_replacement_new_rows_join_the_next_epoch(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(6))
    sampler = UniformSampler(replacement=False, seed=1)
    seen = [r.id for r in sampler.sample(buffer.storage, 4)]
    extra = make_rows(3)
    buffer.store_batch(extra)
    seen += [r.id for r in sampler.sample(buffer.storage, 4)]
    assert len(seen) == 6 and not {r.id for r in extra} & set(seen)
    next_epoch = [r.id for r in sampler.sample(buffer.storage, 100)]
    assert len(next_epoch) == 9 and {r.id for r in extra} <= set(next_epoch)


def test_without_replacement_a_new_condition_starts_a_new_epoch(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(12, tasks=2))
    cond = QueryBuilder().eq("exp_meta.task_id", "task0").build()
    sampler = UniformSampler(replacement=False, seed=2)
    sampler.sample(buffer.storage, 5)
    rows = sampler.sample(buffer.storage, 100, cond)
    assert sorted(r.id for r in rows) == sorted(r.id for r in buffer.query(cond))


def test_without_replacement_rows_deleted_mid_epoch_are_skipped(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(12, tasks=2))
    sampler = UniformSampler(replacement=False, seed=3)
    seen = {r.id for r in sampler.sample(buffer.storage, 4)}
    buffer.delete(QueryBuilder().eq("exp_meta.task_id", "task1").build())
    rest = [r for r in sampler.sample(buffer.storage, 100)]
    assert all(r.exp_meta.task_id == "task0" for r in rest)
    remaining = {r.id for r in buffer.query()}
    assert remaining <= seen | {r.id for r in rest}
