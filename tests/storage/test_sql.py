"""The storage contract, run on SQLite and on Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from expstore import (
    CodecError,
    DataRow,
    Experience,
    ExpMeta,
    ReplayBuffer,
    StorageError,
)
from expstore.integrations.aworld_replay import AWorldSqlStorage
from tests.helpers import make_row, make_rows


@pytest.fixture
def buffer(db_url: str, buffer_name: str):
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


def test_row_comes_back_equal_with_tensors_and_types(buffer: ReplayBuffer) -> None:
    row = DataRow(
        exp_meta=ExpMeta(task_id="t", task_name="web", agent_id="a", step=3, pre_agent="p"),
        exp_data=Experience(
            state={"img": np.arange(6, dtype=np.uint8).reshape(2, 3), "url": "u"},
            actions=[{"name": "click", "xy": torch.tensor([1.5, -0.0], dtype=torch.bfloat16)}],
            reward_t=1.0,
            adv_t=-0.5,
            v_t=0.25,
            messages=[{"role": "user", "content": "hi"}],
            done=True,
            next_state=torch.zeros(2, 2, dtype=torch.float64),
            ext_info={"nested": [1, 2.5, None, True, "s"]},
        ),
    )
    buffer.store(row)
    back = buffer.get(row.id)
    assert back == row
    assert isinstance(back.exp_data.state["img"], np.ndarray)
    assert isinstance(back.exp_data.actions[0]["xy"], torch.Tensor)
    assert back.exp_data.actions[0]["xy"].dtype == torch.bfloat16
    assert back.exp_meta == row.exp_meta


def test_get_missing_id_returns_none(buffer: ReplayBuffer) -> None:
    assert buffer.get("nope") is None


def test_store_batch_counts_and_len(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(25))
    assert len(buffer) == 25
    assert buffer.count() == 25
    assert len(buffer.storage) == 25


def test_store_batch_with_one_invalid_row_stores_nothing(buffer: ReplayBuffer) -> None:
    rows = make_rows(5)
    rows[3].exp_data.state = {"bad": {1, 2}}  # a set cannot be stored
    with pytest.raises(CodecError, match=rows[3].id):
        buffer.store_batch(rows)
    assert len(buffer) == 0


def test_store_batch_with_an_already_stored_id_stores_nothing(buffer: ReplayBuffer) -> None:
    first = make_rows(3)
    buffer.store_batch(first)
    again = make_rows(4)
    again[2] = first[1]
    with pytest.raises(StorageError, match=f"{first[1].id!r} is already stored"):
        buffer.store_batch(again)
    assert len(buffer) == 3
    assert [r.id for r in buffer.query()] == [r.id for r in first]


def test_duplicate_ids_within_a_batch_are_refused(buffer: ReplayBuffer) -> None:
    row = make_row()
    with pytest.raises(ValueError, match="appears twice in one batch"):
        buffer.store_batch([row, row])
    assert len(buffer) == 0


@pytest.mark.parametrize("bad", [None, []])
def test_store_none_or_empty_batch_raises_value_error(buffer: ReplayBuffer, bad) -> None:
    with pytest.raises(ValueError, match="DataRow|empty batch"):
        if bad is None:
            buffer.store(bad)
        else:
            buffer.store_batch(bad)


def test_none_inside_a_batch_names_its_position(buffer: ReplayBuffer) -> None:
    with pytest.raises(ValueError, match="None at position 1"):
        buffer.store_batch([make_row(), None])  # type: ignore[list-item]
    assert len(buffer) == 0


def test_invalid_rows_raise_validation_error_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="task_id"):
        ExpMeta(task_id="", agent_id="a", step=0)
    with pytest.raises(ValidationError, match="step"):
        ExpMeta(task_id="t", agent_id="a", step=-1)
    with pytest.raises(ValidationError, match="execute_time"):
        ExpMeta(task_id="t", agent_id="a", step=0, execute_time=float("nan"))
    with pytest.raises(ValidationError, match="state"):
        Experience(state=object())


def test_aworld_singular_action_is_accepted() -> None:
    assert Experience(state={}, action={"name": "click"}).actions == [{"name": "click"}]


def test_query_streams_in_insertion_order_with_limit(buffer: ReplayBuffer) -> None:
    rows = make_rows(2500)
    buffer.store_batch(rows)
    got = buffer.query()
    assert not isinstance(got, list)
    assert [r.id for r in got] == [r.id for r in rows]
    assert [r.id for r in buffer.query(limit=1234)] == [r.id for r in rows[:1234]]
    newest = [r.id for r in buffer.query(limit=3, order_by="-key")]
    assert newest == [r.id for r in rows[::-1][:3]]


def test_query_by_step_orders_by_step_then_insertion(buffer: ReplayBuffer) -> None:
    rows = make_rows(2100, tasks=3)
    buffer.store_batch(rows)
    steps = [r.exp_meta.step for r in buffer.query(order_by="step")]
    assert steps == sorted(r.exp_meta.step for r in rows)
    assert len(steps) == 2100


def test_query_rejects_unknown_order(buffer: ReplayBuffer) -> None:
    with pytest.raises(ValueError, match="order_by must be one of"):
        buffer.query(order_by="state")


def test_get_by_task_id_orders_by_step_then_execute_time(buffer: ReplayBuffer) -> None:
    buffer.store_batch(
        [
            make_row("t", step=2, execute_time=5.0),
            make_row("t", step=1, execute_time=9.0),
            make_row("t", step=1, execute_time=3.0),
            make_row("other", step=0),
        ]
    )
    got = [(r.exp_meta.step, r.exp_meta.execute_time) for r in buffer.get_by_task_id("t")]
    assert got == [(1, 3.0), (1, 9.0), (2, 5.0)]
    assert buffer.get_by_task_id("missing") == []


def test_get_batch_by_task_ids_groups_rows(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(12, tasks=3))
    got = buffer.get_batch_by_task_ids(["task2", "task0", "nope"])
    assert list(got) == ["task2", "task0", "nope"]
    assert [r.exp_meta.step for r in got["task2"]] == [0, 1, 2, 3]
    assert got["nope"] == []
    aworld = AWorldSqlStorage(buffer.storage.url, name=buffer.storage.name)
    assert aworld.get_bacth_by_task_ids(["task1"])["task1"] == got_task1(buffer)  # (sic)
    aworld.close()


def got_task1(buffer: ReplayBuffer) -> list[DataRow]:
    return buffer.get_by_task_id("task1")


def test_task_ids_in_first_insertion_order(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("b"), make_row("a"), make_row("b", step=1), make_row("c")])
    assert buffer.task_ids() == ["b", "a", "c"]


def test_query_from_an_offset(buffer: ReplayBuffer) -> None:
    rows = make_rows(10)
    buffer.store_batch(rows)
    ids = [r.id for r in rows]
    assert [r.id for r in buffer.query(offset=8)] == ids[8:]
    assert [r.id for r in buffer.query(offset=3, limit=2)] == ids[3:5]
    assert [r.id for r in buffer.query(offset=2, order_by="-key")] == ids[::-1][2:]
    assert list(buffer.query(offset=10)) == []
    with pytest.raises(ValueError, match="offset"):
        buffer.query(offset=-1)


@pytest.fixture
def aworld(buffer: ReplayBuffer) -> Iterator[AWorldSqlStorage]:
    """The buffer's rows under AWorld 0.2.7's storage names."""
    storage = AWorldSqlStorage(buffer.storage.url, name=buffer.storage.name)
    yield storage
    storage.close()


def test_get_paginated_is_one_based_and_deterministic(
    buffer: ReplayBuffer, aworld: AWorldSqlStorage
) -> None:
    rows = make_rows(10)
    buffer.store_batch(rows)
    storage = aworld
    assert [r.id for r in storage.get_paginated(1, 4)] == [r.id for r in rows[:4]]
    assert [r.id for r in storage.get_paginated(3, 4)] == [r.id for r in rows[8:]]
    assert storage.get_paginated(4, 4) == []
    with pytest.raises(ValueError, match="page must be an int >= 1"):
        storage.get_paginated(0, 4)
    assert [r.id for r in storage.get_all()] == [r.id for r in rows]


def test_aworld_storage_names(aworld: AWorldSqlStorage) -> None:
    storage = aworld
    storage.add(make_row("x"))
    storage.add_batch([make_row("y"), make_row("y", step=1)])
    assert storage.size() == 3
    assert len(storage.get_by_task_id("y")) == 2


def test_clear_empties_only_this_buffer(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name + "_b") as two,
    ):
        one.store_batch(make_rows(5))
        two.store_batch(make_rows(3))
        assert (len(one), len(two)) == (5, 3)
        one.clear()
        assert (len(one), len(two)) == (0, 3)


def test_named_buffers_are_isolated(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as one,
        ReplayBuffer(db_url, name=buffer_name + "_b") as two,
    ):
        row = make_row("shared")
        one.store(row)
        two.store(row)  # the same id may live in two buffers
        assert one.get(row.id) == two.get(row.id) == row
        assert one.task_ids() == two.task_ids() == ["shared"]


def test_in_memory_buffers_never_share_storage() -> None:
    one, two = ReplayBuffer(), ReplayBuffer()
    one.store(make_row())
    assert (len(one), len(two)) == (1, 0)


def test_capacity_evicts_oldest_in_the_same_write(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=10) as buf:
        rows = make_rows(25)
        buf.store_batch(rows[:7])
        buf.store_batch(rows[7:18])
        assert len(buf) == 10
        buf.store(rows[18])
        assert [r.id for r in buf.query()] == [r.id for r in rows[9:19]]
        buf.store_batch(rows[19:])
        assert [r.id for r in buf.query()] == [r.id for r in rows[15:]]


def test_persistence_after_close(db_url: str, buffer_name: str) -> None:
    rows = make_rows(30, tensor=True)
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.store_batch(rows)
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        assert list(buf.query()) == rows


def test_fetch_keys_keeps_order_and_repeats(buffer: ReplayBuffer) -> None:
    rows = make_rows(5)
    buffer.store_batch(rows)
    keys = buffer.storage.key_index()["key"]
    got = buffer.storage.fetch_keys([keys[3], keys[0], keys[3]])
    assert [r.id for r in got] == [rows[3].id, rows[0].id, rows[3].id]


def test_conditions_plug_into_every_storage_method(buffer: ReplayBuffer) -> None:
    from expstore import QueryBuilder

    rows = make_rows(20, tasks=4, agents=2)
    buffer.store_batch(rows)
    by_agent = QueryBuilder().eq("exp_meta.agent_id", "agent1").build()
    assert buffer.count(by_agent) == 10
    assert buffer.count(by_agent.to_dict()) == 10  # AWorld's dict shape works too
    assert buffer.task_ids(by_agent) == ["task1", "task3"]
    assert [r.id for r in buffer.query(by_agent, limit=2)] == [rows[1].id, rows[3].id]
    assert len(list(buffer.query(by_agent, offset=8))) == 2
    by_url = QueryBuilder().eq("exp_data.state.url", "https://x/3").build()
    assert [r.id for r in buffer.query(by_url)] == [
        r.id for r in rows if r.exp_data.state["i"] % 7 == 3
    ]
    assert buffer.delete(by_agent) == 10
    assert len(buffer) == 10
    assert buffer.count(by_agent) == 0


def test_update_priorities_refuses_bad_input_and_changes_nothing(buffer: ReplayBuffer) -> None:
    rows = make_rows(3)
    buffer.store_batch(rows)
    with pytest.raises(ValueError, match="one priority per id"):
        buffer.update_priorities([rows[0].id], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        buffer.update_priorities([rows[0].id, rows[1].id], [1.0, float("nan")])
    assert np.isnan(buffer.storage.key_index(columns=("priority",))["priority"]).all()


def test_a_bad_row_in_a_later_chunk_rolls_back_the_earlier_chunks(buffer: ReplayBuffer) -> None:
    from expstore import CodecError
    from expstore.storage.writer import WRITE_CHUNK

    rows = make_rows(WRITE_CHUNK + 500)
    bad = rows[WRITE_CHUNK + 100]
    bad.exp_data.state = {"bad": {1, 2}}  # mutated after validation: only encoding sees it
    with pytest.raises(CodecError, match=bad.id):
        buffer.store_batch(rows)
    assert len(buffer) == 0


def test_metadata_too_long_or_with_nul_is_a_validation_error() -> None:
    for bad in ({"task_id": "t" * 256}, {"agent_id": "a\x00b"}, {"pre_agent": "p" * 256}):
        fields = {"task_id": "t", "agent_id": "a", "step": 0, **bad}
        with pytest.raises(ValidationError, match=next(iter(bad))):
            ExpMeta(**fields)
    with pytest.raises(ValidationError, match="NUL"):
        Experience(state={"text": "a\x00b"})


def test_fetch_fields_reads_several_paths_into_one_field(buffer: ReplayBuffer) -> None:
    row = make_row(ext_info={"x": {"__float__": "nan"}, "y": {"__float__": 1}, "t": np.ones(2)})
    buffer.store(row)
    keys = buffer.storage.key_index()["key"]
    paths = ["ext_info", "ext_info.x", "ext_info.y", "ext_info.t", "ext_info.t.1", "step", "id"]
    ids, columns = buffer.storage.fetch_columns(keys, paths)
    got = [ids[0], *(values[0] for values in columns)]
    assert got[0] == row.id and got[-1] == row.id and got[-2] == 0
    assert got[2] == {"__float__": "nan"} and got[3] == {"__float__": 1}
    assert got[4].tolist() == [1.0, 1.0] and got[5] == 1.0
    assert got[1]["x"] == {"__float__": "nan"}


def test_an_in_memory_buffer_takes_turns_between_threads() -> None:
    import threading

    from expstore import UniformSampler

    buf = ReplayBuffer()
    buf.store_batch(make_rows(10))
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(30):
                buf.store_batch(make_rows(20))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    for _ in range(60):
        buf.sample(UniformSampler(seed=0), batch_size=8)
        assert len(buf) >= 10
    writer.join()
    assert errors == [] and len(buf) == 10 + 30 * 20


def test_a_forked_child_cannot_use_an_in_memory_buffer() -> None:
    import os

    buf = ReplayBuffer()
    buf.store(make_row())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports what len() did
        try:
            len(buf)
            message = b"no error"
        except StorageError as exc:
            message = str(exc).encode()
        os.write(write, message[:500])
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert b"cannot be used from a forked process" in os.read(read, 1000)
    assert len(buf) == 1


def test_fields_of_rows_read_two_ways_are_writable_arrays(buffer: ReplayBuffer) -> None:
    """A batch mixing rows whose tensor the database extracts with rows it must read whole
    (the path missing): the tensors still come back writable and aligned."""
    rows = [
        make_row(state={"obs": np.full(3, i, np.float64), "pad": np.ones(1, np.uint8)})
        for i in range(3)
    ]
    rows.append(make_row(state={"other": 1}))
    buffer.store_batch(rows)
    keys = buffer.storage.key_index()["key"]
    _, (got,) = buffer.storage.fetch_columns(keys, ["exp_data.state.obs"])
    arrays = got[:3]
    assert all(a.flags.writeable and a.flags.aligned for a in arrays)
    arrays[0][0] = 42.0
    assert arrays[0].tolist() == [42.0, 0.0, 0.0] and arrays[1].tolist() == [1.0] * 3
