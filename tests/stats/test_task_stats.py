"""Task summaries (schema revision 0007): a buffer that keeps them gives the same figures
from one row per task as from every row, on both backends, through writes, extends, deletes,
each eviction policy, version changes, clears and a build that goes on while all of these
happen; a key is never handed out twice (SQLite included)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from expstore import QueryBuilder, ReplayBuffer
from expstore.errors import InvalidArgumentError
from expstore.stats import summary_build, task_stats
from expstore.stats.summary import summarise
from expstore.storage import Tuning
from tests.helpers import in_threads, make_row

#: A condition every row matches: the figures computed from the rows, never the summaries.
EVERY_ROW = QueryBuilder().gte("step", 0).build()


def figures(buf: ReplayBuffer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the whole buffer's summary as stats read it, the same computed from every row)."""
    handle = buf.sql.handle
    return summarise(handle, None, 0.5), summarise(handle, EVERY_ROW, 0.5)


def same(a: Any, b: Any) -> bool:
    """Equal, floats within rounding (sums are added up in another order)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return bool(a == b)


def check(buf: ReplayBuffer) -> dict[str, Any]:
    kept, scanned = figures(buf)
    assert same(kept, scanned), (kept, scanned)
    return kept


def random_rows(rng: random.Random, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        reward = rng.choice([None, 0.0, 1.0, rng.random(), -rng.random()])
        version = rng.choice([None, rng.randrange(0, 6)])
        out.append(
            make_row(
                f"task{rng.randrange(12)}",
                f"agent{rng.randrange(3)}",
                rng.randrange(6),
                reward=reward,
                version=version,
                execute_time=1_000.0 + rng.random() * 100,
            )
        )
    return out


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        yield buffer


def test_a_buffer_keeps_no_summaries_until_asked(buf: ReplayBuffer) -> None:
    buf.store_batch(random_rows(random.Random(0), 5))
    assert buf.summary_state() is None
    assert buf.create_summary() is True
    state = buf.summary_state()
    assert state is not None and state.built
    assert buf.create_summary() is False  # kept and built already: nothing to do
    assert buf.drop_summary() is True and buf.summary_state() is None
    assert buf.drop_summary() is False
    check(buf)  # from every row again


@pytest.mark.parametrize("eviction", [None, "fifo", "max_reward", "task_fifo", "stale"])
def test_summaries_give_every_rows_figures_through_writes_deletes_and_evictions(
    buf: ReplayBuffer, eviction: str | None
) -> None:
    rng = random.Random(hash(eviction) % 1000)
    buf.store_batch(random_rows(rng, 30))
    buf.create_summary(step=4)
    if eviction == "stale":
        buf.set_policy_version(1)
        buf.set_retention(40, "stale", stale_after=3)
    elif eviction is not None:
        buf.set_retention(40, eviction)
    for _ in range(25):
        action = rng.choice(["store", "store", "extend", "delete", "version"])
        if action == "store":
            buf.store_batch(random_rows(rng, rng.randrange(1, 15)))
        elif action == "extend":
            n = rng.randrange(1, 10)
            buf.extend(
                {
                    "task_id": [f"task{rng.randrange(12)}" for _ in range(n)],
                    "agent_id": "agent0",
                    "step": [rng.randrange(6) for _ in range(n)],
                    "reward_t": np.array([rng.random() for _ in range(n)]),
                    "policy_version": rng.randrange(0, 6),
                }
            )
        elif action == "delete":
            field = rng.choice(["task_id", "agent_id"])
            value = f"task{rng.randrange(12)}" if field == "task_id" else "agent1"
            buf.delete(QueryBuilder().eq(field, value).build())
        else:
            current = buf.policy_version() or 0
            buf.set_policy_version(current + rng.randrange(0, 2))
        kept = check(buf)
        assert kept["rows"] == len(buf)
    buf.clear()
    assert check(buf)["rows"] == 0
    buf.store_batch(random_rows(rng, 7))
    assert check(buf)["rows"] == len(buf) == (7 if eviction != "stale" else len(buf))


def test_versions_across_the_current_one_are_summed_row_by_row(buf: ReplayBuffer) -> None:
    buf.store_batch(
        [make_row("t", "a", s, reward=1.0, version=v) for s, v in enumerate([1, 4, 9, None])]
        + [make_row("u", "a", 0, version=2)]
    )
    buf.create_summary()
    for current in (0, 3, 5, 9, 12):
        buf.set_policy_version(current, force=True)
        kept = check(buf)
        assert kept["versions"]["current"] == current


def test_the_last_row_of_a_task_is_its_highest_step_then_newest(buf: ReplayBuffer) -> None:
    buf.create_summary()
    buf.store_batch([make_row("t", "a", 3, reward=1.0), make_row("t", "a", 1, reward=0.0)])
    assert check(buf)["success_rate"] == 1.0  # step 3 is the last, though stored first
    buf.store(make_row("t", "b", 3, reward=0.0))  # the same step, stored later: the last
    assert check(buf)["success_rate"] == 0.0
    buf.store(make_row("t", "a", 2, reward=1.0))  # a lower step changes nothing
    assert check(buf)["success_rate"] == 0.0
    buf.delete(QueryBuilder().eq("agent_id", "b").build())  # the last row goes
    assert check(buf)["success_rate"] == 1.0


def test_a_build_interleaved_with_writes_and_deletes_counts_each_row_once(
    buf: ReplayBuffer,
) -> None:
    # The builder's steps, with writes, deletes and evictions between them, as when other
    # processes go on writing while create_summary() works through a large buffer.
    rng = random.Random(7)
    buf.store_batch(random_rows(rng, 60))
    buf.set_retention(80, "fifo")
    handle = buf.sql.handle
    with handle.write() as conn:
        state = summary_build.start(handle, conn)
    steps = 0
    while not state.built:
        buf.store_batch(random_rows(rng, 9))  # evicts the oldest, built or not
        buf.delete(QueryBuilder().eq("task_id", f"task{rng.randrange(12)}").build())
        assert figures(buf)[0]["rows"] == figures(buf)[1]["rows"]  # read from rows meanwhile
        with handle.write() as conn:
            now = task_stats.state(conn, handle.buffer_id)
            assert now is not None
            state, done = summary_build.build_step(handle, conn, now, 5)
            assert 0 <= done <= 5
        steps += 1
    assert steps > 2
    check(buf)
    buf.store_batch(random_rows(rng, 5))
    check(buf)


def test_summaries_stay_exact_with_many_writers_at_once(
    buf: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    buf.create_summary()
    buf.set_retention(150, "fifo")

    def write(seed: int) -> None:
        rng = random.Random(seed)
        with ReplayBuffer(db_url, name=buffer_name) as mine:
            for _ in range(8):
                mine.store_batch(random_rows(rng, rng.randrange(1, 20)))
                if rng.random() < 0.3:
                    mine.delete(QueryBuilder().eq("task_id", f"task{rng.randrange(12)}").build())

    in_threads(write, 4)
    check(buf)


def test_create_summary_refuses_a_bad_step(buf: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="step"):
        buf.create_summary(step=0)
    assert buf.storage.summary_state() is None


def test_a_key_is_never_handed_out_twice(buf: ReplayBuffer) -> None:
    buf.store_batch(random_rows(random.Random(1), 3))
    newest = buf.storage.index.state_now()[0].max_key
    buf.delete(QueryBuilder().gte("step", 0).build())  # the newest rows too
    buf.store(make_row())
    assert buf.storage.index.state_now()[0].max_key > newest
    buf.clear()
    buf.store_batch(random_rows(random.Random(2), 2))
    assert buf.storage.index.state_now()[0].min_key > newest


def test_huge_rewards_never_fail_a_write_and_count_at_the_bound(buf: ReplayBuffer) -> None:
    buf.create_summary()
    buf.store_batch([make_row("t", "a", 0, reward=1e300), make_row("t", "a", 1, reward=-5.0)])
    kept = check(buf)  # the same from the rows: every path bounds the sums alike
    assert kept["reward"]["min"] == -5.0 and kept["reward"]["max"] == 1e300  # exact
    assert kept["reward"]["mean"] == (task_stats.REWARD_BOUND - 5.0) / 2  # the sum bounded
    buf.delete(QueryBuilder().eq("step", 0).build())
    assert check(buf)["reward"]["sum"] == -5.0


@pytest.mark.parametrize("base", [1_700_000_000_000, 2**53, 2**62])
def test_staleness_of_large_versions_is_exact(buf: ReplayBuffer, base: int) -> None:
    # Versions as millisecond timestamps, or near the top of BIGINT: the summaries' sums
    # are of version - base, so the staleness keeps every digit the rows' figures have.
    buf.create_summary()
    buf.store_batch(
        [make_row(f"t{i % 3}", "a", i, version=base + i % 7, reward=1.0) for i in range(60)]
    )
    buf.set_policy_version(base + 9)
    kept = check(buf)["versions"]["staleness"]
    assert kept["sum"] == sum(9 - i % 7 for i in range(60))
    buf.delete(QueryBuilder().eq("step", 3).build())  # subtracted, not recomputed
    check(buf)


def test_a_long_task_losing_its_extremes_is_read_from_its_rows_until_summarised_again(
    db_url: str, buffer_name: str
) -> None:
    # One task longer than the recompute limit, evicted oldest first: each eviction takes
    # its earliest execute_time, so the task is marked dirty (not summarised again from
    # all its rows at every write), and stats read its rows meanwhile.
    with ReplayBuffer(db_url, name=buffer_name, tuning=Tuning(recompute_limit=5)) as buf:
        buf.set_retention(20, "fifo")
        buf.create_summary()
        for step in range(30):
            buf.store(make_row("long", "a", step, reward=float(step), execute_time=1000.0 + step))
            kept = check(buf)
        assert kept["rows"] == 20 and kept["time"]["first"] == 1010.0
        handle = buf.sql.handle
        dirty = task_stats.task_stats.c.dirty
        with handle.read() as conn:
            assert conn.execute(
                select(dirty).where(task_stats.task_stats.c.task_id == "long")
            ).scalar()
        buf.create_summary()  # summarises the dirty task again
        with handle.read() as conn:
            assert not conn.execute(
                select(dirty).where(task_stats.task_stats.c.task_id == "long")
            ).scalar()
        check(buf)


def test_stats_read_one_snapshot_while_another_process_drops_and_creates_summaries(
    buf: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    import threading

    buf.store_batch(random_rows(random.Random(3), 40))
    expected = len(buf)
    stop = threading.Event()

    def toggle() -> None:
        with ReplayBuffer(db_url, name=buffer_name) as other:
            while not stop.is_set():
                other.create_summary()
                other.drop_summary()

    thread = threading.Thread(target=toggle)
    thread.start()
    try:
        handle = buf.sql.handle
        seen = {summarise(handle, None, 0.5)["rows"] for _ in range(150)}
    finally:
        stop.set()
        thread.join()
    assert seen == {expected}


def test_sqlite_finds_dirty_tasks_through_their_partial_index(tmp_path: Any) -> None:
    with ReplayBuffer(f"sqlite:///{tmp_path / 'dirty.db'}") as buffer:
        buffer.create_summary()
        handle = buffer.sql.handle
        compiled = task_stats.dirty_tasks(handle.buffer_id).compile(handle.connections.engine)
        with handle.read() as conn:
            explain = f"EXPLAIN QUERY PLAN {compiled}"
            plan = conn.exec_driver_sql(explain, (handle.buffer_id,)).all()
        assert "ix_expstore_task_stats_dirty" in " ".join(str(step) for step in plan)
