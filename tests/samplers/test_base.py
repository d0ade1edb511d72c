"""The interfaces: incomplete subclasses fail loudly; custom samplers and converters plug in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from expstore import DataRow, EmptyBufferError, ReplayBuffer
from expstore.converters import Converter, DefaultConverter
from expstore.query import QueryCondition
from expstore.samplers import KeySampler, Sampler, TaskSampler, UniformSampler
from expstore.storage.base import Storage
from tests.helpers import make_rows


def test_incomplete_subclasses_cannot_be_created() -> None:
    class NoSample(Sampler):
        pass

    class NoKeys(KeySampler):
        pass

    class NoTaskIds(TaskSampler):
        pass

    class NoConvert(Converter):
        pass

    for cls, method in [
        (NoSample, "sample"),
        (NoKeys, "sample_keys"),
        (NoTaskIds, "sample_task_ids"),
        (NoConvert, "to_dataset_row"),
    ]:
        with pytest.raises(TypeError, match=method):
            cls()


class HighRewardSampler(KeySampler):
    """The example from KeySampler's docs: uniform over rows with reward >= threshold."""

    columns = ("reward_t",)

    def __init__(self, threshold: float, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.threshold = threshold

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        keys = index["key"][index["reward_t"] >= self.threshold]
        if not len(keys):
            raise EmptyBufferError(f"no row has reward_t >= {self.threshold}")
        return rng.choice(keys, size=batch_size)


def test_a_custom_key_sampler_overrides_only_sample_keys(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(20))  # rewards 0..19
    rows = buffer.sample(HighRewardSampler(15.0, seed=0), batch_size=50)
    assert len(rows) == 50 and {r.exp_data.reward_t for r in rows} <= {15.0, 16.0, 17.0, 18.0, 19.0}
    again = buffer.sample(HighRewardSampler(15.0, seed=0), batch_size=50)
    assert [r.id for r in again] == [r.id for r in rows]
    with pytest.raises(
        EmptyBufferError, match=r"no row has reward_t >= 99.0 in .* \(condition: none, all rows\)"
    ):
        buffer.sample(HighRewardSampler(99.0), batch_size=1)


class EveryOtherSampler(Sampler):
    """A sampler of one's own: implements sample() over the storage's public methods."""

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        return list(storage.query(query_condition))[::2][:batch_size]


class RewardSumConverter(Converter):
    """An AWorld-style converter: any batch shape it likes."""

    def to_dataset_row(self, rows: Sequence[DataRow]) -> dict[str, Any]:
        return {"n": len(rows), "reward_sum": sum(r.exp_data.reward_t or 0 for r in rows)}


def test_a_custom_sampler_and_converter_plug_into_the_buffer(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(10))
    batch = buffer.sample(EveryOtherSampler(), None, RewardSumConverter(), 3)
    assert batch == {"n": 3, "reward_sum": 0 + 2 + 4}
    # AWorld's positional order: sampler, query_condition, converter, batch_size
    rows = buffer.sample(EveryOtherSampler(), None, DefaultConverter(), 100)
    assert [r.exp_data.state["i"] for r in rows] == [0, 2, 4, 6, 8]


def test_a_custom_task_sampler_needs_only_sample_task_ids(buffer: ReplayBuffer) -> None:
    class FirstTasks(TaskSampler):
        def sample_task_ids(
            self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
        ) -> list[str]:
            return storage.task_ids(query_condition)[:batch_size]

    buffer.store_batch(make_rows(12, tasks=3))
    tasks = buffer.sample_task(FirstTasks(), None, RewardSumConverter(), 2)
    assert tasks == [{"n": 4, "reward_sum": 0 + 3 + 6 + 9}, {"n": 4, "reward_sum": 1 + 4 + 7 + 10}]


def test_buffer_sample_defaults_to_uniform_rows(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(5))
    rows = buffer.sample(batch_size=12)
    assert len(rows) == 12 and all(isinstance(r, DataRow) for r in rows)


def test_a_key_sampler_without_super_init_still_gets_a_stream(buffer: ReplayBuffer) -> None:
    class Bare(KeySampler):
        def __init__(self) -> None:  # forgot super().__init__()
            pass

        def sample_keys(
            self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
        ) -> np.ndarray:
            return rng.choice(index["key"], size=batch_size)

    buffer.store_batch(make_rows(5))
    assert len(Bare().sample(buffer.storage, 3)) == 3


def test_reseed_restarts_the_stream(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(30))
    sampler = UniformSampler(seed=1)
    first = [r.id for r in sampler.sample(buffer.storage, 5)]
    sampler.reseed(1)
    assert [r.id for r in sampler.sample(buffer.storage, 5)] == first
