"""Retention and claims agree: eviction "stale" never takes rows a learner holds under a
live lease (their ack evicts them), and an ack of rows that left the buffer raises
RowsEvictedError and changes nothing unless ``allow_evicted=True``. On both backends."""

from __future__ import annotations

import pytest

from expstore import (
    DataRow,
    QueryBuilder,
    ReplayBuffer,
    RowsEvictedError,
    UnsupportedTypeError,
)
from expstore.samplers import GroupSampler
from tests.helpers import make_row, make_rows, run_out


def group(task: str, version: int, size: int = 8) -> list[DataRow]:
    return [make_row(task, "actor", i, reward=float(i), version=version) for i in range(size)]


def test_stale_eviction_keeps_a_claimed_group_until_its_ack_evicts_it(buf: ReplayBuffer) -> None:
    buf.set_retention(None, "stale", stale_after=2)
    buf.set_policy_version(0)
    buf.store_batch(group("g1", 0))
    buf.store_batch(group("g2", 0))
    claim = buf.claim(8, consumer="learner", order=GroupSampler("task_id", group_size=8))
    assert len(claim) == 8
    assert buf.set_policy_version(3) == 8  # the group nobody holds goes at once
    assert sorted(r.id for r in buf.query()) == sorted(claim.ids)  # the held one stays
    assert buf.queue_stats().leased == 8
    assert claim.ack(checkpoint={"step": 1}) == 8  # the full count
    assert buf.checkpoint("learner") == {"step": 1}
    assert len(buf) == 0  # the ack evicted its now-stale rows, in its transaction
    found = buf.lineage(claim.ids)
    assert {r.state for r in found.values()} == {"evicted"}
    record = found[claim.ids[0]]
    assert (record.evicted_by, record.consumer, record.checkpoint) == (
        "stale",
        "learner",
        {"step": 1},
    )
    assert record.acked_at is not None and record.evicted_at >= record.acked_at


def test_an_ack_evicts_only_its_own_stale_rows(buf: ReplayBuffer) -> None:
    buf.set_retention(None, "stale", stale_after=1)
    buf.set_policy_version(5)
    buf.store_batch([make_row("old", "a", i, version=5) for i in range(4)])
    buf.store_batch([make_row("new", "a", i, version=6) for i in range(4)])
    held = buf.claim(2, consumer="a")  # two version-5 rows
    other = buf.claim(2, consumer="b")  # the other two
    buf.set_policy_version(7)  # version 5 is stale now; every version-5 row is held
    assert len(buf) == 8
    assert held.ack() == 2
    assert len(buf) == 6  # the other claim's stale rows stay while it holds them
    assert {r.id for r in buf.query()} >= set(other.ids)
    assert other.release() == 2
    buf.store_batch([make_row("newer", "a", 0, version=7)])  # the next write evicts them
    assert not ({r.id for r in buf.query()} & set(other.ids))
    assert {r.state for r in buf.lineage(other.ids).values()} == {"evicted"}


def test_stale_rows_whose_lease_ran_out_go_at_the_next_version_change(
    buf: ReplayBuffer,
) -> None:
    buf.set_retention(None, "stale", stale_after=0)
    buf.set_policy_version(1)
    buf.store_batch([make_row("t", "a", i, version=1) for i in range(3)])
    dead = buf.claim(3, consumer="a", lease_s=60)
    assert buf.set_policy_version(2) == 0  # held
    run_out(buf, dead)  # the learner died: its lease runs out
    assert buf.set_policy_version(3) == 3
    assert len(buf) == 0
    lineage = buf.lineage(dead.ids)[dead.ids[0]]
    assert (lineage.state, lineage.evicted_by, lineage.acked_at) == ("evicted", "stale", None)
    with pytest.raises(RowsEvictedError, match=r"3 of its 3 rows left .*3 as stale"):
        dead.ack()


def test_set_retention_stale_passes_over_leased_rows(buf: ReplayBuffer) -> None:
    buf.set_policy_version(4)
    buf.store_batch([make_row("t", "a", i, version=1) for i in range(6)])
    held = buf.claim(2, consumer="a")
    assert buf.set_retention(None, "stale", stale_after=1) == 4
    assert sorted(r.id for r in buf.query()) == sorted(held.ids)


def test_an_ack_of_deleted_rows_says_so_and_stores_no_checkpoint(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(6))
    claim = buf.claim(6, consumer="a")
    buf.delete(QueryBuilder().eq("exp_meta.task_id", "task0").build())  # two of its rows
    with pytest.raises(RowsEvictedError) as raised:
        claim.ack({"step": 3})
    message = str(raised.value)
    assert "2 of its 6 rows left" in message and "2 by delete()" in message
    assert "nothing was changed" in message and "allow_evicted=True" in message
    assert (raised.value.evicted, raised.value.reasons) == (2, {"delete": 2})
    assert buf.checkpoint("a", default="none") == "none"
    assert buf.queue_stats().leased == 4 and claim.state == "held"
    assert claim.ack({"step": 3}, allow_evicted=True) == 4


def test_an_ack_of_a_claim_whose_rows_all_went_is_no_silent_zero(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=4) as buffer:
        buffer.store_batch(make_rows(4))
        claim = buffer.claim(4, consumer="a")
        buffer.store_batch(make_rows(4))  # every claimed row goes beyond the capacity
        with pytest.raises(RowsEvictedError, match=r"4 of its 4 rows left"):
            claim.ack({"step": 1})
        assert buffer.checkpoint("a", default=None) is None
        assert claim.ack({"step": 1}, allow_evicted=True) == 0
        assert buffer.checkpoint("a") == {"step": 1}


def test_rows_without_a_tombstone_are_counted_as_unknown(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=4) as buffer:
        buffer.set_retention(4, tombstones=0)
        buffer.store_batch(make_rows(4))
        claim = buffer.claim(2, consumer="a")
        buffer.store_batch(make_rows(2))
        with pytest.raises(RowsEvictedError, match="2 with no tombstone left") as raised:
            claim.ack()
        assert raised.value.reasons == {"unknown": 2}


def test_release_and_renew_of_a_claim_with_evicted_rows_still_work(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=6) as buffer:
        buffer.store_batch(make_rows(6))
        claim = buffer.claim(4, consumer="a")
        buffer.store_batch(make_rows(2))
        assert claim.renew(60) > claim.claimed_at
        assert claim.release() == 2


def test_allow_evicted_must_be_a_bool(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(2))
    claim = buf.claim(2, consumer="a")
    with pytest.raises(UnsupportedTypeError, match="allow_evicted must be True or False"):
        claim.ack(allow_evicted="yes")
    assert claim.ack() == 2
