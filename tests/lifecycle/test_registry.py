"""Each buffer's row count (schema revision 0006) stays what its rows are through every
write, delete, clear, eviction policy and failed write, on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from expstore import DuplicateIdError, ReplayBuffer
from expstore.query import QueryBuilder
from tests.helpers import make_row, make_rows


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


def _check(buffer: ReplayBuffer) -> int:
    every = QueryBuilder().gte("exp_meta.step", 0).build()  # true of every row
    actual = buffer.storage.count(every)  # counted over the rows
    assert buffer.storage.index.state_now()[2] == actual
    return actual


def test_writes_deletes_and_clear_keep_the_count(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(10))
    assert _check(buffer) == 10
    assert buffer.delete(QueryBuilder().eq("exp_meta.agent_id", "agent0").build()) == 5
    assert _check(buffer) == 5
    assert buffer.delete(QueryBuilder().eq("exp_meta.agent_id", "nobody").build()) == 0
    assert _check(buffer) == 5
    buffer.clear()
    assert _check(buffer) == 0
    buffer.store_batch(make_rows(3))
    assert _check(buffer) == 3


def test_a_failed_write_and_dedup_count_only_what_was_stored(buffer: ReplayBuffer) -> None:
    first = make_rows(4)
    buffer.store_batch(first)
    with pytest.raises(DuplicateIdError):
        buffer.store_batch([*make_rows(2), first[0]])
    assert _check(buffer) == 4
    again = [r.model_copy(update={"id": r.id + "x"}) for r in first]
    assert buffer.store_batch(again, dedup="skip") == 0
    assert _check(buffer) == 4


@pytest.mark.parametrize("policy", ["fifo", "max_reward", "task_fifo"])
def test_every_eviction_policy_keeps_the_count(buffer: ReplayBuffer, policy: str) -> None:
    buffer.set_retention(7, policy)
    for _ in range(4):
        buffer.store_batch(make_rows(5))
        assert _check(buffer) <= 7
    buffer.set_retention(3, policy)
    assert _check(buffer) <= 3


def test_stale_eviction_keeps_the_count_at_writes_and_version_changes(
    buffer: ReplayBuffer,
) -> None:
    buffer.set_retention(6, "stale", stale_after=1)
    for version in range(4):
        buffer.set_policy_version(version)
        batch = make_rows(4)
        for row in batch:
            row.exp_meta.policy_version = version
        buffer.store_batch(batch)
        assert _check(buffer) <= 6
    buffer.set_policy_version(10)  # every row is stale now
    assert _check(buffer) == 0


def test_other_buffers_are_counted_apart(db_url: str, buffer_name: str) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name) as a,
        ReplayBuffer(db_url, name=buffer_name + "b") as b,
    ):
        a.store_batch(make_rows(3))
        b.store_batch(make_rows(5))
        a.clear()
        assert _check(a) == 0 and _check(b) == 5


def test_clear_while_a_write_is_in_progress_keeps_the_count(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from expstore.lifecycle import registry
    from expstore.storage import writer

    buffer.store_batch(make_rows(4))
    real = registry.count_inserted

    def slow(handle, conn, n, removed=0, changed=False):  # noqa: ANN001, ANN202
        real(handle, conn, n, removed, changed)
        time.sleep(0.4)  # the write holds the buffer's row, rows inserted, not committed

    monkeypatch.setattr(writer, "count_inserted", slow)
    stored: list[int] = []
    storing = threading.Thread(target=lambda: stored.append(buffer.store_batch(make_rows(3))))
    storing.start()
    time.sleep(0.15)
    buffer.clear()  # waits for the write, then deletes its rows too
    storing.join()
    assert stored == [3]  # the write went through (a failed one would prove nothing)
    assert _check(buffer) == 0


def test_an_index_read_at_an_older_state_is_read_again(buffer: ReplayBuffer) -> None:
    """A replica further behind than the last read shows an older signature: the cached
    index must not be patched as if the buffer had moved on (keys doubled or unsorted)."""
    buffer.store_batch(make_rows(10))
    index = buffer.storage.index
    with index.handle.read() as conn:
        now = index.signature(conn)
        keys = index.read(conn, now, None, ())["key"]
        older = now._replace(max_key=int(keys[4]))
        at_older = index.read(conn, older, None, ())["key"]
        again = index.read(conn, now, None, ())["key"]
    assert at_older.tolist() == keys[:5].tolist()
    assert again.tolist() == keys.tolist()  # sorted, each once


def test_a_write_evicting_stale_rows_and_beyond_the_capacity_keeps_the_capacity(
    buffer: ReplayBuffer,
) -> None:
    buffer.set_policy_version(4)
    buffer.set_retention(10, "stale", stale_after=2)
    buffer.store_batch([make_row("t", "a", i, version=5) for i in range(8)])
    # 3 stale rows (version 0, evicted at once) and 6 fresh: 14 fresh rows for 10 places.
    batch = [make_row("t", "a", 100 + i, version=0) for i in range(3)]
    buffer.store_batch(batch + [make_row("t", "a", 200 + i, version=5) for i in range(6)])
    assert _check(buffer) == 10
