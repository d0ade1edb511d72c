"""One transaction per training step, on SQLite and Postgres: a step's acks, checkpoint,
policy version (with its "stale" eviction) and priorities are written all together or not
at all, also when the learner is killed between any two of them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from expstore import (
    ClaimFinishedError,
    FencedError,
    InvalidArgumentError,
    LeaseExpiredError,
    PolicyVersionError,
    ReplayBuffer,
    UnsupportedTypeError,
)
from expstore.db.schema import priorities
from tests.claims import step_learner
from tests.helpers import in_threads, make_row, make_rows

ROOT = Path(__file__).resolve().parents[2]


def _priorities(buffer: ReplayBuffer) -> dict[int, float]:
    """The buffer's stored priorities, by key."""
    handle = buffer.sql.handle
    mine = priorities.c.buffer_id == handle.buffer_id
    with handle.read() as conn:
        found = conn.execute(select(priorities.c.key, priorities.c.priority).where(mine))
        return {int(k): float(p) for k, p in found}


def _rows(fresh: int, stale: int) -> list:
    """``fresh`` rows of policy version 5 (claimed first, FIFO), then ``stale`` of 0."""
    return [make_row("t", "a", i, version=5, state={"i": i}) for i in range(fresh)] + [
        make_row("t", "a", fresh + i, version=0, state={"i": fresh + i}) for i in range(stale)
    ]


def test_a_step_writes_acks_checkpoint_version_eviction_and_priorities_at_once(
    buf: ReplayBuffer,
) -> None:
    buf.store_batch(_rows(6, 4))
    buf.set_retention(None, "stale", stale_after=1)
    learner = buf.consumer("learner")
    first, second = learner.claim(3), learner.claim(3)
    with learner.step() as step:
        step.ack(first)
        step.ack(second)
        step.save_checkpoint({"step": 1})
        step.set_policy_version(5)
        step.update_priorities(first.ids, [1.0, 2.0, 3.0])
        step.update_priorities(first.ids[:1] + second.ids, [9.0, 4.0, 5.0, 6.0])  # last wins
    assert (step.state, step.acked, step.evicted, step.updated) == ("committed", 6, 4, 6)
    assert step.checkpoint_seq == 1
    assert first.state == second.state == "acked"
    assert learner.checkpoint() == {"step": 1} and buf.policy_version() == 5
    assert len(buf) == 6  # the four of version 0 went with the version
    lineage = buf.lineage(first.ids + second.ids)
    assert {(v.state, v.checkpoint_seq) for v in lineage.values()} == {("consumed", 1)}
    assert sorted(_priorities(buf).values()) == [2.0, 3.0, 4.0, 5.0, 6.0, 9.0]
    with pytest.raises(ClaimFinishedError, match="already committed"):
        step.save_checkpoint({"step": 2})


def test_an_exception_in_the_block_writes_nothing_and_the_claims_stay_held(
    buf: ReplayBuffer,
) -> None:
    buf.store_batch(_rows(6, 0))
    learner = buf.consumer("learner")
    learner.claim(2).ack(checkpoint={"step": 1})
    claim = learner.claim(3)
    with pytest.raises(RuntimeError, match="loss is NaN"):
        with learner.step() as step:
            step.ack(claim)
            step.save_checkpoint({"step": 2})
            step.set_policy_version(3)
            step.update_priorities(claim.ids, [1.0, 1.0, 1.0])
            raise RuntimeError("loss is NaN")
    assert step.state == "abandoned" and claim.state == "held"
    assert learner.checkpoint() == {"step": 1} and buf.policy_version() is None
    assert _priorities(buf) == {}
    stats = buf.queue_stats()
    assert (stats.leased, stats.consumed) == (3, 2)
    claim.ack(checkpoint={"step": 2})  # still the learner's to finish
    assert learner.checkpoint() == {"step": 2}


@pytest.mark.parametrize("failing", ["version backwards", "claim acked meanwhile", "fenced"])
def test_a_part_that_fails_at_commit_rolls_back_every_part(buf: ReplayBuffer, failing: str) -> None:
    buf.store_batch(_rows(6, 0))
    buf.set_policy_version(4)
    learner = buf.consumer("learner")
    done, pending = learner.claim(2), learner.claim(2)
    error: type[Exception] = PolicyVersionError
    with pytest.raises(Exception) as raised:
        with learner.step() as step:
            step.ack(pending)
            step.save_checkpoint({"step": 5})
            step.update_priorities(pending.ids, [3.0, 3.0])
            step.set_policy_version(3 if failing == "version backwards" else 5)
            if failing == "claim acked meanwhile":
                step.ack(done)
                done.ack()  # by the claim itself, before the step commits
                error = ClaimFinishedError
            elif failing == "fenced":
                buf.consumer("learner")
                error = FencedError
    assert type(raised.value) is error
    assert buf.checkpoint("learner", default=None) is None
    assert buf.policy_version() == 4
    assert _priorities(buf) == {}
    assert buf.lineage(pending.ids)[pending.ids[0]].state == "leased"
    assert pending.state == "held" and step.state == "open"


def test_a_step_fails_whole_on_a_claim_taken_over_after_its_lease(buf: ReplayBuffer) -> None:
    buf.store_batch(_rows(4, 0))
    learner = buf.consumer("learner")
    slow = learner.claim(2, lease_s=0.001)
    fresh = learner.claim(2)
    time.sleep(0.05)  # the lease is over (a guarantee, not a race: any later read sees it)
    buf.claim(2, consumer="other")  # the rows go to another consumer
    with pytest.raises(LeaseExpiredError, match="claimed again"):
        with learner.step() as step:
            step.ack(fresh)
            step.ack(slow)
            step.save_checkpoint({"step": 1})
    assert buf.checkpoint("learner", default=None) is None
    assert buf.lineage(fresh.ids)[fresh.ids[0]].state == "leased"


def test_a_step_checks_what_it_is_given_when_given(buf: ReplayBuffer) -> None:
    learner = buf.consumer("learner")
    with learner.step() as step:
        with pytest.raises(UnsupportedTypeError, match="checkpoint must be JSON"):
            step.save_checkpoint({"x": object()})
        with pytest.raises(InvalidArgumentError, match="version"):
            step.set_policy_version(-1)
        with pytest.raises(UnsupportedTypeError, match="force must be True or False"):
            step.set_policy_version(1, force="yes")  # type: ignore[arg-type]
        with pytest.raises(UnsupportedTypeError, match="list of ids"):
            step.update_priorities("abc", [1.0])
    assert step.state == "committed"  # an empty step: the epoch checked, nothing written
    assert buf.checkpoint("learner", default=None) is None


def test_a_checkpoint_alone_is_a_step_too(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(2))
    learner = buf.consumer("learner")
    step = learner.step()
    step.save_checkpoint({"epoch": 3})
    step.commit()
    assert learner.checkpoint() == {"epoch": 3} and step.acked == 0


#: Where the step learner stops: after each part of its step inside the transaction,
#: and once it has committed.
PARTS = ["fenced", "checkpoint", "ack 0", "ack 1", "policy version", "priorities"]


@pytest.mark.parametrize("part", [*PARTS, "committed"])
def test_a_learner_killed_between_any_two_parts_of_a_step_leaves_all_or_nothing(
    db_url: str, buffer_name: str, part: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(_rows(6, 4))
        buffer.set_retention(None, "stale", stale_after=1)
    child = subprocess.run(
        [sys.executable, "-m", "tests.claims.step_learner", db_url, buffer_name, part],
        cwd=ROOT,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL  # stopped at that part, not before
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        stats = buffer.queue_stats()
        checkpoint = buffer.checkpoint(step_learner.CONSUMER, default=None)
        if part == "committed":  # all of it
            assert checkpoint == {"step": 1}
            assert buffer.policy_version() == step_learner.VERSION
            assert len(buffer) == 6 and (stats.consumed, stats.leased) == (6, 0)
            assert list(_priorities(buffer).values()) == [step_learner.PRIORITY] * 6
        else:  # nothing of it: the claims still held, by a learner that is gone
            assert checkpoint is None
            assert buffer.policy_version() is None
            assert len(buffer) == 10 and (stats.consumed, stats.leased) == (0, 6)
            assert _priorities(buffer) == {}
            # The next incarnation takes them back at once instead of waiting an hour.
            learner = buffer.consumer(step_learner.CONSUMER, takeover=True)
            assert learner.taken_back == 6
            assert len(learner.claim(6)) == 6


def test_steps_beside_writers_and_claimers_commit_whole_and_lose_nothing(
    db_url: str, buffer_name: str
) -> None:
    """Steps that set versions and priorities take the buffer's row before the consumer's
    and the claims' entries, as writers take it before the rows they evict: with writers
    and another learner at work, every step commits whole and no row is acked twice."""
    batches, size = 12, 8
    total = 2 * batches * size
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.set_retention(None, "stale", stale_after=2)
        acked: dict[str, list[str]] = {"a": [], "b": []}

        def work(i: int) -> None:
            if i < 2:  # a writer (rows without a version: never stale, always claimable)
                for b in range(batches):
                    buffer.store_batch(
                        [make_row(f"w{i}", "a", b * size + j, state={"i": j}) for j in range(size)]
                    )
                return
            name = "ab"[i - 2]
            learner = buffer.consumer(name)
            n = 0
            while buffer.queue_stats().consumed < total:
                claim = learner.claim(size)
                if not len(claim):
                    time.sleep(0.005)  # nothing claimable yet: writers are behind
                    continue
                n += 1
                with learner.step() as step:
                    step.ack(claim)
                    step.save_checkpoint({"step": n, "rows": len(acked[name]) + len(claim)})
                    step.set_policy_version(n + (100 if name == "b" else 0), force=True)
                    step.update_priorities(claim.ids, [float(n)] * len(claim))
                acked[name].extend(claim.ids)

        in_threads(work, 4)
        every = acked["a"] + acked["b"]
        assert len(every) == len(set(every)) == total
        for name in "ab":
            if acked[name]:
                assert buffer.checkpoint(name)["rows"] == len(acked[name])
        assert buffer.queue_stats().consumed == total
