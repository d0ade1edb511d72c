"""Consumers with generations (fencing), on SQLite and Postgres: after a new incarnation of a
consumer opens, nothing an older one sends (claims, acks, releases, renewals, steps)
changes anything; takeover=True frees the predecessor's leases at once."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, text

from expstore import (
    ClaimOwnerError,
    FencedError,
    GroupSampler,
    InvalidArgumentError,
    ReplayBuffer,
    UnsupportedTypeError,
)
from expstore.claims.generations import next_generation
from expstore.errors import ClaimError
from tests.helpers import make_row, make_rows


def steps_of(claim) -> list[int]:
    return [row.exp_data.state["i"] for row in claim.batch]


def test_opening_a_consumer_takes_the_next_generation_per_name(buf: ReplayBuffer) -> None:
    assert [buf.consumer("a").generation for _ in range(3)] == [1, 2, 3]
    b = buf.consumer("b")
    assert (b.name, b.generation, b.taken_back) == ("b", 1, 0)
    assert repr(b) == "Consumer('b', generation=1)"


def test_a_zombie_ack_is_refused_and_the_checkpoint_stays(buf: ReplayBuffer) -> None:
    """The issue's scenario: the old incarnation claims, a new one opens under the same
    name and acks steps 2 and 3, then the old one's late ack of its step 2 is refused."""
    buf.store_batch(make_rows(20))
    old = buf.consumer("learner")
    stalled = old.claim(4)  # then it "pauses" (preempted, a GC pause)
    new = buf.consumer("learner")
    for step in (2, 3):
        new.claim(4).ack(checkpoint={"step": step})
    with pytest.raises(FencedError, match=r"opened again \(generation 2\) after this incarnation"):
        stalled.ack(checkpoint={"step": 2})
    assert buf.checkpoint("learner") == {"step": 3}
    assert new.checkpoint() == {"step": 3}
    assert stalled.state == "held"  # refused: still the zombie's, for what that is worth
    assert {v.state for v in buf.lineage(stalled.ids).values()} == {"leased"}  # not acked
    assert buf.queue_stats().consumed == 8


def test_zombie_claims_renewals_and_releases_are_refused_changing_nothing(
    buf: ReplayBuffer,
) -> None:
    buf.store_batch(make_rows(20))
    old = buf.consumer("learner")
    held = old.claim(5, lease_s=300)
    before = buf.lineage(held.ids)
    buf.consumer("learner")  # without takeover: the old lease stands until it runs out
    with pytest.raises(FencedError, match="its renew is refused"):
        held.renew(600)
    with pytest.raises(FencedError, match="its release is refused"):
        held.release()
    with pytest.raises(FencedError, match="its claim is refused"):
        old.claim(5)
    with pytest.raises(FencedError, match="its training step is refused"):
        with old.step() as step:
            step.save_checkpoint({"step": 99})
    assert buf.lineage(held.ids) == before  # still leased until the same moment
    stats = buf.queue_stats()
    assert (stats.leased, stats.consumed) == (5, 0)
    assert buf.checkpoint("learner", default=None) is None
    assert issubclass(FencedError, ClaimError)


def test_takeover_releases_the_predecessors_leases_at_once(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(20))
    old = buf.consumer("learner")
    first = old.claim(5, lease_s=300)
    second = old.claim(3, lease_s=300)
    other = buf.claim(2, consumer="someone-else", lease_s=300)  # not the learner's: kept
    new = buf.consumer("learner", takeover=True)
    assert new.taken_back == 8
    again = new.claim(10)
    assert steps_of(again) == list(range(8)) + [10, 11]  # the freed rows first (FIFO)
    again.ack(checkpoint={"step": 1})
    with pytest.raises(FencedError):
        first.ack()
    with pytest.raises(FencedError):
        second.release()
    assert buf.lineage(other.ids)[other.ids[0]].state == "leased"
    other.ack()
    assert buf.queue_stats().consumed == 12


def test_takeover_gives_back_whole_groups_at_once(buf: ReplayBuffer) -> None:
    for p in range(4):
        buf.store_batch([make_row(f"p{p}", f"c{i}", 0, reward=float(i)) for i in range(3)])
    order = GroupSampler(group_size=3, seed=0)
    old = buf.consumer("grpo")
    taken = old.claim(6, order=order, lease_s=300)
    assert len(taken) == 6
    new = buf.consumer("grpo", takeover=True)
    assert new.taken_back == 6
    claim = new.claim(12, order=GroupSampler(group_size=3, seed=1))
    prompts = sorted(r.exp_meta.task_id for r in claim.batch)
    assert prompts == sorted(f"p{p}" for p in range(4) for _ in range(3))
    with pytest.raises(FencedError):
        taken.ack()
    claim.ack()


def test_plain_claims_work_until_the_name_is_opened_then_are_fenced(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(20))
    plain = buf.claim(2, consumer="learner")
    plain.ack(checkpoint={"step": 1})  # as always, without generations
    late = buf.claim(2, consumer="learner")
    learner = buf.consumer("learner")
    with pytest.raises(FencedError, match="without a generation"):
        late.ack(checkpoint={"step": 0})
    with pytest.raises(FencedError, match=r"buffer.claim\(consumer=...\)"):
        buf.claim(2, consumer="learner")
    assert buf.checkpoint("learner") == {"step": 1}
    # Other names are untouched by it.
    buf.claim(2, consumer="other").ack(checkpoint={"step": 7})
    assert buf.checkpoint("other") == {"step": 7}
    assert learner.checkpoint() == {"step": 1}


def test_a_step_takes_only_this_incarnations_own_claims(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(20))
    first = buf.consumer("learner")
    old_claim = first.claim(2)
    second = buf.consumer("learner")
    stranger = buf.consumer("stranger").claim(2)
    with second.step() as step:
        with pytest.raises(FencedError, match="made by generation 1"):
            step.ack(old_claim)
        with pytest.raises(ClaimOwnerError, match="belongs to consumer 'stranger'"):
            step.ack(stranger)
        with pytest.raises(UnsupportedTypeError, match="takes a Claim"):
            step.ack("not a claim")  # type: ignore[arg-type]
        mine = second.claim(2)
        step.ack(mine)
        with pytest.raises(InvalidArgumentError, match="already acked in this step"):
            step.ack(mine)
    assert step.acked == 2 and mine.state == "acked"


def test_opening_checks_its_arguments(buf: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="consumer must be a non-empty string"):
        buf.consumer("")
    with pytest.raises(UnsupportedTypeError, match="takeover must be True or False"):
        buf.consumer("a", takeover="yes")  # type: ignore[arg-type]


def test_a_database_made_anew_fences_an_incarnation_from_before(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with ReplayBuffer(url) as buffer:
        buffer.store_batch(make_rows(4))
        learner = buffer.consumer("learner")
        handle = buffer.sql.handle
        with handle.write() as conn:  # as a restore from before the consumer opened
            conn.execute(text("UPDATE expstore_consumers SET generation = 0"))
        with pytest.raises(FencedError, match="made anew or restored"):
            learner.claim(1)


@pytest.mark.parametrize("action", ["ack", "claim"])
def test_a_new_generation_committing_meanwhile_is_waited_for_then_fences(
    pg_url: str, buffer_name: str, action: str
) -> None:
    """Postgres: the check holds the consumer's row, so an old incarnation's write that
    comes while a new generation is being opened waits for it, and is then refused (never
    lands in between)."""
    with ReplayBuffer(pg_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(10))
        old = buffer.consumer("learner")
        claim = old.claim(2)
        handle = buffer.sql.handle
        engine = create_engine(pg_url)
        try:
            with engine.connect() as opening:
                with opening.begin():
                    next_generation(handle, opening, "learner")  # not committed yet
                    outcome: list[BaseException | None] = []

                    def late() -> None:
                        try:
                            if action == "ack":
                                claim.ack(checkpoint={"step": 2})
                            else:
                                old.claim(2)
                            outcome.append(None)
                        except BaseException as exc:  # noqa: BLE001 - checked below
                            outcome.append(exc)

                    worker = threading.Thread(target=late)
                    worker.start()
                    _wait_for_a_lock_wait(engine, buffer_name)
                    assert outcome == []  # waiting on the consumer's row
                worker.join()
        finally:
            engine.dispose()
        assert len(outcome) == 1 and isinstance(outcome[0], FencedError)
        assert buffer.checkpoint("learner", default=None) is None
        assert buffer.queue_stats().leased == 2


def _wait_for_a_lock_wait(engine, buffer_name: str) -> None:
    """Until another session of this database waits on a row lock (the late write)."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    for _ in range(2000):
        with engine.connect() as conn:
            if conn.execute(waiting).scalar_one():
                return
        time.sleep(0.005)
    raise AssertionError(f"no session of {buffer_name} came to wait on the consumer's row")


def test_a_fenced_claim_used_as_a_context_manager_lets_the_blocks_error_through(
    buf: ReplayBuffer,
) -> None:
    buf.store_batch(make_rows(4))
    old = buf.consumer("learner")
    with pytest.raises(RuntimeError, match="trainer crashed"):
        with old.claim(2) as claim:
            buf.consumer("learner")
            raise RuntimeError("trainer crashed")
    assert claim.state == "held"  # the release was refused: the lease stands
    assert buf.queue_stats().leased == 2
