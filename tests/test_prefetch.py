"""buffer.batches(prefetch=k): batches made ahead in a background thread, the same as a
sample loop's, errors at the batch they belong to, bounded, and stopped on close."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from expstore import DataRow, EmptyBufferError, ReplayBuffer
from expstore.converters import Converter, NumpyConverter
from expstore.errors import InvalidArgumentError
from expstore.prefetch import Prefetcher
from expstore.samplers import PrioritizedSampler, UniformSampler
from tests.helpers import make_rows

CONV = NumpyConverter({"obs": "exp_data.state.obs", "i": "exp_data.state.i"})


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "expstore-prefetch"]


@pytest.fixture(autouse=True)
def _no_thread_outlives_a_test() -> Iterator[None]:
    """A prefetch thread left running would hold locks a process forked later (a
    DataLoader worker in another test) inherits held."""
    yield
    assert _wait_until(lambda: not _prefetch_threads())


def _wait_until(check: Any, seconds: float = 30.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return bool(check())


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_the_same_batches_as_a_sample_loop(buffer: ReplayBuffer, prefetch: int) -> None:
    buffer.store_batch(make_rows(60, tensor=True))
    for make in (lambda: UniformSampler(seed=4), lambda: PrioritizedSampler(seed=4)):
        looped, streamed = make(), make()
        expected = [buffer.sample(looped, None, CONV, 8) for _ in range(10)]
        with buffer.batches(streamed, None, CONV, 8, prefetch=prefetch, num_batches=10) as it:
            got = list(it)
        assert len(got) == 10 and it.batches == 10
        for a, b in zip(expected, got, strict=True):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert next(it, None) is None  # exhausted, and stays so
    assert _wait_until(lambda: not _prefetch_threads())


def test_whole_rows_by_default(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(5))
    with buffer.batches(batch_size=3, num_batches=2) as it:
        batches = list(it)
    assert [len(b) for b in batches] == [3, 3]
    assert all(isinstance(r, DataRow) for b in batches for r in b)


class _FailsAt(Converter[list[str]]):
    """Builds batches of ids; raises at its ``n``-th batch."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[str]:
        self.calls += 1
        if self.calls == self.n:
            raise RuntimeError(f"batch {self.n} is bad")
        return [r.id for r in rows]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_error_is_raised_at_its_batch_and_ends_the_stream(
    buffer: ReplayBuffer, prefetch: int
) -> None:
    buffer.store_batch(make_rows(10))
    it = buffer.batches(UniformSampler(seed=0), None, _FailsAt(3), 4, prefetch=prefetch)
    assert len(next(it)) == 4 and len(next(it)) == 4
    with pytest.raises(RuntimeError, match="batch 3 is bad") as info:
        next(it)
    assert info.traceback[-1].name == "to_dataset_row"  # its own traceback
    with pytest.raises(StopIteration):
        next(it)
    assert _wait_until(lambda: not _prefetch_threads())


def test_an_empty_buffer_raises_at_the_first_batch(buffer: ReplayBuffer) -> None:
    with buffer.batches(prefetch=2) as it, pytest.raises(EmptyBufferError):
        next(it)


def test_prefetch_is_bounded_and_close_stops_the_thread(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(20))
    counting = _FailsAt(10**9)
    it = buffer.batches(UniformSampler(seed=0), None, counting, 2, prefetch=2)
    next(it)
    # One handed out, two waiting, one made and waiting for room: never more.
    assert _wait_until(lambda: counting.calls == 4)
    time.sleep(0.2)
    assert counting.calls == 4
    it.close()
    assert not _prefetch_threads()
    with pytest.raises(StopIteration):
        next(it)
    it.close()  # again: nothing


def test_a_dropped_stream_stops_its_thread(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(20, tensor=True))
    it = buffer.batches(UniformSampler(seed=0), None, CONV, 2, prefetch=2)
    next(it)
    del it
    gc.collect()
    assert _wait_until(lambda: not _prefetch_threads())


def test_bad_arguments_are_refused(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(3))
    for kwargs in ({"prefetch": -1}, {"prefetch": 1.5}, {"num_batches": -2}):
        with pytest.raises(InvalidArgumentError):
            buffer.batches(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        buffer.batches(batch_size=0)
    assert not _prefetch_threads()


def test_a_consume_after_sampler_is_refused(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(5, tensor=True))
    with pytest.raises(InvalidArgumentError, match="consume_after"):
        buffer.batches(UniformSampler(consume_after=1), prefetch=2)
    with buffer.batches(UniformSampler(consume_after=1), None, CONV, 2, prefetch=0) as it:
        assert 0 < len(next(it)["i"]) <= 2  # made when asked: nothing is spent ahead


def _filled(it: Prefetcher[Any]) -> bool:
    worker = it._worker
    return worker is not None and worker.queue.full()


def test_closing_gives_back_what_was_made_ahead(buffer: ReplayBuffer) -> None:
    """An epoch rewinds to the first batch not handed out; a rate limit's count of the
    dropped batches goes back."""
    from expstore.limits.rate_limiter import RateLimiter

    buffer.store_batch(make_rows(40, tensor=True))
    epoch = UniformSampler(seed=1, replacement=False)
    it = buffer.batches(epoch, None, CONV, 4, prefetch=2)
    seen = next(it)["i"].tolist()
    assert _wait_until(lambda: _filled(it))
    it.close()
    while len(seen) < 40:  # the epoch goes on from the first batch the caller never got
        seen += buffer.sample(epoch, None, CONV, 4)["i"].tolist()
    assert sorted(seen) == list(range(40))
    buffer.set_rate_limiter(RateLimiter(min_size=1, samples_per_insert=100.0, error_buffer=1e6))
    before = buffer.rate_limit_stats()
    assert before is not None
    it = buffer.batches(UniformSampler(seed=2), None, CONV, 4, prefetch=2)
    next(it)
    next(it)
    assert _wait_until(lambda: _filled(it))
    it.close()
    after = buffer.rate_limit_stats()
    assert after is not None and after.sampled - before.sampled == 8  # two batches of 4


def test_close_does_not_wait_out_a_rate_limit(buffer: ReplayBuffer) -> None:
    from expstore.limits.rate_limiter import RateLimiter

    buffer.set_rate_limiter(
        RateLimiter(min_size=1, samples_per_insert=1.0, error_buffer=8.0, timeout_s=4.0)
    )
    buffer.store_batch(make_rows(8))
    it = buffer.batches(UniformSampler(seed=0), None, _FailsAt(10**9), 4, prefetch=2)
    next(it)
    time.sleep(0.3)  # the thread now waits for budget the caller will never add
    started = time.monotonic()
    it.close()
    assert time.monotonic() - started < 3  # not the limiter's 4 s
    # The thread ends when the limiter gives up; nothing of it outlives the test (a
    # thread left running would hold locks a forked process inherits held).
    assert _wait_until(lambda: not _prefetch_threads())


def test_the_stream_describes_the_batch_it_handed_out(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(100))
    sampler = PrioritizedSampler(seed=0)
    with buffer.batches(sampler, None, None, 8, prefetch=2, num_batches=5) as it:
        for batch in it:
            assert _wait_until(lambda: _filled(it) or it.batches == 5)
            assert [r.id for r in batch] == it.last_info.ids
            assert it.last_info.weights is not None and len(it.last_info.weights) == 8


def test_close_from_another_thread_ends_a_waiting_next() -> None:
    it = Prefetcher(lambda: time.sleep(0.2) or 1, prefetch=1)
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(next(it, "ended")), daemon=True)
    it.close()
    waiting.start()
    waiting.join(30)
    assert got == ["ended"]
    release = threading.Event()
    it = Prefetcher(lambda: release.wait(60) or 1, prefetch=1)  # a batch not made yet
    waiting = threading.Thread(target=lambda: got.append(next(it, "ended")), daemon=True)
    waiting.start()
    time.sleep(0.1)
    it.close()
    waiting.join(30)
    assert got == ["ended", "ended"]
    release.set()  # (the batch being made ends, and is dropped)


def test_the_prefetcher_on_its_own() -> None:
    counter = iter(range(100))
    with Prefetcher(lambda: next(counter), prefetch=3, num_batches=5) as it:
        assert list(it) == [0, 1, 2, 3, 4]
        assert it.waited_s >= 0 and "batches=5" in repr(it)
    assert list(Prefetcher(lambda: 1, prefetch=2, num_batches=0)) == []
