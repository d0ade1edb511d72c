"""Rate limits kept with the buffer: one budget for every sampler and writer, in every
process, surviving restarts; Reverb's MinSize and SampleToInsertRatio semantics."""

from __future__ import annotations

import threading
import time

import pytest

from expstore import (
    GroupSampler,
    QueryBuilder,
    RateLimitedError,
    RateLimiter,
    ReplayBuffer,
    UniformSampler,
)
from expstore.errors import InvalidArgumentError, StorageError
from expstore.lifecycle.registry import lock_buffer
from expstore.limits.counters import discard
from tests.helpers import make_row, make_rows


def test_min_size_holds_sampling_until_enough_rows_were_inserted(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(RateLimiter(min_size=10, timeout_s=0.05))
    buf.store_batch(make_rows(9))
    held = (
        r"min_size holds it: 9 rows count as inserted.*inserted 9, discarded 0, sampled 0 "
        r"\(min_size=10\); learners have not sampled"
    )
    with pytest.raises(RateLimitedError, match=held):
        buf.sample(batch_size=4)
    buf.store(make_row())
    assert len(buf.sample(batch_size=100)) == 100  # MinSize: no ratio, any amount


def test_samples_per_insert_is_a_budget_shared_by_every_handle(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as a, ReplayBuffer(db_url, name=buffer_name) as b:
        a.set_rate_limiter(RateLimiter(min_size=4, samples_per_insert=2.0, timeout_s=0.05))
        a.store_batch(make_rows(10))  # budget 20 samples
        assert len(a.sample(batch_size=8)) == 8
        assert len(b.sample(batch_size=12)) == 12  # another handle spends the same budget
        held = "samples_per_insert holds it.*inserted 10, discarded 0, sampled 20"
        with pytest.raises(RateLimitedError, match=held):
            b.sample(batch_size=1)
        stats = a.rate_limit_stats()
        assert stats is not None and (stats.inserted, stats.sampled) == (10, 20)
        assert not stats.can_sample
        a.store_batch(make_rows(1))  # two more samples
        assert len(b.sample(batch_size=2)) == 2


def test_a_blocked_sample_waits_for_inserts(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=30))
    buf.store_batch(make_rows(4))
    buf.sample(batch_size=4)
    writer = threading.Timer(0.3, lambda: buf.store_batch(make_rows(8)))
    writer.start()
    started = time.monotonic()
    rows = buf.sample(UniformSampler(seed=0), batch_size=8)
    writer.join()
    assert len(rows) == 8 and time.monotonic() - started >= 0.25
    assert buf.storage.rate_limits.waits == 1


def test_short_batches_give_back_what_they_did_not_draw(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=0.05))
    for p in range(3):
        buf.store_batch([make_row(f"p{p}", f"c{i}", reward=float(i)) for i in range(2)])
    rows = buf.sample(GroupSampler(group_size=2, seed=0), batch_size=4)  # 4 counted
    assert len(rows) == 4
    short = buf.sample(GroupSampler(group_size=2, seed=0), batch_size=2)
    assert len(short) == 2
    assert buf.rate_limit_stats().sampled == 6  # type: ignore[union-attr]


def test_claims_count_against_the_budget_too(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(12))
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=0.5, timeout_s=0.05))
    assert len(buf.claim(4, consumer="c")) == 4  # a budget of 6 samples
    with pytest.raises(RateLimitedError):  # 8 claimable, 2 left: a claim of 4 waits, raises
        buf.claim(4, consumer="c")
    assert len(buf.claim(2, consumer="c")) == 2
    assert buf.rate_limit_stats().sampled == 6  # type: ignore[union-attr]
    # A claim counts only the rows it can claim: 6 claimable, 4 more samples of budget.
    buf.store_batch(make_rows(8))
    assert len(buf.claim(4, consumer="c")) == 4
    assert buf.rate_limit_stats().sampled == 10  # type: ignore[union-attr]


def test_a_limit_set_by_another_process_holds_a_claim_made_as_without_one(
    db_url: str, buffer_name: str
) -> None:
    """A handle that last saw no limit claims at once, its transaction checking there is
    still none: a limit set meanwhile by another handle rolls that claim back, and the
    claim counts against the limit like any other."""
    url, name = db_url, buffer_name
    buf = ReplayBuffer(url, name=name)
    buf.store_batch(make_rows(12))
    assert len(buf.claim(2, consumer="c")) == 2  # no limit seen
    with ReplayBuffer(url, name=name) as other:
        other.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=0.5, timeout_s=0.05))
    assert len(buf.claim(4, consumer="c")) == 4  # counted: a budget of 6 samples
    assert buf.rate_limit_stats().sampled == 4  # type: ignore[union-attr]
    with pytest.raises(RateLimitedError):  # 2 left: a claim of 4 waits, raises
        buf.claim(4, consumer="c")
    assert buf.queue_stats().leased == 6  # the refused claim took nothing
    with ReplayBuffer(url, name=name) as other:
        other.set_rate_limiter(None)
    assert len(buf.claim(4, consumer="c")) == 4  # the limit gone: not counted
    assert buf.rate_limit_stats() is None
    buf.close()


def test_blocked_writers_wait_for_samplers(buf: ReplayBuffer) -> None:
    limiter = RateLimiter(
        min_size=2, samples_per_insert=1.0, error_buffer=4, block_writers=True, timeout_s=0.1
    )
    buf.set_rate_limiter(limiter)  # writers may run max_diff = 6 samples ahead
    buf.store_batch(make_rows(6))
    held = (
        "block_writers holds it: 2 more rows would put inserts 8 samples ahead of the 0 "
        "drawn, more than max_diff=6.*learners must draw 2 more rows first.*learners have "
        "not sampled since the limit was set; actors inserted last .* s ago. Nothing was stored"
    )
    with pytest.raises(RateLimitedError, match=held):
        buf.store_batch(make_rows(2))
    assert len(buf) == 6
    buf.sample(batch_size=3)
    buf.store_batch(make_rows(2))  # 8 inserted, 3 sampled: 5 <= 6
    assert len(buf) == 8
    with pytest.raises(InvalidArgumentError, match="a write of 9 rows can never go"):
        buf.store_batch(make_rows(9))
    with pytest.raises(InvalidArgumentError, match="a sample of 9 rows can never go"):
        buf.sample(batch_size=9)
    assert len(buf) == 8


def test_a_blocked_writer_goes_when_a_learner_samples(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(
        RateLimiter(1, samples_per_insert=1.0, error_buffer=2, block_writers=True, timeout_s=30)
    )
    buf.store_batch(make_rows(3))
    learner = threading.Timer(0.3, lambda: buf.sample(batch_size=2))
    learner.start()
    buf.store_batch(make_rows(2))
    learner.join()
    assert len(buf) == 5


def test_the_same_limiter_again_keeps_its_counters(db_url: str, buffer_name: str) -> None:
    limiter = RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=0.05)
    with ReplayBuffer(db_url, name=buffer_name) as first:
        first.store_batch(make_rows(5))  # rows already there count as inserted
        first.set_rate_limiter(limiter)
        first.sample(batch_size=5)
    with ReplayBuffer(db_url, name=buffer_name) as restarted:
        restarted.set_rate_limiter(limiter)  # a restarted trainer sets it again
        with pytest.raises(RateLimitedError):
            restarted.sample(batch_size=1)
        assert restarted.rate_limiter() == RateLimiter(1, 1.0, 1.0, timeout_s=0.05)
        restarted.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=2.0, timeout_s=0.05))
        assert restarted.rate_limit_stats().sampled == 0  # type: ignore[union-attr]
        assert len(restarted.sample(batch_size=10)) == 10
        restarted.set_rate_limiter(None)
        assert restarted.rate_limiter() is None and restarted.rate_limit_stats() is None
        assert len(restarted.sample(batch_size=100)) == 100


def test_a_min_size_beyond_the_capacity_is_refused(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name, capacity=10) as buffer:
        with pytest.raises(InvalidArgumentError, match="can never be met"):
            buffer.set_rate_limiter(RateLimiter(min_size=11))
        assert buffer.rate_limiter() is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_size": 0}, "min_size"),
        ({"samples_per_insert": 0}, "samples_per_insert"),
        ({"samples_per_insert": -1.0}, "samples_per_insert"),
        ({"samples_per_insert": float("inf")}, "samples_per_insert"),
        ({"samples_per_insert": 4.0, "error_buffer": 2.0}, r"error_buffer must be at least .* = 4"),
        ({"error_buffer": 2.0}, "give samples_per_insert too"),
        ({"block_writers": True}, "give samples_per_insert"),
        ({"timeout_s": -1}, "timeout_s"),
    ],
)
def test_bad_limits_are_refused(kwargs, match) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        RateLimiter(**kwargs)


def test_set_rate_limiter_takes_a_limiter(buf: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="RateLimiter or None"):
        buf.set_rate_limiter({"min_size": 3})  # type: ignore[arg-type]


def test_concurrent_samplers_never_exceed_the_budget(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as setup:
        setup.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=0.2))
    drawn: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def sampler(i: int) -> None:
        with ReplayBuffer(db_url, name=buffer_name) as buffer:
            while not done.is_set():
                try:
                    drawn.append(len(buffer.sample(UniformSampler(seed=i), batch_size=3)))
                except RateLimitedError:
                    pass
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=sampler, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    with ReplayBuffer(db_url, name=buffer_name) as writer:
        for _ in range(30):
            writer.store_batch(make_rows(2))
            time.sleep(0.01)
        time.sleep(0.5)
        done.set()
        for t in threads:
            t.join()
        stats = writer.rate_limit_stats()
    assert not errors
    assert stats is not None and stats.inserted == 60
    assert sum(drawn) == stats.sampled <= 60  # never a sample beyond the budget
    assert stats.sampled >= 57  # and the samplers used it (within one batch)


def test_an_empty_limited_buffer_waits_instead_of_raising_empty(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(RateLimiter(min_size=2, timeout_s=0.05))
    with pytest.raises(RateLimitedError, match="inserted 0, discarded 0"):
        buf.sample(batch_size=2)
    writer = threading.Timer(0.2, lambda: buf.store_batch(make_rows(2)))
    writer.start()
    buf.set_rate_limiter(RateLimiter(min_size=2, timeout_s=30))
    assert len(buf.sample(batch_size=2)) == 2
    writer.join()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_size": 2, "samples_per_insert": 0.2},
        {"min_size": 3, "samples_per_insert": 0.1},
        {"min_size": 1, "samples_per_insert": 1.1, "error_buffer": 3.3},
        {"min_size": 7, "samples_per_insert": 0.3, "error_buffer": 2.1},
        {"min_size": 5, "samples_per_insert": 2.5},
        {"min_size": 1, "samples_per_insert": 4 / 3},
        {"min_size": 3, "samples_per_insert": 4 / 3, "error_buffer": 4 / 3},
        {"min_size": 2, "samples_per_insert": 0.7, "error_buffer": 1 / 3 + 1},
    ],
)
def test_a_limit_read_back_is_the_one_set(buf: ReplayBuffer, kwargs) -> None:  # noqa: ANN001
    """Limits are stored as bounds in floats; read back, the error buffer must not come out
    an ulp below its floor (found by review: every read of 0.2 x 2 raised
    InvalidArgumentError, and a buffer stayed so until its limit was removed), and setting
    the same limit again must keep the counters."""
    limiter = RateLimiter(**kwargs, timeout_s=0.05)
    buf.set_rate_limiter(limiter)
    back = buf.rate_limiter()
    assert back is not None and back.settings() == pytest.approx(limiter.settings())
    buf.store_batch(make_rows(20))
    buf.sample(batch_size=1)
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.sampled == 1
    buf.set_rate_limiter(RateLimiter(**kwargs, timeout_s=0.05))  # the same limit again
    again = buf.rate_limit_stats()
    assert again is not None and (again.inserted, again.sampled) == (20, 1)
    buf.set_rate_limiter(RateLimiter(min_size=1))  # another limit can replace it


def test_a_claim_counts_no_more_samples_than_rows_it_can_claim(
    buf: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim counts its samples before it claims; counting the n asked for let writers
    held by block_writers pass against samples that never happened while a learner polled
    an empty queue (found by review: 26 rows stored where 11 were allowed)."""
    buf.set_rate_limiter(
        RateLimiter(1, samples_per_insert=1.0, error_buffer=10, block_writers=True, timeout_s=0.05)
    )
    buf.store_batch(make_rows(3))
    limits = buf.sql.rate_limits
    acquire, asked = limits.acquire, []

    def counting(n, since=None, **options):  # noqa: ANN001, ANN003, ANN202
        asked.append(n)
        return acquire(n, since=since, **options)

    monkeypatch.setattr(limits, "acquire", counting)
    nothing = QueryBuilder().eq("exp_meta.task_id", "never").build()
    assert len(buf.claim(5, nothing, consumer="learner")) == 0
    assert asked == []  # not even for a moment
    assert len(buf.claim(5, consumer="learner")) == 3 and asked == [3]
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.sampled == 3


def test_a_refund_goes_only_to_the_limit_its_samples_were_counted_under(
    buf: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample that fails after counting gives its count back; when set_rate_limiter set
    another limit (counting afresh) in between, the refund is not taken from the new
    limit's count (found by review: the count went below zero)."""
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=4.0, timeout_s=0.05))
    buf.store_batch(make_rows(4))
    acquire = buf.storage.acquire_samples

    def acquire_then_reset(n, since=None):  # noqa: ANN001, ANN202
        counted = acquire(n, since=since)
        # another process sets a new limit meanwhile
        buf.set_rate_limiter(RateLimiter(min_size=2, samples_per_insert=4.0, timeout_s=0.05))
        return counted

    def fetch_fails(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise StorageError("the connection broke")

    monkeypatch.setattr(buf.storage, "acquire_samples", acquire_then_reset)
    monkeypatch.setattr(buf.storage, "fetch", fetch_fails)
    with pytest.raises(StorageError, match="broke"):
        buf.sample(batch_size=3)
    monkeypatch.undo()
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.limiter.min_size == 2 and stats.sampled == 0
    assert len(buf.sample(batch_size=3)) == 3  # the new limit counts from zero
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.sampled == 3


def test_a_claim_released_by_another_thread_gives_its_samples_back(buf: ReplayBuffer) -> None:
    """The samples a claim counted go back when it is released, whichever thread releases
    it (found by review of expstore.aio, whose claims and releases run on different
    threads: the refund looked for the count in the releasing thread's own record)."""
    import threading

    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=0.5, timeout_s=0.05))
    buf.store_batch(make_rows(4))
    made: list = []  # type: ignore[type-arg]
    thread = threading.Thread(target=lambda: made.append(buf.claim(2, consumer="l1")))
    thread.start()
    thread.join()
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.sampled == 2
    assert made[0].release() == 2  # on this thread
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.sampled == 0
    assert len(buf.claim(1, consumer="l2")) == 1


def test_rows_written_between_an_empty_choice_and_its_budget_are_drawn(
    buf: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a rate limit, a choice that found the buffer empty asks for budget to wait
    on; when a writer stored rows in between, the budget comes at once, without a wait,
    and the sample chooses again instead of raising EmptyBufferError (found by a loaded
    run of test_concurrent_samplers_never_exceed_the_budget)."""
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=4.0, timeout_s=0.05))
    acquire = buf.storage.acquire_samples

    def rows_arrive_first(n, since=None):  # noqa: ANN001, ANN202
        if not len(buf):
            buf.store_batch(make_rows(2))  # another process's write, meanwhile
        return acquire(n, since=since)

    monkeypatch.setattr(buf.storage, "acquire_samples", rows_arrive_first)
    assert len(buf.sample(batch_size=2)) == 2
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.sampled == 2 and stats.inserted == 2


def _discard(buf: ReplayBuffer, n: int) -> None:
    """What the group index and stale eviction do: discard rows inside a transaction that
    holds the buffer's row."""
    handle = buf.storage.handle
    with handle.write() as conn:
        lock_buffer(handle, conn)
        discard(handle, conn, n)


def test_discarded_rows_no_longer_hold_blocked_writers(buf: ReplayBuffer) -> None:
    """Issue 32: rows that can never be drawn (groups a group condition refuses) counted
    as inserted-but-unsampled, so writers held by block_writers waited for ever."""
    buf.set_rate_limiter(
        RateLimiter(
            min_size=8, samples_per_insert=1.0, error_buffer=16, block_writers=True, timeout_s=0.05
        )
    )  # writers may run max_diff = 24 samples ahead
    buf.store_batch(make_rows(24))
    with pytest.raises(RateLimitedError, match="learners must draw 8 more rows first"):
        buf.store_batch(make_rows(8))
    _discard(buf, 8)  # 8 of the rows can never be drawn: they leave the count
    buf.store_batch(make_rows(8))
    assert len(buf) == 32
    stats = buf.rate_limit_stats()
    assert stats is not None
    assert (stats.inserted, stats.discarded, stats.sampled) == (32, 8, 0)
    assert stats.can_sample and not stats.can_insert
    with pytest.raises(RateLimitedError, match=r"inserted 32, discarded 8, sampled 0"):
        buf.store_batch(make_rows(1))


def test_a_writer_waiting_on_the_limit_goes_when_rows_are_discarded(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(
        RateLimiter(1, samples_per_insert=1.0, error_buffer=2, block_writers=True, timeout_s=30)
    )
    buf.store_batch(make_rows(3))
    index = threading.Timer(0.3, lambda: _discard(buf, 2))
    index.start()
    buf.store_batch(make_rows(2))  # waits until the discard makes room
    index.join()
    assert len(buf) == 5
    assert buf.rate_limit_stats().discarded == 2  # type: ignore[union-attr]


def test_discarded_rows_do_not_count_towards_min_size(buf: ReplayBuffer) -> None:
    buf.set_rate_limiter(RateLimiter(min_size=4, timeout_s=0.05))
    buf.store_batch(make_rows(4))
    _discard(buf, 1)
    with pytest.raises(RateLimitedError, match="min_size holds it: 3 rows count as inserted"):
        buf.sample(batch_size=1)
    buf.store(make_row())
    assert len(buf.sample(batch_size=2)) == 2


def test_discards_before_a_limit_is_set_are_not_counted_under_it(buf: ReplayBuffer) -> None:
    buf.store_batch(make_rows(4))
    _discard(buf, 4)
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=1.0, timeout_s=0.05))
    stats = buf.rate_limit_stats()
    assert stats is not None and (stats.inserted, stats.discarded) == (4, 0)


def test_stats_say_when_learners_last_sampled_and_actors_last_inserted(
    buf: ReplayBuffer,
) -> None:
    buf.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=2.0, timeout_s=0.05))
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.last_sample_at is None and stats.last_insert_at is None
    buf.store_batch(make_rows(4))
    buf.sample(batch_size=2)
    stats = buf.rate_limit_stats()
    assert stats is not None and stats.last_sample_at is not None
    assert stats.last_insert_at is not None
    assert abs(stats.last_sample_at - time.time()) < 3600  # the database's clock, in seconds


def test_a_queue_limit_bounds_the_rows_waiting_to_be_claimed(buf: ReplayBuffer) -> None:
    limiter = RateLimiter.queue(8, timeout_s=0.05)
    assert limiter == RateLimiter(1, 1.0, 7.0, block_writers=True, timeout_s=0.05)
    buf.set_rate_limiter(limiter)
    assert buf.rate_limiter() == limiter  # read back as set
    buf.store_batch(make_rows(8))
    with pytest.raises(RateLimitedError, match="block_writers holds it"):
        buf.store(make_row())
    assert len(buf.claim(3, consumer="learner")) == 3  # three left the backlog
    buf.store_batch(make_rows(3))
    with pytest.raises(RateLimitedError):
        buf.store(make_row())
    _discard(buf, 2)  # rows that can never be claimed leave the backlog too
    buf.store_batch(make_rows(2))
    assert len(buf) == 13
    with pytest.raises(InvalidArgumentError, match="max_size must be an int >= 2"):
        RateLimiter.queue(1)


@pytest.mark.parametrize("huge", [10**400, float("inf"), float("nan")])
def test_a_limiter_refuses_numbers_beyond_a_float_with_a_typed_error(huge: float) -> None:
    with pytest.raises(InvalidArgumentError, match="samples_per_insert must be a finite number"):
        RateLimiter(samples_per_insert=huge)
    with pytest.raises(InvalidArgumentError, match="timeout_s must be a finite number"):
        RateLimiter(timeout_s=huge)
