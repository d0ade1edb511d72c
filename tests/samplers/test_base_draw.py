"""The sampling loop: every sampler behaves the same whatever the converter, on both backends.

Each sampler draws three batches through each converter, beside a twin with the same seed
that draws through DefaultConverter (whole rows). The rows chosen (and so the seed's
stream and any epoch), the batch sizes and the importance weights must be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from expstore import (
    ChatConverter,
    Converter,
    DefaultConverter,
    NumpyConverter,
    QueryBuilder,
    ReplayBuffer,
    TensorConverter,
    TrajectoryConverter,
    TransitionConverter,
    UniformSampler,
)
from expstore.integrations.aworld_replay import AWorldSqlStorage
from expstore.samplers.loop import SampleInfo
from tests.helpers import make_row
from tests.samplers.test_contract import SAMPLERS

CONVERTERS: dict[str, Callable[[], Converter]] = {
    "default": DefaultConverter,
    "numpy": lambda: NumpyConverter({"step": "exp_meta.step", "obs": "exp_data.state.obs"}),
    "tensor": lambda: TensorConverter({"step": "step", "obs": "state.obs", "a": "actions.0"}),
    "numpy_rows": lambda: NumpyConverter({"step": lambda row: row.exp_meta.step}),
    "transition": lambda: TransitionConverter(fields={"mc_return": "exp_data.v_t"}),
    "chat": ChatConverter,
    "trajectory": TrajectoryConverter,
}
ONE_TASK = QueryBuilder().eq("task_id", "t0").build()


def _rows(n: int = 10) -> list[Any]:
    """One task of ``n`` consecutive steps by two agents (slices need runs of one agent)."""
    return [
        make_row(
            "t0",
            f"agent{i % 2}",
            i // 2,
            reward=float(i),
            state={"obs": np.full(3, i, np.float32)},
            actions=[i],
            messages=[{"role": "user", "content": f"go {i}"}],
        )
        for i in range(n)
    ]


def _length(batch: Any) -> int:
    if isinstance(batch, list):
        return len(batch)
    if "rows" in batch:  # TrajectoryConverter
        return len(batch["rows"])
    first = next(v for k, v in batch.items() if not k.endswith("_mask") and k != "ids")
    return len(first)


@pytest.fixture(params=sorted(CONVERTERS))
def converter_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("sampler_name", sorted(SAMPLERS))
def test_every_sampler_draws_alike_through_every_converter(
    db_url: str, buffer_name: str, sampler_name: str, converter_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(_rows())
        reference, sampler = SAMPLERS[sampler_name](7), SAMPLERS[sampler_name](7)
        converter = CONVERTERS[converter_name]()
        for _ in range(3):  # an epoch of 10 rows runs out in the second batch of 8
            rows = buffer.sample(reference, ONE_TASK, DefaultConverter(), 8)
            batch = buffer.sample(sampler, ONE_TASK, converter, 8)
            expected, got = reference.last_info, sampler.last_info
            assert isinstance(got, SampleInfo) and isinstance(expected, SampleInfo)
            assert got.ids == expected.ids == [r.id for r in rows]
            assert np.array_equal(got.keys, expected.keys)
            assert _length(batch) == len(rows)
            if expected.weights is None:
                assert got.weights is None
                assert not (isinstance(batch, dict) and "weights" in batch)
            else:
                np.testing.assert_array_equal(got.weights, expected.weights)
                if isinstance(batch, dict) and converter_name != "trajectory":
                    assert np.allclose(np.asarray(batch["weights"]), expected.weights)
                    assert batch["ids"] == expected.ids


@pytest.mark.parametrize("converter_name", ["default", "numpy", "tensor"])
def test_an_epoch_without_replacement_is_whole_through_any_converter(
    db_url: str, buffer_name: str, converter_name: str
) -> None:
    """10 rows, batches of 8: an epoch is 8 then the 2 left; a new condition starts a new
    epoch (5 rows of agent0), whatever builds the batch. NumpyConverter once kept the old
    epoch across the change and gave 1 row."""
    agent0 = QueryBuilder().eq("agent_id", "agent0").build()
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(_rows())
        sampler = UniformSampler(replacement=False, seed=0)
        converter = CONVERTERS[converter_name]()
        sizes, seen = [], []
        for condition in (None, agent0, agent0, None, None):
            batch = buffer.sample(sampler, condition, converter, 8)
            sizes.append(_length(batch))
            seen.append(sampler.last_ids)
        assert sizes == [8, 5, 5, 8, 2]
        assert sorted(seen[1]) == sorted(seen[2]) == sorted(r.id for r in buffer.query(agent0))
        assert sorted(seen[3] + seen[4]) == sorted(r.id for r in buffer.query())


class _AWorldStyleSampler:
    """A sampler as AWorld writes one: only ``sample(storage, batch_size, condition)``,
    and not an expstore class."""

    def sample(self, storage: Any, batch_size: int, query_condition: Any = None) -> list[Any]:
        return storage.get_paginated(1, batch_size, query_condition)


class _AWorldStyleConverter:
    def to_dataset_row(self, rows: list[Any]) -> list[int]:
        return [r.exp_meta.step for r in rows]


def test_aworld_style_samplers_and_converters_run_in_the_loop(
    db_url: str, buffer_name: str
) -> None:
    # AWorld's samplers call AWorld's storage names: the storage that answers to them
    with ReplayBuffer(AWorldSqlStorage(db_url, name=buffer_name)) as buffer:
        buffer.store_batch(_rows())
        assert buffer.sample(_AWorldStyleSampler(), None, _AWorldStyleConverter(), 4) == [
            0,
            0,
            1,
            1,
        ]
        batch = buffer.sample(_AWorldStyleSampler(), ONE_TASK, CONVERTERS["numpy"](), 3)
        assert batch["step"].tolist() == [0, 0, 1]
        rows = buffer.sample(UniformSampler(seed=0), None, _AWorldStyleConverter(), 5)
        assert len(rows) == 5 and set(rows) <= set(range(5))


@pytest.mark.parametrize("kind", ["uniform", "slice", "group"])
def test_rows_deleted_before_every_fetch_give_a_short_batch_or_never_a_broken_unit(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # Another process deletes one chosen row between each choice and its fetch: a
    # uniform batch comes back short; windows and groups, whose layout a missing row
    # would break, are never returned broken (StorageError, as for weighted samplers).
    from expstore import GroupSampler, SliceSampler
    from expstore.errors import StorageError

    buffer = ReplayBuffer(db_url, name=buffer_name)
    rows = [make_row(f"t{t}", "a", s, reward=float(s)) for t in range(6) for s in range(4)]
    buffer.store_batch(rows)
    storage = buffer.storage
    fetch = storage.fetch

    def losing_one(keys: Any, *args: Any, **kwargs: Any) -> Any:
        return fetch(np.asarray(keys)[1:], *args, **kwargs)

    monkeypatch.setattr(storage, "fetch", losing_one)
    sampler = {
        "uniform": lambda: UniformSampler(seed=0),
        "slice": lambda: SliceSampler(2, seed=0),
        "group": lambda: GroupSampler("task_id", group_size=4, seed=0),
    }[kind]()
    if kind == "uniform":
        assert len(buffer.sample(sampler, batch_size=8)) == 7
        return
    with pytest.raises(StorageError, match="kept being deleted before they could be fetched"):
        buffer.sample(sampler, batch_size=8)
