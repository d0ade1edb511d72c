"""buffer.extend(columns): the same rows as store_batch of the same data, checked the same
way, in one transaction with retention and dedup, on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from expstore import (
    DataRow,
    DuplicateContentError,
    Experience,
    ExpMeta,
    InvalidArgumentError,
    ReplayBuffer,
    UnsupportedTypeError,
)
from expstore.storage.base import Storage

N = 12


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


def _columns(n: int = N, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "id": [f"r{seed}-{i}" for i in range(n)],
        "task_id": [f"env{i % 4}" for i in range(n)],
        "agent_id": "policy-7",
        "exp_meta.step": np.arange(n) // 4,
        "execute_time": 1_700_000_000.5,
        "policy_version": np.full(n, 3),
        "state": {
            "obs": rng.random((n, 3, 2), dtype=np.float32),
            "mask": torch.ones(n, 4, dtype=torch.bfloat16),
            "name": [f"s{i}" for i in range(n)],
        },
        "actions": [[{"move": int(i % 3)}] for i in range(n)],
        "reward_t": rng.normal(size=n),
        "done": np.arange(n) % 4 == 3,
        "ext_info": [{"k": i} for i in range(n)],
    }


def _as_rows(columns: dict) -> list[DataRow]:
    n = len(columns["id"])
    state = columns["state"]
    return [
        DataRow(
            id=columns["id"][i],
            exp_meta=ExpMeta(
                task_id=columns["task_id"][i],
                agent_id=columns["agent_id"],
                step=int(columns["exp_meta.step"][i]),
                execute_time=columns["execute_time"],
                policy_version=int(columns["policy_version"][i]),
            ),
            exp_data=Experience(
                state={"obs": state["obs"][i], "mask": state["mask"][i], "name": state["name"][i]},
                actions=columns["actions"][i],
                reward_t=float(columns["reward_t"][i]),
                done=bool(columns["done"][i]),
                ext_info=columns["ext_info"][i],
            ),
        )
        for i in range(n)
    ]


def _same(a: DataRow, b: DataRow) -> None:
    assert a.model_dump(exclude={"exp_data"}) == b.model_dump(exclude={"exp_data"})
    da, db = a.exp_data, b.exp_data
    for name in ("actions", "reward_t", "done", "ext_info", "adv_t", "v_t", "messages"):
        assert getattr(da, name) == getattr(db, name), name
    np.testing.assert_array_equal(da.state["obs"], db.state["obs"])
    assert da.state["obs"].dtype == db.state["obs"].dtype
    assert (
        torch.equal(da.state["mask"], db.state["mask"]) and da.state["mask"].dtype == torch.bfloat16
    )
    assert da.state["name"] == db.state["name"]


def test_extend_stores_what_store_batch_stores(buffer: ReplayBuffer, db_url: str) -> None:
    columns = _columns()
    assert buffer.extend(columns) == N
    with ReplayBuffer(db_url, name=buffer.storage.name + "_rows") as other:
        other.store_batch(_as_rows(columns))
        by_rows = {r.id: r for r in other.query()}
    got = list(buffer.query())
    assert [r.id for r in got] == columns["id"]  # in column order
    for row in got:
        _same(row, by_rows[row.id])


def test_plain_values_and_numpy_scalars_go_to_every_row(buffer: ReplayBuffer) -> None:
    assert (
        buffer.extend(
            {"task_id": "t", "agent_id": "a", "step": np.int64(2), "reward_t": [1.0, 2.0]}
        )
        == 2
    )
    rows = list(buffer.query())
    assert [(r.exp_meta.step, r.exp_data.reward_t, r.exp_data.actions) for r in rows] == [
        (2, 1.0, []),
        (2, 2.0, []),
    ]
    assert len({r.id for r in rows}) == 2  # fresh ids


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (
            {"task_id": ["a", "b"], "agent_id": "x", "step": [0, 1, 2]},
            InvalidArgumentError,
            "different lengths",
        ),
        (
            {"task_id": ["a"], "agent_id": "x", "step": 0, "bogus": [1]},
            InvalidArgumentError,
            "no field",
        ),
        ({"task_id": ["a", "b"], "agent_id": "x"}, InvalidArgumentError, r"\['step'\]"),
        ({"task_id": "a", "agent_id": "x", "step": 0}, InvalidArgumentError, "at least one column"),
        (
            {"task_id": ["a", "b"], "agent_id": "x", "step": [0, -1]},
            InvalidArgumentError,
            "column step at row 1",
        ),
        (
            {"task_id": ["a", ""], "agent_id": "x", "step": 0},
            InvalidArgumentError,
            "column task_id at row 1",
        ),
        (
            {"task_id": ["a", "b"], "agent_id": "x", "step": 0, "reward_t": [0.0, float("inf")]},
            InvalidArgumentError,
            "reward_t at row 1",
        ),
        (
            {"id": ["same", "same"], "task_id": "a", "agent_id": "x", "step": [0, 1]},
            InvalidArgumentError,
            "same id",
        ),
        (
            {"task_id": ["a"], "agent_id": "x", "step": 0, "state": {"obs": object()}},
            UnsupportedTypeError,
            "obs",
        ),
        ([("task_id", "a")], UnsupportedTypeError, "dict of columns"),
        (
            {"task_id": ["a", "b"], "agent_id": "x", "step": 0, "messages": [[1], [2]]},
            InvalidArgumentError,
            "messages at row 0",
        ),
        (
            {"task_id": ["a", "b"], "agent_id": "x", "step": 0, "ext_info": [{}, {1: "a"}]},
            InvalidArgumentError,
            "ext_info at row 1",
        ),
        (
            {"task_id": ["a", "b"], "agent_id": "x", "step": 0, "state": ["ok", "a\x00b"]},
            InvalidArgumentError,
            "state at row 1",
        ),
    ],
)
def test_bad_columns_are_refused_and_nothing_is_stored(
    buffer: ReplayBuffer, bad: object, error: type, match: str
) -> None:
    buffer.extend({"task_id": ["kept"], "agent_id": "x", "step": 0})
    with pytest.raises(error, match=match):
        buffer.extend(bad)  # type: ignore[arg-type]
    assert [r.exp_meta.task_id for r in buffer.query()] == ["kept"]


def test_retention_and_dedup_apply(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=10) as buffer:
        for seed in range(3):
            buffer.extend(_columns(8, seed))
        assert len(buffer) == 10
        again = _columns(8, 2)
        again["id"] = [i + "x" for i in again["id"]]
        assert buffer.extend(again, dedup="skip") == 0
        with pytest.raises(DuplicateContentError):
            buffer.extend(again, dedup="error")
        assert len(buffer) == 10


def test_a_storage_without_its_own_extend_builds_rows() -> None:
    assert Storage.extend is not None  # the default path, used by non-SQL storages
    from expstore.storage.sql import SqlStorage

    storage = SqlStorage("sqlite://")
    assert Storage.extend(storage, {"task_id": ["a", "b"], "agent_id": "x", "step": 0}) == 2
    assert storage.count() == 2


def test_a_singular_action_column_and_an_empty_dict_column(buffer: ReplayBuffer) -> None:
    assert (
        buffer.extend(
            {"task_id": ["a", "b"], "agent_id": "x", "step": 0, "action": [5, 6], "state": {}}
        )
        == 2
    )
    rows = list(buffer.query())
    assert [(r.exp_data.actions, r.exp_data.state) for r in rows] == [([5], {}), ([6], {})]
