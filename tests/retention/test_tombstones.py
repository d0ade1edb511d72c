"""Tombstones: every row that leaves a buffer leaves a compact trace, written in the
transaction that deletes it, so ``lineage`` answers ``evicted`` (when, why, and its
consumption record); bounded by a retention of its own. On both backends."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from expstore import (
    InvalidArgumentError,
    QueryBuilder,
    ReplayBuffer,
    RowsEvictedError,
)
from expstore.db.schema import buffers, rows, tombstones
from expstore.retention.tombstones import DEFAULT_KEEP
from tests.helpers import make_row, make_rows
from tests.storage.crash_writer import BATCH

ROOT = Path(__file__).resolve().parents[2]


def tombstone_rows(buffer: ReplayBuffer) -> list[tuple[int, int, str, str]]:
    """(seq, key, id, reason) of the buffer's tombstones, oldest first."""
    sql = buffer.sql
    with sql.handle.read() as conn:
        stmt = (
            select(tombstones.c.seq, tombstones.c.key, tombstones.c.id, tombstones.c.reason)
            .where(tombstones.c.buffer_id == sql.buffer_id)
            .order_by(tombstones.c.seq)
        )
        return [tuple(r) for r in conn.execute(stmt)]  # type: ignore[misc]


def test_rows_evicted_by_capacity_answer_lineage_as_evicted(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=4) as buffer:
        first = make_rows(4)
        buffer.store_batch(first)
        claim = buffer.claim(2, consumer="learner")
        claim.ack(checkpoint={"step": 9})
        buffer.store_batch(make_rows(4))
        found = buffer.lineage([r.id for r in first] + ["never-stored"])
        assert list(found) == [r.id for r in first]
        consumed = found[claim.ids[0]]
        assert consumed.state == "evicted"
        assert (consumed.evicted_by, consumed.eviction_policy) == ("capacity", "fifo")
        assert (consumed.consumer, consumed.checkpoint, consumed.checkpoint_seq) == (
            "learner",
            {"step": 9},
            1,
        )
        assert consumed.times_claimed == 1 and consumed.evicted_at >= consumed.acked_at
        never = found[first[3].id]
        assert (never.state, never.consumer, never.acked_at, never.times_claimed) == (
            "evicted",
            None,
            None,
            0,
        )


@pytest.mark.parametrize("policy", ["max_reward", "task_fifo"])
def test_every_policy_leaves_tombstones_of_exactly_the_rows_it_evicts(
    db_url: str, buffer_name: str, policy: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=6, eviction=policy) as buffer:
        written = []
        for batch in range(5):
            rows_ = [make_row(f"t{batch}", "a", i, reward=float((i * 7) % 5)) for i in range(3)]
            buffer.store_batch(rows_)
            written += [r.id for r in rows_]
        present = {r.id for r in buffer.query()}
        buried = [t[2] for t in tombstone_rows(buffer)]
        assert sorted(buried) == sorted(set(written) - present)
        assert {t[3] for t in tombstone_rows(buffer)} == {"capacity"}
        assert {r.eviction_policy for r in buffer.lineage(buried).values()} == {policy}


def test_delete_and_clear_leave_tombstones_too(buf: ReplayBuffer) -> None:
    stored = make_rows(8)
    buf.store_batch(stored)
    assert buf.delete(QueryBuilder().eq("exp_meta.task_id", "task1").build()) == 2
    buf.clear()
    found = buf.lineage([r.id for r in stored])
    assert {found[r.id].evicted_by for r in stored if r.exp_meta.task_id == "task1"} == {"delete"}
    assert {found[r.id].evicted_by for r in stored if r.exp_meta.task_id != "task1"} == {"clear"}
    assert {r.eviction_policy for r in found.values()} == {None}


def test_a_stored_row_answers_before_the_tombstone_of_its_id(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=1) as buffer:
        row = make_row("t", "a", 0)
        buffer.store_batch([row])
        buffer.store_batch([make_row("t", "a", 1)])  # evicts it
        assert buffer.lineage([row.id])[row.id].state == "evicted"
        buffer.store_batch([row])  # the same id stored again
        assert buffer.lineage([row.id])[row.id].state == "unclaimed"


def test_tombstones_keep_the_newest_n_and_lower_settings_trim_at_once(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=5) as buffer:
        buffer.set_retention(5, tombstones=10)
        written = []
        for _ in range(9):
            batch = make_rows(5)
            buffer.store_batch(batch)
            written += [r.id for r in batch]
        evicted = written[:-5]
        kept = tombstone_rows(buffer)
        assert [t[2] for t in kept] == evicted[-10:]  # the newest ten, oldest first
        seqs = [t[0] for t in kept]
        assert seqs == list(range(seqs[0], seqs[0] + 10))
        found = buffer.lineage(evicted)
        assert list(found) == evicted[-10:]  # older ones forgotten: left out
        buffer.set_retention(5, tombstones=3)
        assert [t[2] for t in tombstone_rows(buffer)] == evicted[-3:]
        buffer.set_retention(5)  # None keeps the setting
        buffer.store_batch(make_rows(2))
        assert len(tombstone_rows(buffer)) == 3


def test_no_tombstones_when_the_buffer_keeps_none(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=2) as buffer:
        buffer.set_retention(2, tombstones=0)
        first = make_rows(4)
        buffer.store_batch(first)
        assert tombstone_rows(buffer) == []
        assert buffer.lineage([r.id for r in first[:2]]) == {}
        assert len(buffer) == 2


def test_a_removal_larger_than_the_kept_tombstones_writes_the_newest_only(
    buf: ReplayBuffer,
) -> None:
    buf.set_retention(None, tombstones=4)
    stored = make_rows(30)
    buf.store_batch(stored)
    buf.set_retention(3)
    assert [t[2] for t in tombstone_rows(buf)] == [r.id for r in stored[23:27]]
    buf.clear()
    assert [t[2] for t in tombstone_rows(buf)] == [r.id for r in stored[26:]]
    assert [t[3] for t in tombstone_rows(buf)] == ["capacity", "clear", "clear", "clear"]


def test_tombstone_retention_is_checked(buf: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="tombstones"):
        buf.set_retention(None, tombstones=-1)
    assert DEFAULT_KEEP == 100_000
    sql = buf.sql
    with sql.handle.read() as conn:
        stmt = select(buffers.c.keep_tombstones).where(buffers.c.id == sql.buffer_id)
        assert conn.execute(stmt).scalar_one() is None  # the default, unchanged


def test_concurrent_acks_and_evictions_record_every_ack_exactly(
    db_url: str, buffer_name: str
) -> None:
    """Writers evicting by capacity race learners acking the rows evicted: each row acked
    before it went has a tombstone that says acked, each acked after is refused, so the
    acks counted equal the rows found consumed or evicted-after-ack."""
    with ReplayBuffer(db_url, name=buffer_name, capacity=60) as setup:
        setup.store_batch(make_rows(60))
    acked = [0, 0]
    stop = time.monotonic() + 4.0

    def writer() -> None:
        with ReplayBuffer(db_url, name=buffer_name) as buffer:
            while time.monotonic() < stop:
                buffer.store_batch(make_rows(10))

    def learner(i: int) -> None:
        with ReplayBuffer(db_url, name=buffer_name) as buffer:
            while time.monotonic() < stop:
                claim = buffer.claim(8, consumer=f"l{i}")
                try:
                    acked[i] += claim.ack({"i": i})
                except RowsEvictedError:
                    acked[i] += claim.ack({"i": i}, allow_evicted=True)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=learner, args=(i,)) for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        sql = buffer.sql
        with sql.handle.read() as conn:
            t = tombstones.c
            after_ack = conn.execute(
                select(func.count()).where(t.buffer_id == sql.buffer_id, t.acked_at.is_not(None))
            ).scalar_one()
            keys = set(conn.execute(select(t.key).where(t.buffer_id == sql.buffer_id)).scalars())
            present = set(
                conn.execute(select(rows.c.key).where(rows.c.buffer_id == sql.buffer_id)).scalars()
            )
        assert not keys & present  # a tombstone is of a row gone
        assert sum(acked) > 0
        assert buffer.queue_stats().consumed + after_ack == sum(acked)


def test_a_writer_killed_mid_eviction_leaves_rows_and_tombstones_whole(
    db_url: str, buffer_name: str, tmp_path: Path
) -> None:
    """SIGKILL at random moments of writers whose every batch evicts: each batch is whole
    in the buffer or whole in its tombstones (or not written), never torn between them."""
    with ReplayBuffer(db_url, name=buffer_name, capacity=3 * BATCH):
        pass  # the buffer and its retention exist before the first writer starts
    log = tmp_path / "committed.log"
    rng = random.Random(1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kills = 4
    for kill in range(kills):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.storage.crash_writer", db_url, buffer_name, str(log),
             str(kill * 1_000_000)],
            cwd=ROOT,
            env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while (not log.exists() or log.read_text().count("\n") <= 4 * kill + 3) and (
            writer.poll() is None
        ):
            assert time.monotonic() < deadline, "the writer never committed a batch"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.2))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    committed = {int(line) for line in log.read_text().split()}
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        per_batch: dict[str, int] = {}
        for row in buffer.query():
            per_batch[row.exp_meta.task_id] = per_batch.get(row.exp_meta.task_id, 0) + 1
        sql = buffer.sql
        with sql.handle.read() as conn:
            t = tombstones.c
            buried = list(conn.execute(select(t.key).where(t.buffer_id == sql.buffer_id)).scalars())
            mine = rows.c.buffer_id == sql.buffer_id
            present = set(conn.execute(select(rows.c.key).where(mine)).scalars())
            inserted, held = conn.execute(
                select(buffers.c.inserted, buffers.c.row_count).where(buffers.c.id == sql.buffer_id)
            ).one()
    assert all(n == BATCH for n in per_batch.values())  # no batch torn in the buffer
    assert held == len(present) == sum(per_batch.values())
    assert not set(buried) & present  # no tombstone of a row still stored
    # Every row ever inserted is stored or buried, once: no write kept its rows without
    # its evictions' tombstones or the other way round.
    assert inserted == len(present) + len(buried) == len(present) + len(set(buried))
    assert inserted % BATCH == 0
    assert len(committed) <= inserted // BATCH <= len(committed) + kills
