"""``SqlStorage.replace`` (the writer's ``replace_rows``): each row replaces the stored row
of its id in one transaction, and the removal keeps every guarantee ``delete()`` gives
(tombstones, the row count, a new version for readers, arrays and tracked changes, the
capacity), while the write reads the buffer's state once. On both backends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from expstore import ReplayBuffer, RowValidationError
from expstore.db.schema import buffers, rows
from expstore.db.trace import driver_statements
from tests.arrays.test_stored_once import consistent
from tests.helpers import make_row, make_rows
from tests.retention.test_tombstones import tombstone_rows


def changed_rows(old: list[Any], reward: float) -> list[Any]:
    """The rows of ``old`` again (same ids) with a new reward."""
    new = []
    for row in old:
        again = make_row(row.exp_meta.task_id, row.exp_meta.agent_id, row.exp_meta.step)
        again.id = row.id
        again.exp_data.reward_t = reward
        new.append(again)
    return new


def counters(buffer: ReplayBuffer) -> tuple[int, int, int]:
    """(row_count, inserted, version) of the buffer's row."""
    with buffer.sql.handle.read() as conn:
        stmt = select(buffers.c.row_count, buffers.c.inserted, buffers.c.version)
        found = conn.execute(stmt.where(buffers.c.id == buffer.sql.buffer_id)).one()
    return int(found[0]), int(found[1]), int(found[2])


def keys_of(buffer: ReplayBuffer) -> dict[str, int]:
    with buffer.sql.handle.read() as conn:
        stmt = select(rows.c.id, rows.c.key).where(rows.c.buffer_id == buffer.sql.buffer_id)
        return {str(i): int(k) for i, k in conn.execute(stmt)}


@pytest.fixture
def three(db_url: str, buffer_name: str) -> Iterator[tuple[ReplayBuffer, list[Any]]]:
    """A buffer holding three rows, and the rows."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        first = make_rows(3)
        buffer.store_batch(first)
        yield buffer, first


def test_a_replace_leaves_what_a_delete_then_a_store_leave(db_url: str, buffer_name: str) -> None:
    first = make_rows(6)
    with (
        ReplayBuffer(db_url, name=buffer_name + "_r") as replaced,
        ReplayBuffer(db_url, name=buffer_name + "_d") as deleted,
    ):
        for buffer in (replaced, deleted):
            buffer.store_batch(first)
        before = counters(replaced)
        replaced.sql.replace(changed_rows(first[1:3], 9.0))
        deleted.delete({"field": "id", "value": [r.id for r in first[1:3]], "op": "in"})
        deleted.store_batch(changed_rows(first[1:3], 9.0))
        for buffer in (replaced, deleted):
            assert len(buffer) == 6
            assert [buffer.get(r.id).exp_data.reward_t for r in first] == [  # type: ignore[union-attr]
                0.0,
                9.0,
                9.0,
                3.0,
                4.0,
                5.0,
            ]
            assert [(t[2], t[3]) for t in tombstone_rows(buffer)] == [
                (first[1].id, "delete"),
                (first[2].id, "delete"),
            ]
        count, inserted, version = counters(replaced)
        assert (count, inserted) == (6, before[1] + 2)
        assert version > before[2]  # readers' cached key indexes see the rows that went
        assert counters(deleted)[:2] == (count, inserted)
        lineage = replaced.lineage([first[1].id])[first[1].id]
        assert lineage.state != "evicted"  # the id is stored again


def test_a_replace_of_an_id_not_stored_is_a_store(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(2))
        version = counters(buffer)[2]
        row = make_row("t9", reward=1.5)
        buffer.sql.replace([row])
        assert len(buffer) == 3 and buffer.get(row.id) is not None
        assert counters(buffer)[2] == version  # nothing removed: no new version
        assert tombstone_rows(buffer) == []


def test_a_replaced_newest_row_gets_a_key_above_every_key_handed_out(
    three: tuple[ReplayBuffer, list[Any]],
) -> None:
    buffer, first = three
    keys = keys_of(buffer)
    for round_ in range(3):  # the newest row each time: its key is the table's largest
        newest = max(keys, key=keys.__getitem__)
        old = next(r for r in first if r.id == newest)
        buffer.sql.replace(changed_rows([old], float(round_)))
        now = keys_of(buffer)
        assert now[newest] > max(keys.values())
        keys = now
    assert [r.exp_data.reward_t for r in buffer.query(None)][-1] == 2.0


def test_a_replace_in_a_full_buffer_evicts_nothing(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=4) as buffer:
        first = make_rows(4)
        buffer.store_batch(first)
        buffer.sql.replace(changed_rows(first[:2], 7.0))
        assert len(buffer) == 4
        assert sorted(keys_of(buffer)) == sorted(r.id for r in first)
        assert [t[3] for t in tombstone_rows(buffer)] == ["delete", "delete"]
        assert counters(buffer)[0] == 4
        buffer.store(make_row("t5"))  # one over: the oldest goes
        assert len(buffer) == 4 and counters(buffer)[0] == 4


def test_a_replace_keeps_only_the_tombstones_the_buffer_keeps(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.set_retention(None, tombstones=2)
        first = make_rows(5)
        buffer.store_batch(first)
        buffer.sql.replace(changed_rows(first[:3], 1.0))
        assert [(seq, i) for seq, _, i, _ in tombstone_rows(buffer)] == [
            (1, first[1].id),
            (2, first[2].id),
        ]
        buffer.sql.replace(changed_rows(first[3:4], 2.0))
        assert [(seq, i) for seq, _, i, _ in tombstone_rows(buffer)] == [
            (2, first[2].id),
            (3, first[3].id),
        ]


def test_a_replace_sweeps_the_arrays_only_the_old_row_held(db_url: str, buffer_name: str) -> None:
    big = np.arange(160 * 160, dtype=np.float32).reshape(160, 160)
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        row = make_row("t", state={"frame": big})
        buffer.store(row)
        assert consistent(buffer) == 1
        again = make_row("t", state={"frame": big + 1})
        again.id = row.id
        buffer.sql.replace([again])
        assert consistent(buffer) == 1
        got = buffer.get(row.id)
        assert got is not None and np.array_equal(got.exp_data.state["frame"], big + 1)


def test_a_replace_keeps_tracked_changes_as_a_delete_then_a_store_do(
    db_url: str, buffer_name: str
) -> None:
    changed = {"field": "exp_data.reward_t", "op": "changed"}
    found = []
    for way in ("replace", "delete"):
        with ReplayBuffer(db_url, name=f"{buffer_name}_{way}") as buffer:
            buffer.track_changes("exp_data.reward_t")
            steps = [make_row("t", step=s, reward=1.0) for s in range(3)]
            buffer.store_batch(steps)
            before = sorted(r.exp_meta.step for r in buffer.query(changed))
            if way == "replace":
                buffer.sql.replace(changed_rows(steps[1:2], 5.0))
            else:
                buffer.delete({"field": "id", "value": steps[1].id, "op": "eq"})
                buffer.store_batch(changed_rows(steps[1:2], 5.0))
            found.append((before, sorted(r.exp_meta.step for r in buffer.query(changed))))
    assert found[0] == found[1]
    assert found[0][0] != found[0][1]  # the new reward is a change at step 1 and 2


def test_a_replace_reads_the_buffers_state_once_and_counts_once(
    db_url: str, three: tuple[ReplayBuffer, list[Any]]
) -> None:
    buffer, first = three
    buffer.sql.replace(changed_rows(first[:1], 1.0))  # warm
    with driver_statements(buffer.sql.handle.connections.engine) as traced:
        buffer.sql.replace(changed_rows(first[1:2], 2.0))
    # (after the commit, the planner's statistics may be refreshed: not the write's own)
    seen = [s for s in traced if not s.startswith("ANALYZE")]
    state_reads = [s for s in seen if s.startswith("SELECT expstore_buffers.name")]
    buffer_updates = [s for s in seen if "UPDATE expstore_buffers" in s]
    assert len(state_reads) == 1 and len(buffer_updates) == 1
    assert "version" in buffer_updates[0]
    if db_url.startswith("postgresql"):
        # BEGIN, the state, the row locked with the counters, its tombstone with its
        # delete, the insert, COMMIT
        assert len(seen) == 6, seen
        assert buffer_updates[0].startswith("WITH doomed")
        assert any(s.startswith("WITH tombstones") and "DELETE FROM" in s for s in seen)


@pytest.mark.parametrize("n", [3, 12])
def test_a_replace_of_stored_and_new_ids_leaves_what_a_delete_then_a_store_leave(
    db_url: str, buffer_name: str, n: int
) -> None:
    """Rows of which some replace stored ones and some are new, a few and more than one
    INSERT statement takes: the same rows, counts and tombstones as a delete then a
    store."""
    first = make_rows(2 * n)
    found = []
    for way in ("replace", "delete"):
        with ReplayBuffer(db_url, name=f"{buffer_name}_{way}") as buffer:
            buffer.store_batch(first[:n])
            before = counters(buffer)
            again = changed_rows(first[1:n], 9.0) + first[n : n + 2]
            if way == "replace":
                buffer.sql.replace(again)
            else:
                buffer.delete({"field": "id", "value": [r.id for r in first[1:n]], "op": "in"})
                buffer.store_batch(again)
            after = counters(buffer)
            assert (after[0], after[1]) == (n + 2, before[1] + n + 1)
            assert after[2] > before[2]
            rewards = {r.id: r.exp_data.reward_t for r in buffer.query(None)}
            stones = [(t[2], t[3]) for t in tombstone_rows(buffer)]
            found.append((rewards, stones))
    assert found[0] == found[1]
    assert found[0][1] == [(r.id, "delete") for r in first[1:n]]


@pytest.mark.parametrize("n", [1, 3])
def test_a_replace_that_fails_changes_nothing(
    three: tuple[ReplayBuffer, list[Any]], n: int
) -> None:
    buffer, first = three
    before = counters(buffer)
    bad = changed_rows(first[:n], 3.0)
    bad[-1].exp_meta.step = -1  # refused when encoded, after the removal
    with pytest.raises(RowValidationError, match="step"):
        buffer.sql.replace(bad)
    assert counters(buffer) == before
    assert tombstone_rows(buffer) == []
    assert [buffer.get(r.id).exp_data.reward_t for r in first] == [0.0, 1.0, 2.0]  # type: ignore[union-attr]


def test_a_replace_finds_its_rows_by_id_whatever_the_buffer_holds(
    db_url: str, buffer_name: str
) -> None:
    """The rows a replace removes are looked up by their ids, not found by walking the
    buffer in key order (SQLite's planner took the order's index: a replace of one row of
    20,000 read them all). The plan of the statement as the driver ran it says so."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        stored = make_rows(2000)
        buffer.store_batch(stored)
        engine = buffer.sql.handle.connections.engine
        with driver_statements(engine) as seen:
            buffer.sql.replace(changed_rows(stored[5:6], 2.0))
        lookup = [s for s in seen if "expstore_rows.id" in s and ("json_each" in s or "any(" in s)]
        assert lookup, seen
        if engine.dialect.name != "sqlite":
            pytest.skip("Postgres: the ids by their index (its plan needs the bound parameters)")
        with engine.connect() as conn:
            plan = " ".join(
                str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + lookup[0])
            )
        assert "sqlite_autoindex_expstore_rows_1" in plan and "buffer_id=? AND id=?" in plan, plan
        assert buffer.get(stored[5].id).exp_data.reward_t == 2.0


def test_a_replace_that_waits_for_an_ack_records_the_row_as_acked(
    db_url: str, buffer_name: str
) -> None:
    """Postgres: an ack holds its rows (FOR KEY SHARE) while it writes their entries. A
    replace of an acked-in-flight row waits for it at its lock, then deletes the row with
    a tombstone that says acked: the delete reads the consumption entry as the ack left
    it, not from a snapshot taken before the wait. Made deterministic by holding the
    ack's lock on a connection of the test's until the replace waits for it."""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite runs one writer at a time")
    from sqlalchemy import create_engine, text

    from expstore.db.schema import consumption, tombstones

    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        row = make_row("t1", reward=1.0)
        buffer.store(row)
        assert len(buffer.claim(1, consumer="learner")) == 1
        key = keys_of(buffer)[row.id]
        engine = create_engine(db_url)
        failed: list[BaseException] = []
        try:
            with engine.connect() as ack:
                ack.execute(
                    text("SELECT key FROM expstore_rows WHERE key = :k FOR KEY SHARE"), {"k": key}
                )

                def replace() -> None:
                    try:
                        buffer.sql.replace(changed_rows([row], 2.0))
                    except BaseException as exc:  # noqa: BLE001 - reported below
                        failed.append(exc)

                replacing = threading.Thread(target=replace)
                replacing.start()
                waiting = text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'WITH doomed%'"
                )
                with engine.connect() as watch:
                    while not watch.execute(waiting).scalar_one():  # the replace waits
                        watch.rollback()
                        assert replacing.is_alive() and not failed, failed
                ack.execute(
                    consumption.update()
                    .where(consumption.c.key == key)
                    .values(acked_at=123.0, checkpoint_seq=None)
                )
                ack.commit()
                replacing.join()
        finally:
            engine.dispose()
        assert not failed, failed
        with buffer.sql.handle.read() as conn:
            t = tombstones.c
            stone = conn.execute(
                select(t.id, t.reason, t.consumer, t.acked_at).where(
                    t.buffer_id == buffer.sql.buffer_id
                )
            ).one()
        assert tuple(stone) == (row.id, "delete", "learner", 123.0)
        assert buffer.get(row.id).exp_data.reward_t == 2.0  # type: ignore[union-attr]
