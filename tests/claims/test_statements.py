"""Statements per claim call, as the driver sends them (expstore.db.trace), on both
backends, so the counts of the claim cycle cannot grow unseen (issue 44). Counts, not
timings: on Postgres each statement counted is a round trip (BEGIN and COMMIT included;
a connection taken from the pool is not pinged unless its socket has something to read,
see expstore.db.engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.db.trace import driver_statements
from tests.helpers import make_rows

#: Statements of each call (SQLite, Postgres), warm: its connection made, its statements
#: compiled, the handle's FIFO floor set. Lower them here when a change cuts one.
EXPECTED = {
    "claim(1) + release()": (14, 2),
    "claim(1) + ack()": (14, 2),
    "claim(1) + save_progress + ack(produce=4 rows, into=...)": (25, 11),
    "learner: claim(32) + ack(checkpoint=...)": (16, 5),
}
#: Round trips of each call on Postgres where they are fewer than its statements (an ack
#: with produce sends its statements in two batches: expstore.db.pipeline).
ROUND_TRIPS = {
    "claim(1) + save_progress + ack(produce=4 rows, into=...)": 4,
}


def _prompt(i: int) -> DataRow:
    return DataRow(
        id=f"p{i}",
        exp_meta=ExpMeta(task_id=f"p{i}", agent_id="dataset", step=0),
        exp_data=Experience(state={"question": f"q{i}"}),
    )


@pytest.fixture
def prompts(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_prompts([_prompt(i) for i in range(40)], group_size=4)
        yield buffer


def counted(buffer: ReplayBuffer, call: Callable[[], Any]) -> list[str]:
    """The statements of one ``call()``, warm (two calls before, one traced first: a new
    connection's own statements)."""
    return traced(buffer, call)[0]


def traced(buffer: ReplayBuffer, call: Callable[[], Any]) -> tuple[list[str], int]:
    """:func:`counted`, and the round trips they took (Postgres; SQLite: 0)."""
    call()
    call()
    with driver_statements(buffer.sql._handle.connections.engine) as seen:
        call()
        before = len(seen)
        call()
    return seen[before:], seen.round_trips_since(before)


def expected(db_url: str, what: str) -> int:
    return EXPECTED[what][0 if db_url.startswith("sqlite") else 1]


def expected_trips(db_url: str, what: str) -> int:
    if db_url.startswith("sqlite"):
        return 0
    return ROUND_TRIPS.get(what, EXPECTED[what][1])


def test_claim_and_release(db_url: str, prompts: ReplayBuffer) -> None:
    me = prompts.consumer("actor-0")
    seen, trips = traced(prompts, lambda: me.claim(1).release())
    assert len(seen) == expected(db_url, "claim(1) + release()"), seen
    assert trips == expected_trips(db_url, "claim(1) + release()"), seen


def test_claim_and_ack(db_url: str, prompts: ReplayBuffer) -> None:
    me = prompts.consumer("actor-0")
    seen, trips = traced(prompts, lambda: me.claim(1).ack())
    assert len(seen) == expected(db_url, "claim(1) + ack()"), seen
    assert trips == expected_trips(db_url, "claim(1) + ack()"), seen


def test_a_prompts_cycle(db_url: str, prompts: ReplayBuffer, buffer_name: str) -> None:
    rng = np.random.default_rng(0)
    me = prompts.consumer("actor-0")
    with ReplayBuffer(db_url, name=buffer_name + "_out") as rollouts:

        def cycle() -> None:
            claim = me.claim(1)
            claim.save_progress({"tokens": [1, 2, 3]})
            made = [
                DataRow(
                    exp_meta=ExpMeta(task_id=claim.ids[0], agent_id="actor", step=c),
                    exp_data=Experience(state={"tokens": rng.integers(0, 50_000, 8)}),
                )
                for c in range(4)
            ]
            claim.ack(produce={claim.ids[0]: made}, into=rollouts)

        seen, trips = traced(prompts, cycle)
    what = "claim(1) + save_progress + ack(produce=4 rows, into=...)"
    assert len(seen) == expected(db_url, what), seen
    assert trips == expected_trips(db_url, what), seen
    if not db_url.startswith("sqlite"):
        # the rollouts' row is taken by the last round trip, with the settings' check,
        # the rows, their count, their lineage and the COMMIT: held by the server alone
        locking = [i for i, s in enumerate(seen) if s.endswith("FOR UPDATE")]
        assert len(locking) == 1, seen  # (the state is read with the ack's head: unlocked)
        assert locking and seen[locking[-1]].startswith("SELECT expstore_buffers.id"), seen
        assert seen[locking[-1] + 1].startswith("SELECT CAST(concat("), seen  # the check
        assert seen[locking[-1] + 2].startswith("WITH counted AS"), seen
        assert seen[-1] == "COMMIT" and "expstore_produced" in seen[-2], seen


def test_a_learners_step(db_url: str, buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(256))
    learner = buf.consumer("learner-0")
    seen, trips = traced(buf, lambda: learner.claim(32).ack(checkpoint={"step": 1}))
    what = "learner: claim(32) + ack(checkpoint=...)"
    assert len(seen) == expected(db_url, what), seen
    assert trips == expected_trips(db_url, what), seen


def test_checkpoints_acked_by_an_incarnation_are_numbered_in_turn_and_kept_with_the_rows(
    buf: ReplayBuffer,
) -> None:
    """The checkpoint an incarnation acks with is stored by the statement that acks the
    entries (Postgres): numbered after the consumer's last, the rows acked with it, the
    consumer's acked count kept, and a plain ack in between changes no number."""
    buf.store_batch(make_rows(12))
    learner = buf.consumer("learner-0")
    first = learner.claim(4)
    first.ack(checkpoint={"step": 1})
    learner.claim(2).ack()
    second = learner.claim(4)
    second.ack(checkpoint={"step": 2})
    assert learner.checkpoint() == {"step": 2}
    records = buf.lineage(first.ids + second.ids)
    assert [records[i].checkpoint_seq for i in first.ids] == [1] * 4
    assert [records[i].checkpoint for i in first.ids] == [{"step": 1}] * 4
    assert [records[i].checkpoint_seq for i in second.ids] == [2] * 4
    assert [records[i].checkpoint for i in second.ids] == [{"step": 2}] * 4
    assert buf.queue_stats().consumed == 10
    third = learner.claim(2)
    assert third.ack(checkpoint={"step": 3}) == 2
    assert learner.checkpoint() == {"step": 3}
    assert buf.lineage([third.ids[0]])[third.ids[0]].checkpoint_seq == 3


def test_completions_beyond_a_target_roll_the_whole_ack_back(
    db_url: str, prompts: ReplayBuffer, buffer_name: str
) -> None:
    """The targets are read and their completions added in one statement (Postgres): a
    prompt given more than it needs rolls back the ack whole (no row stored, no count, its
    progress kept); an ack short of the target releases the prompt with its count kept."""
    from expstore import InvalidArgumentError

    me = prompts.consumer("actor-0")

    def rows(pid: str, n: int, start: int = 0) -> list[DataRow]:
        return [
            DataRow(
                id=f"{pid}/c{start + c}",
                exp_meta=ExpMeta(task_id=pid, agent_id="actor", step=start + c),
                exp_data=Experience(state={"tokens": [c]}),
            )
            for c in range(n)
        ]

    with ReplayBuffer(db_url, name=buffer_name + "_out") as out:
        claim = me.claim(1)
        pid = claim.ids[0]
        claim.save_progress({"tokens": [1]})
        with pytest.raises(InvalidArgumentError, match="needs 4 more"):
            claim.ack(produce={pid: rows(pid, 5)}, into=out)
        assert len(out) == 0 and prompts.lineage([pid])[pid].done == 0
        assert claim.progress == {pid: {"tokens": [1]}}
        claim.ack(produce={pid: rows(pid, 3)}, into=out)  # one short: released
        assert claim.unfinished == [pid]
        assert len(out) == 3 and prompts.lineage([pid])[pid].done == 3
        again = me.claim(1)
        assert again.ids == [pid] and again.needs == {pid: 1} and again.progress == {}
        again.ack(produce={pid: rows(pid, 1, start=3)}, into=out)
        assert len(out) == 4 and prompts.lineage([pid])[pid].done == 4
        produced = out.lineage([f"{pid}/c{c}" for c in range(4)])
        assert {p.produced_by.prompt_id for p in produced.values()} == {pid}


def test_a_claim_reads_the_buffer_the_generation_and_the_bounds_in_one_statement(
    db_url: str, prompts: ReplayBuffer
) -> None:
    """No statement of its own for the consumer's generation, the rate limit or the admission
    bound (a buffer without one reads none of its settings); the same for an ack's
    generation."""
    me = prompts.consumer("actor-0")
    seen = counted(prompts, lambda: me.claim(1).ack())
    # SQLite: each call's first statement; Postgres: each call is one statement, whose
    # guard reads them (see ClaimQueue._guard).
    head = "SELECT expstore_buffers.name" if db_url.startswith("sqlite") else "WITH guard AS"
    firsts = [s for s in seen if s.startswith(head)]
    assert len(firsts) == 2  # the claim's first statement, the ack's
    assert all("expstore_consumers.generation" in s for s in firsts)
    assert "expstore_admission" in firsts[0] and "expstore_rate_limits" in firsts[0]
    alone = [s for s in seen if s.startswith(("SELECT expstore_consumers", "SELECT (SELECT"))]
    assert alone == []
    assert not [s for s in seen if s.startswith("SELECT expstore_admission")]


def test_a_connection_the_server_ended_while_pooled_is_replaced_not_used(
    pg_url: str, buffer_name: str
) -> None:
    """Without a ping at every checkout: a pooled connection whose backend the server
    terminated (its goodbye waiting on the socket) is replaced at checkout, and the
    next claim and ack go through."""
    from sqlalchemy import create_engine, text

    with ReplayBuffer(pg_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(8))
        learner = buffer.consumer("learner-0")
        learner.claim(2).ack()
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                ended = (
                    conn.execute(
                        text(
                            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                        )
                    )
                    .scalars()
                    .all()
                )
                assert ended  # the buffer's pooled connection
                conn.execute(text("SELECT pg_terminate_backend(p) FROM unnest(:p) p"), {"p": ended})
                gone = text("SELECT count(*) FROM pg_stat_activity WHERE pid = any(:p)")
                while conn.execute(gone, {"p": ended}).scalar_one():
                    pass  # until the server has ended them (a condition, not a pause)
            claim = learner.claim(2)
            assert len(claim) == 2 and claim.ack() == 2
        finally:
            admin.dispose()
