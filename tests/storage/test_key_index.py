"""The key index (expstore.storage.key_index): the matching rows' keys and a few columns
as numpy arrays, cached until the buffer changes and then brought up to date cheaply (new
rows appended, FIFO evictions dropped from the front, priorities patched), on SQLite and
on Postgres."""

from __future__ import annotations

import math

import numpy as np
import pytest

from expstore import QueryError, ReplayBuffer
from tests.helpers import make_row, make_rows


def test_key_index_is_cached_until_the_buffer_changes(buffer: ReplayBuffer) -> None:
    storage = buffer.storage
    buffer.store_batch(make_rows(6))
    first = storage.key_index(columns=("step", "reward_t", "task_id"))
    assert storage.key_index(columns=("step", "reward_t", "task_id")) is first
    buffer.store_batch(make_rows(2))
    second = storage.key_index(columns=("step", "reward_t", "task_id"))
    assert len(second["key"]) == 8 and second["key"][:6].tolist() == first["key"].tolist()
    assert np.all(np.diff(second["key"]) > 0)
    buffer.storage.update_priorities([next(buffer.query()).id], [2.0])
    third = storage.key_index(columns=("priority",))
    assert np.nansum(third["priority"]) == 2.0


def test_key_index_reads_payload_paths_as_json_values(buffer: ReplayBuffer) -> None:
    storage = buffer.storage
    values: list[object] = ["x", 3, 2.5, True, None, [1, {"b": 2}], {"k": "v"}, "é\u2028"]
    buffer.store_batch([make_row(f"t{i}", state={"v": v, "l": [i]}) for i, v in enumerate(values)])
    buffer.store_batch([make_row("none", state={}), make_row("str", state="flat")])
    path, item = "exp_data.state.v", "exp_data.state.l.0"
    index = storage.key_index(columns=(path, item, "task_id"))
    assert index[path].dtype == object
    assert index[path].tolist() == [*values, None, None]
    assert [type(v) for v in index[path][:4]] == [str, int, float, bool]
    assert index[item].tolist() == [*range(len(values)), None, None]
    # New rows are appended to the cached arrays like any column's.
    buffer.store(make_row("late", state={"v": "new"}))
    assert storage.key_index(columns=(path, item, "task_id"))[path].tolist()[-1] == "new"


@pytest.mark.parametrize("column", ["exp_meta.colour", "exp_data.state..v", "data", 7])
def test_key_index_refuses_unknown_columns(buffer: ReplayBuffer, column: str) -> None:
    buffer.store(make_row())
    with pytest.raises(QueryError, match=r"unknown field|empty path segment|must be a string"):
        buffer.storage.key_index(columns=(column,))


def test_update_priorities_patches_the_cached_index_like_a_reload(buffer: ReplayBuffer) -> None:
    rows = make_rows(50)
    buffer.store_batch(rows)
    storage = buffer.storage
    before = storage.key_index(columns=("priority", "step"))
    assert np.isnan(before["priority"]).all()
    ids = [rows[3].id, rows[10].id, "evicted-or-unknown", rows[3].id]
    assert buffer.update_priorities(ids, [1.0, 2.5, 9.0, 4.0]) == 2
    patched = storage.key_index(columns=("priority", "step"))
    assert patched is not before and not patched["priority"].flags.writeable
    assert patched["step"] is before["step"]  # only the priorities were rebuilt
    storage.forget_caches()
    reloaded = storage.key_index(columns=("priority", "step"))
    np.testing.assert_array_equal(patched["priority"], reloaded["priority"])
    assert patched["priority"][3] == 4.0 and patched["priority"][10] == 2.5


def test_a_full_fifo_buffer_with_a_writer_never_reloads_its_key_index(
    db_url: str, buffer_name: str
) -> None:
    """FIFO eviction only deletes the oldest rows: readers drop them from the front of the
    cached arrays (by the buffer's min key) and fetch only the new rows, in this process
    and in another handle, whatever the condition; the result is always what a fresh
    index gives."""
    from expstore import QueryBuilder

    conditions = [None, QueryBuilder().eq("exp_meta.agent_id", "agent1").build()]
    columns = ("step", "reward_t", "exp_data.state.i")
    with (
        ReplayBuffer(db_url, name=buffer_name, capacity=20) as writer,
        ReplayBuffer(db_url, name=buffer_name, capacity=20) as reader,
    ):
        writer.store_batch(make_rows(20))
        for c in conditions:
            reader.storage.key_index(c, columns)
        index = reader.storage.index
        for step in range(6):
            fetched = []
            # Three new rows evict the three oldest, written by either handle.
            (writer if step % 2 else reader).store_batch(make_rows(3))
            for c in conditions:
                before = index.rows_read
                got = reader.storage.key_index(c, columns)
                fetched.append(index.rows_read - before)
                with ReplayBuffer(db_url, name=buffer_name) as fresh:
                    expected = fresh.storage.key_index(c, columns)
                assert got.keys() == expected.keys()
                for name in got:
                    assert got[name].tolist() == expected[name].tolist(), name
            # Each reader index fetched at most the three new rows, never the buffer again.
            assert max(fetched) <= 3, fetched
            assert len(reader.storage.key_index(None, columns)["key"]) == 20


def test_other_changes_still_reload_the_key_index(buffer: ReplayBuffer) -> None:
    from expstore import QueryBuilder

    storage = buffer.storage
    buffer.store_batch(make_rows(12))
    before = storage.key_index(None, ("step",))
    # Deleting the newest row and then an older one: neither is a FIFO eviction.
    newest = list(buffer.query(order_by="-key", limit=1))[0]
    buffer.delete(QueryBuilder().eq("id", newest.id).build())
    buffer.delete(QueryBuilder().eq("exp_data.state.i", 3).build())
    buffer.store_batch(make_rows(2))
    after = storage.key_index(None, ("step",))
    assert len(before["key"]) == len(after["key"]) == 12
    assert before["key"][3] not in after["key"].tolist()
    got = [r.exp_data.state["i"] for r in storage.fetch_keys(after["key"])]
    assert got == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 0, 1]


def test_priority_updates_from_another_handle_are_patched_from_the_log(
    db_url: str, buffer_name: str
) -> None:
    """A trainer updates priorities while another process (a DataLoader worker, say) samples:
    the other handle's cached priorities follow from the priority log, never by reading
    every row again, and always equal a fresh index; a handle further behind than the log
    keeps reloads instead."""
    from expstore import QueryBuilder
    from expstore.storage import Tuning

    rows = make_rows(60)
    conditions = [None, QueryBuilder().eq("exp_meta.agent_id", "agent1").build()]
    with (
        ReplayBuffer(db_url, name=buffer_name, capacity=60) as trainer,
        ReplayBuffer(db_url, name=buffer_name) as worker,
    ):
        trainer.store_batch(rows)
        index = worker.storage.index
        for c in conditions:
            worker.storage.key_index(c, ("priority", "step"))
        rng = np.random.default_rng(0)
        for step in range(5):
            chosen = rng.choice(60, 8)  # repeats: the last priority given wins
            trainer.update_priorities([rows[i].id for i in chosen], rng.random(8) * 10)
            if step == 2:  # new rows evict old ones too (FIFO: no reload either)
                rows = rows[4:] + make_rows(4)
                trainer.store_batch(rows[-4:])
            fetched = []
            for c in conditions:
                before = index.rows_read
                got = worker.storage.key_index(c, ("priority", "step"))
                fetched.append(index.rows_read - before)
                with ReplayBuffer(db_url, name=buffer_name) as fresh:
                    expected = fresh.storage.key_index(c, ("priority", "step"))
                for name in ("key", "priority", "step"):
                    np.testing.assert_array_equal(got[name], expected[name])
            assert max(fetched) <= 4, fetched  # only new rows were read
        # Further behind than the log keeps: the worker reads everything again, correctly.
        with ReplayBuffer(db_url, name=buffer_name, tuning=Tuning(priority_log_keep=2)) as short:
            for _ in range(4):
                short.update_priorities([rows[0].id], [float(_)])
        before = index.rows_read
        got = worker.storage.key_index(None, ("priority", "step"))
        assert index.rows_read - before == 60 and got["priority"][0] == 3.0


def test_rows_committed_while_the_index_is_read_are_never_cached_twice(
    db_url: str, buffer_name: str
) -> None:
    """Another process commits rows right after the freshness check: the index holds what
    the check saw and takes the new rows on the next call, each once."""
    with (
        ReplayBuffer(db_url, name=buffer_name) as reader,
        ReplayBuffer(db_url, name=buffer_name) as writer,
    ):
        writer.store_batch(make_rows(5))
        reader.storage.key_index()
        writer.store_batch(make_rows(1))  # the cache is stale now
        index = reader.storage.index
        with index.handle.read() as conn:
            seen = index.signature(conn)
            writer.store_batch(make_rows(3))  # commits right after the check
            assert len(index.read(conn, seen, None, ())["key"]) == 6
        keys = reader.storage.key_index()["key"]
        assert len(keys) == len(np.unique(keys)) == 9


def test_key_index_payload_values_are_decoded_as_the_codec_does(buffer: ReplayBuffer) -> None:
    values: list[object] = [math.nan, math.inf, {"__tensor__": 1}, {"__float__": "x"}, 10**20]
    buffer.store_batch([make_row(f"t{i}", state={"v": v}) for i, v in enumerate(values)])
    got = buffer.storage.key_index(columns=("exp_data.state.v",))["exp_data.state.v"].tolist()
    assert math.isnan(got[0]) and got[1:] == values[1:]
