"""Claims: the consume-once contract, on SQLite and Postgres."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expstore import (
    ChatConverter,
    ExpstoreError,
    GroupSampler,
    NumpyConverter,
    PrioritizedSampler,
    QueryBuilder,
    RateLimiter,
    ReplayBuffer,
    RewardWeightedSampler,
    UniformSampler,
)
from expstore.claims.queue import queue_of
from expstore.errors import (
    ClaimFinishedError,
    ClaimOwnerError,
    InvalidArgumentError,
    LeaseExpiredError,
    RateLimitedError,
    RowsEvictedError,
    UnknownConsumerError,
    UnsupportedTypeError,
    WaitTimeoutError,
)
from tests.helpers import make_row, make_rows, run_out


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(40))
        yield buffer


def steps(claim) -> list[int]:
    return [row.exp_data.state["i"] for row in claim.batch]


def test_fifo_claims_hand_each_row_to_one_consumer_oldest_first(buf: ReplayBuffer) -> None:
    a = buf.claim(15, consumer="a")
    b = buf.claim(15, consumer="b")
    c = buf.claim(15, consumer="c")
    assert steps(a) == list(range(15))
    assert steps(b) == list(range(15, 30))
    assert steps(c) == list(range(30, 40))  # fewer than asked: all there is
    assert len(buf.claim(5, consumer="d")) == 0  # nothing claimable: an empty claim
    assert a.ids == [r.id for r in a.batch] and len(a.keys) == 15


def test_claims_compose_with_conditions(buf: ReplayBuffer) -> None:
    cond = QueryBuilder().eq("exp_meta.task_id", "task1").build()
    claim = buf.claim(100, cond, consumer="a")
    assert steps(claim) == list(range(1, 40, 4))
    assert len(buf.claim(100, cond, consumer="b")) == 0
    assert len(buf.claim(100, consumer="b")) == 30  # the other tasks' rows


def test_acked_rows_are_never_claimed_again_and_the_checkpoint_comes_back(
    buf: ReplayBuffer,
) -> None:
    claim = buf.claim(10, consumer="learner-0")
    assert claim.ack(checkpoint={"step": 1, "epoch": 0}) == 10
    assert buf.checkpoint("learner-0") == {"step": 1, "epoch": 0}
    rest = buf.claim(100, consumer="learner-0")
    assert steps(rest) == list(range(10, 40))
    rest.ack(checkpoint={"step": 2, "epoch": 0})
    assert buf.checkpoint("learner-0") == {"step": 2, "epoch": 0}
    assert len(buf.claim(100, consumer="learner-1")) == 0
    stats = buf.queue_stats()
    assert (stats.total, stats.consumed, stats.unclaimed, stats.leased) == (40, 40, 0, 0)
    assert stats.per_consumer == {"learner-0": {"leased": 0, "expired": 0, "consumed": 40}}


def test_released_rows_go_back_to_the_queue_even_below_the_fifo_floor(buf: ReplayBuffer) -> None:
    first = buf.claim(10, consumer="a")
    second = buf.claim(10, consumer="a")
    assert first.release() == 10
    again = buf.claim(10, consumer="b")  # the released rows come first again
    assert steps(again) == list(range(10))
    assert second.ack() == 10
    assert steps(buf.claim(100, consumer="c")) == list(range(20, 40))


def test_an_expired_lease_returns_rows_and_a_late_ack_is_refused_once_reclaimed(
    buf: ReplayBuffer,
) -> None:
    dead = buf.claim(5, consumer="a", lease_s=0.2)
    time.sleep(0.3)
    taken = buf.claim(5, consumer="b")
    assert steps(taken) == list(range(5))
    with pytest.raises(LeaseExpiredError, match="claimed again"):
        dead.ack(checkpoint={"step": 9})
    # nothing changed: b still holds them, a has no checkpoint
    with pytest.raises(UnknownConsumerError):
        buf.checkpoint("a")
    assert {v.consumer for v in buf.lineage(taken.ids).values()} == {"b"}
    assert taken.ack() == 5


def test_a_late_ack_succeeds_when_nobody_claimed_the_rows_meanwhile(buf: ReplayBuffer) -> None:
    slow = buf.claim(5, consumer="a", lease_s=0.2)
    time.sleep(0.3)
    assert buf.queue_stats().expired == 5
    assert slow.ack() == 5
    assert buf.queue_stats().consumed == 5


def test_renew_extends_the_lease(buf: ReplayBuffer) -> None:
    claim = buf.claim(5, consumer="a", lease_s=0.3)
    until = claim.renew(60)
    assert until >= claim.claimed_at + 59
    time.sleep(0.4)
    assert len(buf.claim(5, order="oldest", consumer="b")) == 5
    assert steps(buf.claim(100, consumer="c"))[:1] == [10]  # a's rows stayed held


def test_acking_twice_or_after_release_and_another_consumers_claim_are_refused(
    buf: ReplayBuffer,
) -> None:
    claim = buf.claim(5, consumer="a")
    with pytest.raises(ClaimOwnerError, match="belongs to consumer 'a'"):
        claim.ack(consumer="b")
    claim.ack()
    with pytest.raises(ClaimFinishedError):
        claim.ack()
    other = buf.claim(5, consumer="a")
    other.release()
    with pytest.raises(ClaimFinishedError):
        other.ack()
    assert buf.queue_stats().consumed == 5


def test_a_non_json_checkpoint_is_refused_and_nothing_is_acked(buf: ReplayBuffer) -> None:
    claim = buf.claim(5, consumer="a")
    for bad in ({"w": np.zeros(2)}, {"x": float("nan")}, {1j: 2}):
        with pytest.raises(UnsupportedTypeError, match="must be JSON"):
            claim.ack(checkpoint=bad)
    assert buf.queue_stats().leased == 5
    assert claim.state == "held"
    claim.ack(checkpoint=[1, "two", {"three": None}])
    assert buf.checkpoint("a") == [1, "two", {"three": None}]


def test_unknown_consumer_checkpoint(buf: ReplayBuffer) -> None:
    with pytest.raises(UnknownConsumerError, match="never acked"):
        buf.checkpoint("nobody")
    assert buf.checkpoint("nobody", default={"step": 0}) == {"step": 0}
    assert buf.checkpoint("nobody", default=None) is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 0}, InvalidArgumentError),
        ({"n": -3}, InvalidArgumentError),
        ({"n": 2.5}, InvalidArgumentError),
        ({"n": 5, "lease_s": -1}, InvalidArgumentError),
        ({"n": 5, "lease_s": 0}, InvalidArgumentError),
        ({"n": 5, "lease_s": float("inf")}, InvalidArgumentError),
        ({"n": 5, "lease_s": "10"}, UnsupportedTypeError),
        ({"n": 5, "consumer": ""}, InvalidArgumentError),
        ({"n": 5, "consumer": 3}, InvalidArgumentError),
        ({"n": 5, "order": "lifo"}, UnsupportedTypeError),
        ({"n": 5, "wait_s": -1}, InvalidArgumentError),
    ],
)
def test_bad_claim_arguments_are_refused_and_nothing_is_claimed(
    buf: ReplayBuffer, kwargs: dict, error: type[Exception]
) -> None:
    args = {"consumer": "a", **kwargs}
    n = args.pop("n")
    with pytest.raises(error):
        buf.claim(n, **args)
    assert buf.queue_stats().unclaimed == 40


def test_random_and_sampler_orders_take_only_claimable_rows(buf: ReplayBuffer) -> None:
    first = buf.claim(30, consumer="a", order="random")
    assert len(set(first.ids)) == 30
    assert steps(first) != list(range(30))  # not oldest first (odds of that: none)
    rest = buf.claim(30, consumer="b", order=PrioritizedSampler(seed=0))
    assert len(rest) == 10
    assert not set(rest.ids) & set(first.ids)
    assert len(buf.claim(5, consumer="c", order="random")) == 0


def test_a_converter_builds_the_claimed_batch(buf: ReplayBuffer) -> None:
    claim = buf.claim(8, consumer="a", converter=NumpyConverter({"r": "exp_data.reward_t"}))
    assert claim.batch["r"].tolist() == [float(i) for i in range(8)]
    assert len(claim) == 8


def test_an_ack_of_rows_evicted_while_claimed_raises_and_changes_nothing(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=20) as buffer:
        buffer.store_batch(make_rows(20))
        claim = buffer.claim(10, consumer="a")
        buffer.store_batch(make_rows(5))  # evicts the 5 oldest, which the claim holds
        with pytest.raises(RowsEvictedError, match=r"5 of its 10 rows left") as raised:
            claim.ack({"step": 1})
        assert "5 by capacity eviction (policy 'fifo')" in str(raised.value)
        assert "allow_evicted=True" in str(raised.value)
        assert (raised.value.evicted, raised.value.reasons) == (5, {"capacity": 5})
        assert buffer.queue_stats().leased == 5 and buffer.queue_stats().consumed == 0
        assert buffer.checkpoint("a", default=None) is None  # never a checkpoint stored
        assert claim.ack({"step": 1}, allow_evicted=True) == 5  # knowingly: the rest
        assert buffer.queue_stats().consumed == 5
        assert buffer.checkpoint("a") == {"step": 1}


def test_lineage_says_who_consumed_each_row_when_and_with_which_checkpoint(
    buf: ReplayBuffer,
) -> None:
    acked = buf.claim(3, consumer="a")
    acked.ack(checkpoint={"step": 7})
    held = buf.claim(2, consumer="b")
    never = [r.id for r in buf.query(limit=40)][-1]
    found = buf.lineage([*acked.ids, *held.ids, never, "not-stored"])
    assert set(found) == {*acked.ids, *held.ids, never}
    record = found[acked.ids[0]]
    assert (record.state, record.consumer, record.checkpoint) == ("consumed", "a", {"step": 7})
    assert record.acked_at >= record.claimed_at
    assert record.times_claimed == 1
    assert found[held.ids[0]].state == "leased" and found[held.ids[0]].consumer == "b"
    assert found[never].state == "unclaimed" and found[never].times_claimed == 0


def test_wait_for_returns_when_rows_arrive_and_times_out_otherwise(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        with pytest.raises(WaitTimeoutError, match="found 0"):
            buffer.wait_for(1, timeout_s=0.1)

        def later() -> None:
            time.sleep(0.3)
            with ReplayBuffer(db_url, name=buffer_name) as writer:
                writer.store_batch(make_rows(12))

        thread = threading.Thread(target=later)
        thread.start()
        assert buffer.wait_for(10, timeout_s=30) == 10
        claim = buffer.claim(12, consumer="a", wait_s=30)
        thread.join()
        assert len(claim) == 12
        with pytest.raises(WaitTimeoutError, match="no row became claimable"):
            buffer.claim(1, consumer="b", wait_s=0.1)
        assert buffer.wait_for(12, timeout_s=0) == 12
        with pytest.raises(WaitTimeoutError):
            buffer.wait_for(1, timeout_s=0.1, claimable=True)


def test_a_claim_used_as_a_context_manager_is_released_on_error(buf: ReplayBuffer) -> None:
    with pytest.raises(RuntimeError), buf.claim(5, consumer="a") as claim:
        raise RuntimeError("training step failed")
    assert claim.state == "released"
    assert buf.queue_stats().unclaimed == 40


def test_a_row_stored_after_the_newest_rows_were_deleted_is_claimed(buf: ReplayBuffer) -> None:
    """SQLite gives a new row the table's largest key + 1, which after the newest rows
    were deleted lies below where this handle's FIFO claims had got to."""
    buf.claim(40, consumer="a").ack()
    newest = QueryBuilder().gte("exp_data.state.i", 35).build()
    assert buf.delete(newest) == 5
    buf.store_batch(make_rows(1))
    again = buf.claim(10, consumer="a")
    assert steps(again) == [0]
    assert again.ids == [r.id for r in buf.query(limit=40)][-1:]


def test_threads_sharing_one_handle_claim_disjoint_rows(buf: ReplayBuffer) -> None:
    taken: list[list[str]] = []

    def claim_some() -> None:
        mine: list[str] = []
        for _ in range(4):
            claim = buf.claim(3, consumer=threading.current_thread().name)
            mine += claim.ids
            claim.ack()
        taken.append(mine)

    threads = [threading.Thread(target=claim_some, name=f"t{i}") for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    every = [row_id for ids in taken for row_id in ids]
    assert len(every) == len(set(every)) == 36
    assert buf.queue_stats().consumed == 36


def test_a_claim_of_no_rows_is_finished_only_by_its_consumer(buf: ReplayBuffer) -> None:
    """Found by review: with no entries to check, an ack as another consumer went through
    and overwrote that consumer's checkpoint."""
    buf.claim(40, consumer="a").ack(checkpoint={"step": 7})
    empty = buf.claim(5, consumer="b")
    assert len(empty) == 0
    with pytest.raises(ClaimOwnerError, match="belongs to consumer 'b'"):
        empty.ack(consumer="a", checkpoint={"step": 0})
    assert buf.checkpoint("a") == {"step": 7}
    assert empty.ack(consumer="b") == 0


# -- issue 32: min_n, samplers' own bounds, converters that fail, checkpoints as given --


def test_a_claim_with_min_n_returns_once_that_many_rows_are_claimable(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(3))
        writer = threading.Timer(0.3, lambda: buffer.store_batch(make_rows(2)))
        writer.start()
        started = time.monotonic()
        claim = buffer.claim(10, consumer="a", wait_s=120, min_batch_size=5)
        writer.join()
        # Five rows, not the ten asked for, and long before the wait of 120 s ran out.
        assert len(claim) == 5 and time.monotonic() - started < 60
        buffer.store_batch(make_rows(7))
        assert (
            len(buffer.claim(10, consumer="a", wait_s=120, min_batch_size=1)) == 7
        )  # there already


def test_a_claim_whose_min_n_never_comes_raises_and_claims_nothing(buf: ReplayBuffer) -> None:
    buf.claim(38, consumer="a")
    found = "waited 0.1 s for min_batch_size=3 claimable rows, found 2"
    with pytest.raises(WaitTimeoutError, match=found):
        buf.claim(5, consumer="b", wait_s=0.1, min_batch_size=3)
    assert buf.queue_stats().leased == 38


def test_a_claim_that_finds_fewer_than_min_n_after_counting_takes_nothing(
    buf: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the count and the claim other claimers may take rows: a claim that then
    finds fewer than min_n rolls back and waits again, within the same deadline."""
    buf.claim(37, consumer="a")
    monkeypatch.setattr(queue_of(buf.sql.handle), "count", lambda scope, upto, claimable: upto)
    with pytest.raises(WaitTimeoutError, match="for min_batch_size=4 claimable rows, found 3"):
        buf.claim(8, consumer="b", wait_s=0.2, min_batch_size=4)
    stats = buf.queue_stats()
    assert stats.leased == 37 and stats.per_consumer.get("b") is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"min_batch_size": 2}, "give wait_s= too"),
        ({"min_batch_size": 0, "wait_s": 1}, "min_batch_size must be None or an int >= 1"),
        ({"min_batch_size": 6, "wait_s": 1}, "<= 5"),
        ({"min_batch_size": 2.0, "wait_s": 1}, "min_batch_size must be"),
    ],
)
def test_min_batch_size_is_checked(buf: ReplayBuffer, kwargs, error: str) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgumentError, match=error):
        buf.claim(5, consumer="a", **kwargs)
    assert buf.queue_stats().leased == 0


def test_a_group_claim_with_min_n_returns_whole_groups_once_that_many_are_ready(
    buf: ReplayBuffer,
) -> None:
    def group(prompt: str, rewards: list[float]) -> list:
        return [make_row(prompt, f"c{i}", 0, reward=r) for i, r in enumerate(rewards)]

    fresh = ReplayBuffer(buf.storage.url, name=buf.storage.name + "_g")
    with fresh:
        fresh.store_batch(group("p0", [0.0, 1.0, 0.0, 1.0]) + group("p1", [1.0, 0.0]))
        sampler = GroupSampler(group_size=4)
        with pytest.raises(
            InvalidArgumentError, match="a multiple of 4; got batch_size=8, min_batch_size=2"
        ):
            fresh.claim(8, consumer="c", order=sampler, wait_s=1, min_batch_size=2)
        with pytest.raises(WaitTimeoutError, match="for min_batch_size=8 claimable rows, in whole"):
            fresh.claim(12, consumer="c", order=sampler, wait_s=0.1, min_batch_size=8)
        completes = threading.Timer(0.2, lambda: fresh.store_batch(group("p1", [1.0, 1.0])))
        completes.start()
        claim = fresh.claim(12, consumer="c", order=sampler, wait_s=120, min_batch_size=8)
        completes.join()
        assert len(claim) == 8
        assert sorted({r.exp_meta.task_id for r in claim.batch}) == ["p0", "p1"]


def test_a_claim_wait_that_times_out_says_what_each_side_is_doing(buf: ReplayBuffer) -> None:
    buf.claim(40, consumer="a")
    with pytest.raises(WaitTimeoutError) as info:
        buf.claim(1, consumer="b", wait_s=0.05)
    message = str(info.value)
    assert "holds 40 rows; inserted 40 ever, of which 0 discarded" in message
    assert "actors inserted last" in message and "no rate limit" in message
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=2.0, timeout_s=1))
    with pytest.raises(WaitTimeoutError) as info:
        buf.claim(1, consumer="b", wait_s=0.05)
    message = str(info.value)
    assert "inserted 40, discarded 0, sampled 0 (min_size=1, samples_per_insert=2" in message
    assert "learners have not sampled since the limit was set" in message
    with pytest.raises(WaitTimeoutError, match="found 0. Rate limit: Since the limit was set"):
        buf.wait_for(1, timeout_s=0.05, claimable=True)


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: UniformSampler(max_staleness=1, seed=0),
        lambda: PrioritizedSampler(max_staleness=1, seed=0),
        lambda: RewardWeightedSampler(max_staleness=1, seed=0),
    ],
    ids=["uniform", "prioritized", "reward_weighted"],
)
def test_a_sampler_ordered_claim_keeps_the_samplers_own_max_staleness(
    db_url: str, buffer_name: str, sampler
) -> None:  # noqa: ANN001
    """Issue 32: a claim that ran short of rows its sampler drew filled up at random among
    every claimable row, stale ones included."""
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch([make_row("old", step=i, reward=1.0, version=0) for i in range(20)])
        buffer.store_batch([make_row("new", step=i, reward=1.0, version=10) for i in range(5)])
        buffer.set_policy_version(10)
        claim = buffer.claim(10, consumer="x", order=sampler())
        assert sorted(r.exp_meta.step for r in claim.batch) == [0, 1, 2, 3, 4]
        assert {r.exp_meta.policy_version for r in claim.batch} == {10}
        # The claim's own bound, when tighter, holds too.
        buffer.set_policy_version(11)
        tighter = UniformSampler(max_staleness=5, seed=0)
        assert len(buffer.claim(10, consumer="y", order=tighter, max_staleness=0)) == 0
        with pytest.raises(WaitTimeoutError):
            buffer.claim(1, consumer="y", order=sampler(), wait_s=0.05)


def test_a_reward_weighted_claim_never_returns_rows_without_a_reward(buf: ReplayBuffer) -> None:
    buf.store_batch([make_row("unrewarded", step=i) for i in range(10)])
    claim = buf.claim(100, consumer="x", order=RewardWeightedSampler(seed=0))
    assert len(claim) == 40
    assert all(r.exp_data.reward_t is not None for r in claim.batch)


def test_a_claim_whose_converter_fails_is_released_and_its_samples_refunded(
    buf: ReplayBuffer,
) -> None:
    """Issue 32: the rows stayed leased (and counted against the rate limit) for the whole
    lease, held by a claim the caller never got."""
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=1))
    with pytest.raises(ExpstoreError):
        buf.claim(5, consumer="x", converter=ChatConverter())
    stats = buf.queue_stats()
    assert stats.leased == 0 and stats.unclaimed == 40
    assert buf.rate_limit_stats().sampled == 0  # type: ignore[union-attr]
    assert steps(buf.claim(5, consumer="x")) == [0, 1, 2, 3, 4]  # the same rows, at once


#: Checkpoints that came back different before issue 32, and now come back as given.
ODD_CHECKPOINTS = [
    1.0,
    -0.0,
    2**64 + 1,
    10**400,
    {"x": 1e20},
    {"x": 1.5e-300, "y": [True, False, None, 0, -1, "\u0000", "\ud800"]},
    "",
    None,
    [],
    {},
]


@pytest.mark.parametrize("checkpoint", ODD_CHECKPOINTS, ids=repr)
def test_a_checkpoint_comes_back_exactly_as_given(buf: ReplayBuffer, checkpoint) -> None:  # noqa: ANN001
    claim = buf.claim(1, consumer="c")
    claim.ack(checkpoint=checkpoint)
    assert_same(buf.checkpoint("c"), checkpoint)
    assert_same(buf.lineage(claim.ids)[claim.ids[0]].checkpoint, checkpoint)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("checkpoint", "error", "message"),
    [
        ({0: 10}, UnsupportedTypeError, "has the key 0 of type int"),
        ({1: "a", "1": "b"}, UnsupportedTypeError, "two keys could even become one"),
        ((1, 2), UnsupportedTypeError, "is a tuple; use a list"),
        ({"x": float("inf")}, UnsupportedTypeError, r"checkpoint\['x'\] is inf"),
        (_nested(1_100), InvalidArgumentError, "nest more than 100 levels deep"),
        ({"x": {1, 2}}, UnsupportedTypeError, r"checkpoint\['x'\] is a set"),
        (10**5000, UnsupportedTypeError, "digits"),
    ],
    ids=["int key", "colliding keys", "tuple", "inf", "1100 deep", "set", "10**5000"],
)
def test_a_checkpoint_that_would_not_come_back_as_given_is_refused(
    buf: ReplayBuffer,
    checkpoint,
    error,
    message: str,  # noqa: ANN001
) -> None:
    claim = buf.claim(5, consumer="a")
    with pytest.raises(error, match=message):
        claim.ack(checkpoint=checkpoint)
    assert claim.state == "held" and buf.queue_stats().leased == 5
    assert buf.checkpoint("a", default="none") == "none"


def assert_same(got: object, want: object) -> None:
    """Equal, of the same types all the way down, and -0.0 still negative."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif isinstance(want, float):
        assert isinstance(got, float) and repr(got) == repr(want)
    else:
        assert got == want


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(checkpoint=json_values)
def test_any_accepted_checkpoint_comes_back_equal_and_of_the_same_types(
    buf: ReplayBuffer, checkpoint: object
) -> None:
    buf.claim(1, consumer="prop").ack(checkpoint=checkpoint)
    assert_same(buf.checkpoint("prop"), checkpoint)


def _groups(buffer: ReplayBuffer, count: int, size: int = 4, start: int = 0) -> None:
    for p in range(start, start + count):
        buffer.store_batch(
            [make_row(f"p{p}", f"c{i}", i, reward=float(i % 2)) for i in range(size)]
        )


def test_a_claims_wait_bounds_its_wait_on_the_rate_limit(buffer: ReplayBuffer) -> None:
    """Found by a user's trial: a limit with a long timeout held claim(wait=0.3) for the
    limit's whole timeout."""
    from expstore import GroupSampler, RateLimiter

    buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=0.5, timeout_s=600))
    _groups(buffer, 2)  # 8 rows inserted: 4 samples of budget
    sampler = GroupSampler(group_size=4)
    buffer.claim(4, consumer="c", order=sampler).ack()  # the budget is spent; p1 ready
    raised: list[BaseException] = []

    def claim() -> None:
        try:
            buffer.claim(4, consumer="c", order=sampler, wait_s=0.3)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            raised.append(exc)

    thread = threading.Thread(target=claim)
    thread.start()
    thread.join(120)  # far below the limit's 600 s
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], RateLimitedError)
    waited = re.search(r"waited ([0-9.]+) s", str(raised[0]))
    assert waited is not None and float(waited.group(1)) <= 0.3


def test_min_n_takes_what_the_rate_limit_allows(buffer: ReplayBuffer) -> None:
    """Found by a user's trial: with groups ready and budget for one, claim(8, min_batch_size=4)
    raised RateLimitedError instead of taking the one group."""
    from expstore import GroupSampler, RateLimiter

    buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=0.5, timeout_s=2))
    _groups(buffer, 3)  # 12 rows inserted: 6 samples of budget, three groups ready
    sampler = GroupSampler(group_size=4)
    claim = buffer.claim(8, consumer="c", order=sampler, wait_s=1, min_batch_size=4)
    assert [r.exp_meta.task_id for r in claim.batch] == ["p0"] * 4
    stats = buffer.rate_limit_stats()
    assert stats is not None and stats.sampled == 4


def test_released_and_taken_over_claims_give_their_samples_back(buffer: ReplayBuffer) -> None:
    """Found by a user's trial: rows released, or given back by a takeover, stayed counted
    as sampled, so a consume-once queue under samples_per_insert=1 lost budget at every
    restart until its last groups could never be claimed."""
    from expstore import GroupSampler, RateLimiter

    buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=2))
    _groups(buffer, 2)
    sampler = GroupSampler(group_size=4)
    first = buffer.claim(4, consumer="c", order=sampler)
    first.release()
    stats = buffer.rate_limit_stats()
    assert stats is not None and stats.sampled == 0
    dead = buffer.consumer("learner")
    dead.claim(8, order=sampler)  # then the learner dies holding it
    reborn = buffer.consumer("learner", takeover=True)
    assert reborn.taken_back == 8
    stats = buffer.rate_limit_stats()
    assert stats is not None and stats.sampled == 0
    claim = reborn.claim(8, order=sampler)
    assert len(claim) == 8
    claim.ack()
    stats = buffer.rate_limit_stats()
    assert stats is not None and stats.sampled == 8


@pytest.fixture
def two_buffers(db_url: str, buffer_name: str) -> Iterator[tuple[ReplayBuffer, ReplayBuffer]]:
    """A prompts buffer and a rollouts buffer of one database."""
    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        with ReplayBuffer(db_url, name=buffer_name + "_out") as rollouts:
            yield prompts, rollouts


def _completions(prompt: str, n: int = 4) -> list[Any]:
    return [make_row(prompt, f"c{i}", i, reward=float(i)) for i in range(n)]


def test_ack_with_produce_stores_the_rows_and_acks_in_one_transaction(
    two_buffers: tuple[ReplayBuffer, ReplayBuffer],
) -> None:
    prompts, rollouts = two_buffers
    prompts.store_batch([make_row("p0"), make_row("p1")])
    claim = prompts.claim(1, consumer="actor")
    made = _completions("p0")
    assert claim.ack(checkpoint={"done": 1}, produce=made, into=rollouts) == 1
    assert claim.produced is not None and claim.produced.stored == 4
    assert sorted(r.id for r in rollouts.query()) == sorted(r.id for r in made)
    assert prompts.checkpoint("actor") == {"done": 1}
    assert prompts.queue_stats().consumed == 1
    # An ack retried after its commit stores nothing twice.
    with pytest.raises(ClaimFinishedError):
        claim.ack(checkpoint={"done": 1}, produce=made, into=rollouts)
    assert len(rollouts) == 4


def test_an_ack_with_produce_that_fails_stores_nothing(
    two_buffers: tuple[ReplayBuffer, ReplayBuffer],
) -> None:
    from expstore.errors import DuplicateIdError

    prompts, rollouts = two_buffers
    prompts.store_batch([make_row("p0"), make_row("p1")])
    made = _completions("p0")
    rollouts.store_batch(made[:1])  # one of the ids is stored already
    claim = prompts.claim(1, consumer="actor")
    with pytest.raises(DuplicateIdError):
        claim.ack(checkpoint={"done": 1}, produce=made, into=rollouts)
    assert len(rollouts) == 1 and claim.state == "held"
    assert prompts.checkpoint("actor", default=None) is None
    assert prompts.queue_stats().leased == 1
    # The lease lost to another actor: nothing of the attempt is stored.
    late = prompts.claim(1, consumer="slow", lease_s=0.1)
    time.sleep(0.3)
    prompts.claim(1, consumer="other")  # takes the row over
    with pytest.raises(LeaseExpiredError):
        late.ack(produce=_completions("p1"), into=rollouts)
    assert len(rollouts) == 1
    # The first claim can still produce and ack.
    assert claim.ack(produce=made[1:], into=rollouts) == 1
    assert len(rollouts) == 4


def _counted(buffer: ReplayBuffer) -> int | None:
    """The buffer's rows as its row count says (kept by every write)."""
    from expstore.lifecycle.registry import list_buffers

    handle = buffer.sql._handle
    with handle.read() as conn:
        return {b.name: b.rows for b in list_buffers(conn)}[handle.name]


def test_an_ack_with_produce_alone_keeps_every_check(
    two_buffers: tuple[ReplayBuffer, ReplayBuffer],
) -> None:
    """An ack with produce and no checkpoint (on Postgres: three round trips, its rows,
    their lineage and the COMMIT sent together; expstore.db.pipeline): the rows stored,
    counted and linked to the claim, the claim acked; a duplicate id stores and acks
    nothing; a zombie's ack is fenced, storing nothing; an ack retried after its commit is
    told so."""
    from expstore.errors import DuplicateIdError, FencedError

    prompts, rollouts = two_buffers
    prompts.store_batch([make_row("p0"), make_row("p1"), make_row("p2")])
    me = prompts.consumer("actor")
    claim = me.claim(1)
    made = _completions(claim.ids[0])
    stored = make_row("x")
    rollouts.store_batch([stored])
    with pytest.raises(DuplicateIdError):
        claim.ack(produce=[*made, stored], into=rollouts)
    assert len(rollouts) == 1 and claim.state == "held"
    assert prompts.queue_stats().leased == 1
    assert claim.ack(produce=made, into=rollouts) == 1
    assert claim.produced is not None and claim.produced.stored == 4
    assert len(rollouts) == 5 and _counted(rollouts) == 5
    links = rollouts.lineage([r.id for r in made])
    assert {link.produced_by.claim_id for link in links.values() if link.produced_by} == {
        claim.claim_id
    }
    assert prompts.lineage(claim.ids)[claim.ids[0]].state == "consumed"
    with pytest.raises(ClaimFinishedError):
        claim.ack(produce=made, into=rollouts)
    assert len(rollouts) == 5
    stalled = me.claim(1)
    prompts.consumer("actor")  # a new incarnation: the old one is fenced
    with pytest.raises(FencedError):
        stalled.ack(produce=_completions(stalled.ids[0]), into=rollouts)
    assert len(rollouts) == 5 and prompts.queue_stats().consumed == 1


def test_an_ack_with_produce_alone_into_a_capped_buffer_evicts_as_a_write_does(
    two_buffers: tuple[ReplayBuffer, ReplayBuffer],
) -> None:
    """Produced rows beyond the target buffer's capacity are evicted by the ack's
    write, as a store evicts them (the write's insert is then not left for the COMMIT)."""
    prompts, rollouts = two_buffers
    rollouts.set_retention(6)
    prompts.store_batch([make_row(f"p{i}") for i in range(3)])
    for _ in range(3):
        claim = prompts.claim(1, consumer="actor")
        assert claim.ack(produce=_completions(claim.ids[0]), into=rollouts) == 1
    assert len(rollouts) == 6 and _counted(rollouts) == 6
    assert prompts.queue_stats().consumed == 3


def test_an_ack_whose_target_changed_after_its_state_was_read_writes_again(
    db_url: str, two_buffers: tuple[ReplayBuffer, ReplayBuffer], monkeypatch: Any
) -> None:
    """On Postgres an ack with produce reads the target's state without its row, and
    takes the row with the statements it sends with the COMMIT, checking the settings
    unchanged: a capacity set in between (another transaction, committed first) fails
    the check, and the ack is made again holding the row, the capacity applied."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite's writes hold the database from their first statement")
    from sqlalchemy import create_engine, update

    import expstore.storage.writer as writer
    from expstore.db.schema import buffers

    prompts, rollouts = two_buffers
    prompts.store_batch([make_row("p0")])
    rollouts.store_batch([make_row("x") for _ in range(3)])
    real, changed = writer._with_commit, []
    target_id = rollouts.sql._handle.buffer_id

    def meanwhile(ctx: Any, tail: Any) -> bool:
        if not changed:  # as another process sets it (this one's pool is the ack's)
            other = create_engine(db_url)
            with other.begin() as conn:
                changed.append(
                    conn.execute(
                        update(buffers).where(buffers.c.id == target_id).values(capacity=5)
                    ).rowcount
                )
            other.dispose()
        return real(ctx, tail)

    monkeypatch.setattr(writer, "_with_commit", meanwhile)
    claim = prompts.claim(1, consumer="actor")
    assert claim.ack(produce=_completions("p0"), into=rollouts) == 1
    assert changed and len(rollouts) == 5 and _counted(rollouts) == 5
    assert claim.produced is not None and claim.produced.stored == 4
    assert prompts.queue_stats().consumed == 1


def test_produce_into_a_buffer_of_another_database_is_refused(tmp_path: Any) -> None:
    with ReplayBuffer(f"sqlite:///{tmp_path}/a.db") as prompts:
        with ReplayBuffer(f"sqlite:///{tmp_path}/b.db") as elsewhere:
            prompts.store_batch([make_row("p0")])
            claim = prompts.claim(1, consumer="actor")
            with pytest.raises(InvalidArgumentError, match="one transaction cannot span"):
                claim.ack(produce=_completions("p0"), into=elsewhere)
            with pytest.raises(InvalidArgumentError, match="takes both"):
                claim.ack(produce=_completions("p0"))
            with pytest.raises(UnsupportedTypeError, match="ReplayBuffer"):
                claim.ack(produce=_completions("p0"), into="rollouts")
            assert len(elsewhere) == 0 and claim.state == "held"
    memory, other_memory = ReplayBuffer(), ReplayBuffer()
    memory.store_batch([make_row("p0")])
    claim = memory.claim(1, consumer="actor")
    with pytest.raises(InvalidArgumentError, match="one transaction cannot span"):
        claim.ack(produce=_completions("p0"), into=other_memory)


def _actor_killed_by(script: str, db_url: str, buffer_name: str) -> None:
    """Store one prompt, then run ``script`` (url, buffer name) in a child process, which
    must end killed by SIGKILL."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        prompts.store_batch([make_row("p0")])
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-c", script, db_url, buffer_name], cwd=root, check=False
    )
    assert child.returncode == -signal.SIGKILL


_KILLED_MID_ACK = """
import os, signal, sys
import expstore.claims.api as front
from expstore import ReplayBuffer
from tests.helpers import make_row

url, name = sys.argv[1], sys.argv[2]
write_in = front.write_in

def write_then_die(*args, **kwargs):
    done = write_in(*args, **kwargs)  # the completions are written, not committed
    os.kill(os.getpid(), signal.SIGKILL)
    return done

front.write_in = write_then_die
with ReplayBuffer(url, name=name) as prompts, ReplayBuffer(url, name=name + "_out") as out:
    claim = prompts.claim(1, consumer="actor", lease_s=600)
    made = [make_row("p0", f"c{i}", i) for i in range(4)]
    claim.ack(checkpoint={"done": 1}, produce=made, into=out)
"""


def test_an_actor_killed_inside_its_produce_ack_leaves_nothing_and_the_prompt_returns(
    db_url: str, buffer_name: str
) -> None:
    _actor_killed_by(_KILLED_MID_ACK, db_url, buffer_name)
    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        with ReplayBuffer(db_url, name=buffer_name + "_out") as out:
            assert len(out) == 0
            assert prompts.checkpoint("actor", default=None) is None
            run_out(prompts)  # the dead actor's lease runs out
            again = prompts.claim(1, consumer="actor", wait_s=30)
            assert len(again) == 1
            again.ack(produce=_completions("p0"), into=out)
            assert len(out) == 4 and prompts.queue_stats().consumed == 1


def test_progress_saved_on_a_claim_reaches_whoever_claims_the_row_next(
    buffer: ReplayBuffer,
) -> None:
    buffer.store_batch([make_row("p0"), make_row("p1")])
    first = buffer.claim(1, consumer="actor-0", lease_s=60)
    assert first.progress == {}
    state = {"tokens": [1, 2, 3], "versions": [4, 4, 5]}
    first.save_progress(state)
    assert first.progress == {first.ids[0]: state}
    run_out(buffer, first)  # actor-0 stalls past its lease
    second = buffer.claim(1, consumer="actor-1")
    assert second.ids == first.ids and second.progress == {first.ids[0]: state}
    with pytest.raises(LeaseExpiredError, match="nothing was saved"):
        first.save_progress({"tokens": [9]})  # the zombie changes nothing
    assert buffer.claim(1, consumer="actor-2").progress == {}  # p1: nothing saved
    second.save_progress({"tokens": [1, 2, 3, 4]})
    second.ack()  # the ack removes the progress
    assert queue_of(buffer.sql.handle).progress_of(second.keys.tolist()) == {}


def test_bad_progress_is_refused_and_nothing_saved(buffer: ReplayBuffer) -> None:
    from expstore import claims as front

    buffer.store_batch([make_row("p0"), make_row("p1")])
    claim = buffer.claim(2, consumer="actor")
    with pytest.raises(InvalidArgumentError, match="row_id"):
        claim.save_progress({"tokens": [1]})
    with pytest.raises(InvalidArgumentError, match="not one of"):
        claim.save_progress({"tokens": [1]}, row_id="nope")
    with pytest.raises(UnsupportedTypeError, match="progress"):
        claim.save_progress({"tokens": (1, 2)}, row_id=claim.ids[0])
    with pytest.raises(UnsupportedTypeError, match="progress"):
        claim.save_progress({1: "a"}, row_id=claim.ids[0])
    too_big = "x" * (front.MAX_PROGRESS_BYTES + 1)
    with pytest.raises(InvalidArgumentError, match="bytes of JSON"):
        claim.save_progress(too_big, row_id=claim.ids[0])
    assert claim.progress == {}
    claim.release()
    with pytest.raises(ClaimFinishedError):
        claim.save_progress({"tokens": [1]}, row_id=claim.ids[0])


_KILLED_AFTER_PROGRESS = """
import os, signal, sys
from expstore import ReplayBuffer

url, name = sys.argv[1], sys.argv[2]
with ReplayBuffer(url, name=name) as prompts:
    claim = prompts.claim(1, consumer="actor", lease_s=600)
    claim.save_progress({"tokens": list(range(100)), "versions": [7]})
    os.kill(os.getpid(), signal.SIGKILL)  # killed mid-generation
"""


def test_an_actor_killed_after_saving_progress_leaves_it_for_the_next(
    db_url: str, buffer_name: str
) -> None:
    _actor_killed_by(_KILLED_AFTER_PROGRESS, db_url, buffer_name)
    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        run_out(prompts)  # the dead actor's lease runs out
        again = prompts.claim(1, consumer="actor", wait_s=30)
        assert list(again.progress.values()) == [{"tokens": list(range(100)), "versions": [7]}]


def test_a_rollout_over_several_versions_counts_its_oldest_segment_or_its_newest(
    buffer: ReplayBuffer, db_url: str, buffer_name: str
) -> None:
    from expstore import DataRow, Experience, ExpMeta

    def completion(i: int, **versions: int) -> DataRow:
        meta = ExpMeta(task_id=f"p{i}", agent_id="actor", step=0, **versions)
        return DataRow(id=f"c{i}", exp_meta=meta, exp_data=Experience())

    with ReplayBuffer(db_url, name=buffer_name + "_out") as out:
        out.store_batch(
            [
                completion(0, oldest_version=3, newest_version=5),  # counts 3, the default
                completion(1, oldest_version=3, newest_version=5, policy_version=5),
                completion(2, policy_version=5),  # one segment
            ]
        )
        out.set_policy_version(5)
        claim = out.claim(10, consumer="learner", max_staleness=1)
        assert sorted(claim.ids) == ["c1", "c2"]  # c0's oldest segment is 2 versions behind
        stored = {r.id: r.exp_meta for r in out.query()}
        assert (stored["c0"].policy_version, stored["c0"].oldest_version) == (3, 3)
        assert (stored["c1"].policy_version, stored["c1"].newest_version) == (5, 5)
        assert stored["c2"].oldest_version is None
        n = out.count(QueryBuilder().gt("exp_meta.newest_version", 4).build())
        assert n == 2
    for bad in (
        {"oldest_version": 5, "newest_version": 3},
        {"oldest_version": 3},
        {"oldest_version": 3, "newest_version": 5, "policy_version": 4},
    ):
        with pytest.raises(ValueError, match="oldest"):
            ExpMeta(task_id="t", agent_id="a", step=0, **bad)


_KILLED_MID_TARGET_ACK = """
import os, signal, sys
import expstore.claims.api as front
from expstore import ReplayBuffer
from tests.helpers import make_row

url, name = sys.argv[1], sys.argv[2]
record = front.record_produced

def record_then_die(*args, **kwargs):
    record(*args, **kwargs)  # completions and their lineage written, not committed
    os.kill(os.getpid(), signal.SIGKILL)

front.record_produced = record_then_die
with ReplayBuffer(url, name=name) as prompts, ReplayBuffer(url, name=name + "_out") as out:
    prompts.store_prompts([make_row("q").model_copy(update={"id": "q"})], group_size=4)
    claim = prompts.claim(2, consumer="actor", lease_s=600)  # p0 (no target) and q
    claim.ack(produce={"q": [make_row("q", "actor", i) for i in range(3)]}, into=out)
"""


def test_an_actor_killed_inside_an_ack_towards_a_target_changes_no_count(
    db_url: str, buffer_name: str
) -> None:
    _actor_killed_by(_KILLED_MID_TARGET_ACK, db_url, buffer_name)
    with ReplayBuffer(db_url, name=buffer_name) as prompts:
        with ReplayBuffer(db_url, name=buffer_name + "_out") as out:
            assert len(out) == 0
            assert prompts.lineage(["q"])["q"].done == 0
            run_out(prompts)  # the dead actor's leases run out
            again = prompts.claim(
                2, consumer="actor", wait_s=30, min_batch_size=2
            )  # leases ran out
            assert "q" in again.ids and again.needs == {"q": 4}
            again.ack(produce={"q": [make_row("q", "b", i) for i in range(4)]}, into=out)
            assert len(out) == 4 and prompts.lineage(["q"])["q"].done == 4
            assert prompts.queue_stats().consumed == 2


def test_an_ack_retried_after_its_commit_whose_reply_was_lost_stores_nothing_twice(
    buffer: ReplayBuffer, db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from expstore import ConnectionLostError
    from expstore.claims.queue import ClaimQueue

    buffer.store_batch([make_row("p0")])
    claim = buffer.claim(1, consumer="actor")
    made = [make_row("p0", "c", i).model_copy(update={"id": f"p0/c{i}"}) for i in range(3)]
    acked = ClaimQueue.ack

    def committed_then_lost(*args: object, **kwargs: object) -> int:
        acked(*args, **kwargs)  # type: ignore[arg-type]
        raise ConnectionLostError("server closed the connection after the commit")

    with ReplayBuffer(db_url, name=buffer_name + "_out") as out:
        monkeypatch.setattr(ClaimQueue, "ack", committed_then_lost)
        with pytest.raises(ConnectionLostError):
            claim.ack(produce=made, into=out)
        monkeypatch.setattr(ClaimQueue, "ack", acked)
        assert claim.state == "held"  # the actor cannot tell whether it committed: again
        with pytest.raises(ClaimFinishedError, match="already acked"):
            claim.ack(produce=made, into=out)
        assert sorted(r.id for r in out.query()) == ["p0/c0", "p0/c1", "p0/c2"]
