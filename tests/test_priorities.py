"""Stored priorities: their own table, entries that go with their rows, ids found by the
keys a process read lately, and values that come back exactly, on both backends."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from expstore import QueryBuilder, ReplayBuffer
from expstore.db.schema import priorities
from expstore.db.trace import driver_statements
from expstore.samplers import PrioritizedSampler, UniformSampler
from expstore.storage import Tuning
from tests.helpers import make_row, make_rows


@pytest.fixture
def buffer(db_url: str, buffer_name: str):
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


def _entries(buffer: ReplayBuffer) -> dict[int, float]:
    """The buffer's priority entries, by key."""
    handle = buffer.sql.handle  # type: ignore[attr-defined]
    mine = priorities.c.buffer_id == handle.buffer_id
    with handle.read() as conn:
        found = conn.execute(select(priorities.c.key, priorities.c.priority).where(mine))
        return {int(k): float(p) for k, p in found}


def _keys(buffer: ReplayBuffer) -> dict[str, int]:
    index = buffer.storage.key_index(columns=("id",))  # type: ignore[attr-defined]
    return dict(zip(index["id"].tolist(), index["key"].tolist(), strict=True))


def test_entries_go_with_their_rows_however_the_rows_go(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=10) as buffer:
        rows = make_rows(10)
        buffer.store_batch(rows)
        assert buffer.update_priorities([r.id for r in rows], np.arange(10.0)) == 10
        key_of = _keys(buffer)
        assert _entries(buffer) == {key_of[r.id]: float(i) for i, r in enumerate(rows)}
        buffer.store_batch(make_rows(3))  # FIFO eviction of the three oldest
        left = {key_of[r.id]: float(i) for i, r in enumerate(rows) if i >= 3}
        assert _entries(buffer) == left
        gone = buffer.delete(QueryBuilder().eq("id", rows[5].id).build())
        assert gone == 1
        del left[key_of[rows[5].id]]
        assert _entries(buffer) == left
        buffer.clear()
        assert _entries(buffer) == {}
        assert buffer.update_priorities([r.id for r in rows], np.ones(10)) == 0


def test_a_row_without_an_entry_has_no_priority(buffer: ReplayBuffer) -> None:
    rows = make_rows(4)
    buffer.store_batch(rows)
    buffer.update_priorities([rows[1].id], [3.0])
    index = buffer.storage.key_index(columns=("priority",))  # type: ignore[attr-defined]
    assert np.isnan(index["priority"][[0, 2, 3]]).all() and index["priority"][1] == 3.0


def test_priorities_come_back_exactly(buffer: ReplayBuffer) -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.random(300) * 10.0 ** rng.integers(-300, 300, 300),
            [0.0, 5e-324, 2.2250738585072014e-308, 0.1, 1.7976931348623157e308],
        ]
    )
    rows = make_rows(len(values))
    buffer.store_batch(rows)
    assert buffer.update_priorities([r.id for r in rows], values) == len(values)
    key_of = _keys(buffer)
    stored = _entries(buffer)
    assert [stored[key_of[r.id]] for r in rows] == values.tolist()


def test_ids_just_drawn_are_found_by_their_keys(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(40))
    sampler = PrioritizedSampler(seed=0)
    buffer.sample(sampler, None, batch_size=16)
    handle = buffer.sql.handle  # type: ignore[attr-defined]
    assert set(sampler.last_ids) <= set(handle.recent_keys)
    ids = list(dict.fromkeys(sampler.last_ids))
    assert buffer.update_priorities(ids, np.full(len(ids), 2.0)) == len(ids)
    key_of = _keys(buffer)
    assert _entries(buffer) == {key_of[i]: 2.0 for i in ids}


def test_an_id_stored_again_after_its_row_went_is_found_under_its_new_key(
    buffer: ReplayBuffer,
) -> None:
    first = make_row("t", step=0)
    buffer.store_batch([first, make_row("t", step=1)])
    buffer.sample(UniformSampler(seed=0), None, batch_size=8)  # reads both: keys remembered
    handle = buffer.sql.handle  # type: ignore[attr-defined]
    old_key = handle.recent_keys[first.id]
    assert buffer.delete(QueryBuilder().eq("id", first.id).build()) == 1
    assert buffer.update_priorities([first.id], [1.0]) == 0  # its remembered key is gone
    again = make_row("t", step=0)
    again.id = first.id
    buffer.store_batch([again])
    assert handle.recent_keys[first.id] == old_key  # still the old key, until read again
    assert buffer.update_priorities([first.id], [4.0]) == 1
    new_key = _keys(buffer)[first.id]
    assert new_key != old_key and _entries(buffer) == {new_key: 4.0}


def test_remembered_keys_stay_bounded(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, tuning=Tuning(recent_keys=64)) as buffer:
        rows = make_rows(200)
        buffer.store_batch(rows)
        handle = buffer.sql.handle  # type: ignore[attr-defined]
        keys = list(_keys(buffer).values())
        buffer.storage.fetch_keys(keys[:40])
        buffer.storage.fetch_keys(keys[:1])  # the first row read again: now the newest
        buffer.storage.fetch_keys(keys[40:70])  # over 64: the oldest go, down to 32
        assert rows[0].id in handle.recent_keys and len(handle.recent_keys) == 32
        for start in range(70, 200, 50):
            buffer.storage.fetch_keys(keys[start : start + 50])
            assert len(handle.recent_keys) <= 64
        assert {r.id for r in rows[-32:]} <= set(handle.recent_keys)  # the last read are kept
        assert buffer.update_priorities([r.id for r in rows], np.ones(200)) == 200
        with handle.read() as conn:
            mine = priorities.c.buffer_id == handle.buffer_id
            assert conn.execute(select(func.count()).where(mine)).scalar_one() == 200


def test_an_update_sets_the_last_priority_of_each_stored_id_and_logs_it_once(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    """Ids given twice: the last priority wins; unknown ids are skipped; one logged update,
    which another handle's index picks up; on Postgres, one statement after the lock."""
    rows = make_rows(6)
    buffer.store_batch(rows)
    ids = [rows[0].id, rows[1].id, "no-such-id", rows[0].id, rows[2].id]
    sql = buffer.sql  # type: ignore[attr-defined]
    with driver_statements(sql.handle.connections.engine) as seen:
        assert buffer.update_priorities(ids, [1.0, 2.0, 3.0, 4.0, 5.0]) == 3
    key_of = _keys(buffer)
    assert _entries(buffer) == {
        key_of[rows[0].id]: 4.0,
        key_of[rows[1].id]: 2.0,
        key_of[rows[2].id]: 5.0,
    }
    if buffer.sql.handle.dialect.modifying_ctes:  # type: ignore[attr-defined]
        assert [s.split()[0] for s in seen] == ["BEGIN", "SELECT", "WITH", "COMMIT"]
    assert buffer.update_priorities(["no-such-id"], [1.0]) == 0  # nothing stored: no update
    other = ReplayBuffer(db_url, name=buffer_name)
    try:
        index = other.storage.key_index(columns=("priority",))  # type: ignore[attr-defined]
        by_key = dict(zip(index["key"].tolist(), index["priority"].tolist(), strict=True))
        assert by_key[key_of[rows[0].id]] == 4.0 and by_key[key_of[rows[2].id]] == 5.0
        buffer.update_priorities([rows[2].id], [6.0])  # logged: the other index is patched
        index = other.storage.key_index(columns=("priority",))  # type: ignore[attr-defined]
        by_key = dict(zip(index["key"].tolist(), index["priority"].tolist(), strict=True))
        assert by_key[key_of[rows[2].id]] == 6.0
    finally:
        other.close()
