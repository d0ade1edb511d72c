"""Rows a handle writes go into its row cache as a read of them would put them
(``SqlStorage._kept``): for the fields its fetches have read, decoded from the rows as
written, so a trainer that stores and samples in one process reads none of its new rows
back. What the cache then serves equals what a read gives, value for value and type for
type; the keys the write reports are the keys the rows got."""

from __future__ import annotations

from typing import Any

import numpy as np

from expstore import DataRow, ReplayBuffer
from expstore.db.row_ids import ids_to_keys
from expstore.query import QueryBuilder
from expstore.storage import writer
from tests.helpers import make_row

#: Paths of every kind: a tensor, numbers, a dict, a list's element, a key SQL cannot
#: spell (read whole by the database), columns, a payload field, absent in some rows.
PATHS = [
    "exp_data.state.obs",
    "exp_data.state.i",
    "exp_data.state.x",
    "exp_data.state.tag",
    "exp_data.state.keys",
    "exp_data.state.keys.z.0",
    "exp_data.state.tag.n.0",
    'exp_data.state.a"b',
    "exp_data.state.z",
    "exp_data.actions",
    "exp_data.messages",
    "reward_t",
    "exp_data.done",
    "exp_meta.step",
    "exp_meta.task_id",
]


def _row(i: int) -> DataRow:
    state: dict[str, Any] = {
        "obs": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
        "i": i,
        "x": [-0.0, 1e300, 2**70, float(i) / 3, float("inf"), float("nan"), 1e-7][i % 7],
        "keys": {"\u00e9": 1, "b": {"dd": [], "c": {}}, "ab": 'q"\n\\', "z": [{"y": 1, "x": 2}]},
        "tag": {"n": [i, str(i)], "zz": i % 2 == 0, "a": None},
        'a"b': np.full(3, i, np.int16),
        "z": np.array(float(i)),  # 0-d
    }
    return DataRow.model_validate(
        {
            "exp_meta": {"task_id": f"t\u00e9{i % 3}", "agent_id": "a", "step": i},
            "exp_data": {
                "state": state,
                "actions": [{"click": [i, i + 1]}] if i % 2 else [i],
                "messages": [{"role": "user", "content": f"\u6587 {i}"}],
                "reward_t": None if i % 5 == 0 else -0.0 if i % 5 == 1 else i / 7,
                "done": i % 3 == 0,
            },
        }
    )


def _plain(values: Any) -> list[Any]:
    """Values with their types spelled out, arrays as (dtype, shape, list)."""
    return [
        ("array", v.dtype.str, v.shape, v.tolist())
        if isinstance(v, np.ndarray)
        else (type(v).__name__, repr(v))
        for v in values
    ]


def _same(got: Any, want: Any) -> None:
    assert got.ids == want.ids
    for a, b in zip(got.columns, want.columns, strict=True):
        assert type(a) is type(b)
        assert _plain(a) == _plain(b)


def test_rows_written_come_from_the_cache_as_a_read_gives_them(
    db_url: str, buffer_name: str
) -> None:
    cached = ReplayBuffer(db_url, name=buffer_name)
    plain = ReplayBuffer(db_url, name=buffer_name, cache_bytes=0)
    with cached, plain:
        cached.store_batch([_row(i) for i in range(4)])
        first = list(cached.storage.key_index()["key"])
        cached.storage.fetch(first, PATHS)  # the paths this process reads, learned
        start = 4
        for n in (3, 8, 9, 5):
            cached.store_batch([_row(i) for i in range(start, start + n)])
            start += n
        keys = [k for k in cached.storage.key_index()["key"] if k not in first]
        before = cached.cache_stats()
        for writable in (True, False):
            got = cached.storage.fetch(keys, PATHS, writable=writable)
            _same(got, plain.storage.fetch(keys, PATHS, writable=writable))
        # Every row written is held on SQLite. On Postgres a write says its rows' keys
        # where its insert is one INSERT ... RETURNING read before the commit: up to 8
        # rows, where something follows the insert (an eviction, say); an insert of more
        # goes by COPY, and one sent with the COMMIT is not read: those rows are read once.
        unseen = 0 if db_url.startswith("sqlite") else len(keys)
        assert cached.cache_stats().misses == before.misses + unseen


def test_columns_extended_come_from_the_cache_too(db_url: str, buffer_name: str) -> None:
    """A trainer's ``extend`` of columns each step, and ``sample`` between: its new rows
    are held, and every batch equals one read without a cache."""
    cached = ReplayBuffer(db_url, name=buffer_name, capacity=64)
    plain = ReplayBuffer(db_url, name=buffer_name, cache_bytes=0)
    rng = np.random.default_rng(0)
    paths = ["exp_data.state.obs", "exp_data.actions", "reward_t", "exp_data.done"]

    def extend(step: int) -> None:
        obs = rng.standard_normal((8, 4)).astype(np.float32)
        cached.extend(
            {
                "task_id": [f"env{i}" for i in range(8)],
                "agent_id": "dqn",
                "step": step,
                "state": {"obs": obs},
                "actions": rng.integers(0, 2, 8),
                "reward_t": np.ones(8, np.float32),
                "done": rng.random(8) < 0.2,
            }
        )

    with cached, plain:
        extend(0)
        cached.storage.fetch(cached.storage.key_index()["key"], paths)
        for step in range(1, 30):
            extend(step)
            keys = cached.storage.key_index()["key"]
            chosen = keys[rng.integers(0, len(keys), 32)]
            misses = cached.cache_stats().misses
            _same(cached.storage.fetch(chosen, paths), plain.storage.fetch(chosen, paths))
            assert cached.cache_stats().misses == misses


def test_a_part_some_rows_lack_is_left_to_a_read(db_url: str, buffer_name: str) -> None:
    """Where a path reaches nothing in some row written, nothing of the write is kept:
    the database says what such a row holds there."""
    cached = ReplayBuffer(db_url, name=buffer_name)
    plain = ReplayBuffer(db_url, name=buffer_name, cache_bytes=0)
    paths = ["exp_data.state.deep.x", "reward_t"]
    with cached, plain:
        cached.store(make_row("t", "a", 0, reward=1.0, state={"deep": {"x": 1}}))
        cached.storage.fetch(cached.storage.key_index()["key"], paths)
        cached.store_batch(
            [make_row("t", "a", i, reward=1.0, state={"deep": {"y": i}}) for i in range(1, 4)]
        )
        keys = cached.storage.key_index()["key"]
        misses = cached.cache_stats().misses
        _same(cached.storage.fetch(keys, paths), plain.storage.fetch(keys, paths))
        assert cached.cache_stats().misses == misses + 3


def test_the_keys_a_write_reports_are_the_keys_stored(db_url: str, buffer_name: str) -> None:
    """After writes of another buffer in the same tables, after the newest rows were
    deleted (their keys are never handed out again), with eviction: each write's rows
    and keys, as it reports them, are what the database holds."""
    buffer = ReplayBuffer(db_url, name=buffer_name, capacity=20)
    other = ReplayBuffer(db_url, name=buffer_name + "_other")
    handle = buffer.sql._handle
    with buffer, other:
        reported: dict[str, int] = {}
        for n in range(6):
            rows = [make_row("t", "a", 10 * n + i, reward=float(i)) for i in range(n % 3 + 3)]
            if n == 3:  # the newest rows deleted (the last write's, 21 and 22)
                buffer.storage.delete(QueryBuilder().gte("step", 21).build())
            written = writer.store_rows(handle, rows)
            other.store(make_row("o", "a", n))
            assert written.fresh is not None  # (writes of up to 8 rows)
            assert written.fresh.ids == [r.id for r in rows]
            reported.update(zip(written.fresh.ids, written.fresh.keys, strict=True))
        with handle.read() as conn:
            stored = ids_to_keys(handle, conn, list(reported))
        assert len(stored) >= 20 and all(reported[i] == k for i, k in stored.items())
