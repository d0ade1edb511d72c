"""torch data loading: ExperienceDataset and SampledBatches, with DataLoader workers."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from expstore import DataRow, InvalidArgumentError, ReplayBuffer, StorageError
from expstore.converters import Converter, TensorConverter
from expstore.query import QueryBuilder
from expstore.samplers import PrioritizedSampler, Sampler, UniformSampler
from expstore.torch_data import ExperienceDataset, SampledBatches
from tests.helpers import make_rows


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


class WhoConverter(Converter):
    """Records which process built the batch, and the rows' positions."""

    def to_dataset_row(self, rows: Sequence[DataRow]) -> dict[str, Any]:
        return {"pid": os.getpid(), "i": [r.exp_data.state["i"] for r in rows]}


# -- ExperienceDataset ---------------------------------------------------------------------


def test_dataset_lists_matching_rows_in_insertion_order(buffer: ReplayBuffer) -> None:
    rows = make_rows(12, tasks=3)
    buffer.store_batch(rows)
    cond = QueryBuilder().eq("exp_meta.task_id", "task1").build()
    dataset = ExperienceDataset(buffer, cond)
    assert len(dataset) == 4
    assert [dataset[i].id for i in range(4)] == [r.id for r in rows[1::3]]
    assert dataset[-1].id == rows[10].id
    assert [r.id for r in dataset.__getitems__([3, 0])] == [rows[10].id, rows[1].id]
    with pytest.raises(IndexError, match="index 4 is out of range for a dataset of 4 rows"):
        dataset[4]


def test_dataset_order_is_fixed_until_refresh(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(4))
    dataset = ExperienceDataset(buffer)
    buffer.store_batch(make_rows(2))
    assert len(dataset) == 4
    buffer.delete(QueryBuilder().eq("exp_meta.task_id", "task0").build())
    with pytest.raises(
        StorageError, match=r"deleted since it was created; call dataset.refresh\(\)"
    ):
        dataset.__getitems__([0, 1])
    dataset.refresh()
    assert len(dataset) == 4  # 6 stored, 2 of task0 deleted


def test_dataset_refuses_a_deleted_row_and_the_next_row_takes_a_key_never_given(
    buffer: ReplayBuffer,
) -> None:
    rows = make_rows(3)
    buffer.store_batch(rows)
    dataset = ExperienceDataset(buffer)
    newest_key = int(buffer.storage.key_index()["key"][-1])
    buffer.delete(QueryBuilder().eq("id", rows[2].id).build())
    newer = make_rows(1)[0]
    buffer.store(newer)
    # SQLite's rowid would be the freed key (the table's largest + 1); expstore's is new.
    assert int(buffer.storage.key_index()["key"][-1]) > newest_key
    deleted = r"1 of the rows this dataset lists were deleted since it was created; call "
    with pytest.raises(StorageError, match=deleted + r"dataset.refresh\(\)"):
        dataset[2]
    with pytest.raises(StorageError, match=deleted):
        dataset.__getitems__([0, 2, 1])
    assert dataset[-3].id == rows[0].id
    dataset.refresh()
    assert [dataset[i].id for i in range(3)] == [rows[0].id, rows[1].id, newer.id]


def test_dataset_loader_with_two_workers_yields_every_row_once(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(50, tensor=True))
    dataset = ExperienceDataset(buffer, converter=TensorConverter({"obs": "exp_data.state.obs"}))
    batches = list(dataset.loader(batch_size=8, num_workers=2))
    assert [b["obs"].shape[0] for b in batches] == [8] * 6 + [2]
    seen = torch.cat([b["obs"][:, 0] for b in batches])
    assert seen.tolist() == [float(i) for i in range(50)]


def test_dataset_loader_shuffles_with_a_plain_dataloader_too(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(20))
    dataset = ExperienceDataset(buffer, converter=WhoConverter())
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=5, shuffle=True, collate_fn=dataset.collate
    )
    seen = [i for batch in loader for i in batch["i"]]
    assert sorted(seen) == list(range(20)) and seen != list(range(20))


# -- SampledBatches ------------------------------------------------------------------------


def test_two_workers_sample_on_their_own_connections_without_duplicates(
    buffer: ReplayBuffer,
) -> None:
    buffer.store_batch(make_rows(400))
    batches = SampledBatches(buffer, UniformSampler(seed=0), 16, WhoConverter(), num_batches=10)
    got = list(batches.loader(num_workers=2))
    assert len(got) == 10
    pids = {b["pid"] for b in got}
    assert len(pids) == 2 and os.getpid() not in pids
    assert len({tuple(b["i"]) for b in got}) == 10  # no two batches alike
    by_worker = [[tuple(b["i"]) for b in got if b["pid"] == p] for p in pids]
    assert not set(by_worker[0]) & set(by_worker[1])


class OwnStreamsSampler(Sampler):
    """An AWorld-style custom sampler that keeps its own generators and no reseed()."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.py = random.Random(0)

    def sample(self, storage: Any, batch_size: int, query_condition: Any = None) -> list:
        rows = list(storage.query(query_condition))
        picks = self.rng.integers(0, len(rows), batch_size // 2).tolist()
        picks += [self.py.randrange(len(rows)) for _ in range(batch_size - len(picks))]
        return [rows[i] for i in picks]


class JitteredUniform(UniformSampler):
    """A KeySampler subclass with a generator of its own besides the sampler's stream."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.jitter = np.random.default_rng(0)

    def sample_keys(self, index: Any, batch_size: int, rng: np.random.Generator) -> Any:
        keys = index["key"]
        return keys[self.jitter.integers(0, len(keys), batch_size)]


@pytest.mark.parametrize(
    "make", [OwnStreamsSampler, lambda: JitteredUniform(seed=0)], ids=["sampler", "key_sampler"]
)
def test_a_custom_sampler_with_its_own_generators_gets_a_stream_per_worker(
    buffer: ReplayBuffer, make: Any
) -> None:
    buffer.store_batch(make_rows(400))
    batches = SampledBatches(buffer, make(), 16, WhoConverter(), num_batches=8)
    got = list(batches.loader(num_workers=2))
    assert len({b["pid"] for b in got}) == 2
    assert len({tuple(b["i"]) for b in got}) == 8  # the two workers never draw alike


def test_worker_streams_are_reproducible_under_torch_manual_seed(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(200))

    def run() -> list[tuple[int, ...]]:
        torch.manual_seed(123)
        batches = SampledBatches(buffer, UniformSampler(seed=5), 8, WhoConverter(), num_batches=4)
        return [tuple(b["i"]) for b in batches.loader(num_workers=2)]

    assert run() == run()


def test_persistent_workers_do_not_replay_their_stream_each_epoch(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(300))
    batches = SampledBatches(buffer, UniformSampler(seed=0), 8, WhoConverter(), num_batches=4)
    loader = batches.loader(num_workers=2, persistent_workers=True)
    first = [tuple(b["i"]) for b in loader]
    second = [tuple(b["i"]) for b in loader]
    assert len(set(first + second)) == 8


def test_prioritized_batches_carry_weights_and_ids_through_workers(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(64, tensor=True))
    batches = SampledBatches(
        buffer,
        PrioritizedSampler(seed=0),
        16,
        TensorConverter({"obs": "exp_data.state.obs"}),
        num_batches=4,
    )
    for batch in batches.loader(num_workers=2):
        assert batch["obs"].shape == (16, 8)
        assert batch["weights"].shape == (16,) and len(batch["ids"]) == 16


def test_spawned_workers_reopen_the_storage_from_its_url(tmp_path: Any, buffer_name: str) -> None:
    with ReplayBuffer(f"sqlite:///{tmp_path / 'spawn.db'}", name=buffer_name) as buffer:
        buffer.store_batch(make_rows(100))
        batches = SampledBatches(buffer, UniformSampler(), 8, WhoConverter(), num_batches=4)
        got = list(batches.loader(num_workers=2, multiprocessing_context="spawn"))
    assert len(got) == 4 and len({b["pid"] for b in got}) == 2


def test_without_workers_the_stream_is_the_samplers_own(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(30))
    endless = SampledBatches(buffer, UniformSampler(seed=9), 4, WhoConverter())
    first = [b["i"] for b in itertools.islice(iter(endless), 3)]
    again = SampledBatches(buffer, UniformSampler(seed=9), 4, WhoConverter())
    assert [b["i"] for b in itertools.islice(iter(again), 3)] == first
    with pytest.raises(TypeError, match="endless"):
        len(endless)
    assert len(SampledBatches(buffer, None, 4, None, num_batches=7)) == 7


def test_prefetched_batches_are_the_same_with_and_without_workers(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(60))

    def run(prefetch: int, workers: int) -> list[tuple[int, ...]]:
        torch.manual_seed(7)
        batches = SampledBatches(
            buffer, UniformSampler(seed=3), 4, WhoConverter(), num_batches=6, prefetch=prefetch
        )
        return [tuple(b["i"]) for b in batches.loader(num_workers=workers)]

    assert run(2, 0) == run(0, 0) and len(run(2, 0)) == 6
    assert run(2, 2) == run(0, 2)
    with pytest.raises(InvalidArgumentError):
        SampledBatches(buffer, prefetch=-1)


def test_an_in_memory_buffer_cannot_go_to_spawned_workers() -> None:
    with ReplayBuffer() as buffer:
        buffer.store_batch(make_rows(10))
        batches = SampledBatches(buffer, UniformSampler(), 4, WhoConverter(), num_batches=2)
        with pytest.raises(StorageError, match="cannot be shared with another process"):
            list(batches.loader(num_workers=1, multiprocessing_context="spawn"))
