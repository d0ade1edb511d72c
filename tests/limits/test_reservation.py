"""A reservation of samples gives back what it counted and did not hand out: the unused
part on closing, everything when its block raises, and the handed-out part later through
the limit it was counted under."""

from __future__ import annotations

from typing import Any

import pytest

from expstore import DataRow, Experience, ExpMeta, RateLimiter, ReplayBuffer
from expstore.limits.reservation import Reservation


class _Budget:
    """A counter over a plain budget: counts what it can, records what comes back."""

    def __init__(self, budget: int, waits: int = 0) -> None:
        self.budget, self.waits, self.back = budget, waits, []

    def count(self, n: int, *args: Any, **options: Any) -> tuple[int, bool]:
        got = min(n, self.budget)
        self.budget -= got
        waited = self.waits > 0
        self.waits -= 1
        return got, waited

    def give_back(self, n: int) -> None:
        self.back.append(n)
        self.budget += n


def test_the_unused_part_goes_back_on_closing() -> None:
    budget = _Budget(100)
    with Reservation(budget.count, budget.give_back) as held:
        assert held.add(32) is False and held.counted == 32 and held.asked
        held.add(8)  # a batch chosen again, larger: the rest counted
        held.use(30)
    assert budget.back == [10] and budget.budget == 70 and held.counted == 30


def test_everything_goes_back_when_the_block_raises() -> None:
    budget = _Budget(100)
    with pytest.raises(KeyError), Reservation(budget.count, budget.give_back) as held:
        held.add(16)
        held.use(16)
        raise KeyError("the fetch failed")
    assert budget.back == [16] and budget.budget == 100 and held.counted == 0


def test_nothing_counted_gives_nothing_back_and_nothing_later() -> None:
    budget = _Budget(0)
    with Reservation(budget.count, budget.give_back) as held:
        assert held.add(5) is False and held.asked and held.counted == 0
    assert budget.back == [] and held.later() is None


def test_using_more_than_counted_keeps_only_what_was_counted() -> None:
    budget = _Budget(4)
    with Reservation(budget.count, budget.give_back) as held:
        held.add(10)
        held.use(10)
    assert budget.back == [] and held.counted == 4


def test_later_gives_back_through_the_limit_it_was_counted_under() -> None:
    budget, bound = _Budget(10), []
    held = Reservation(budget.count, budget.give_back, later=lambda: bound.append)
    with held:
        held.add(6)
        held.use(6)
    refund = held.later()
    assert refund is not None
    refund(2)
    assert bound == [2] and budget.back == []


@pytest.fixture
def limited(tmp_path: Any) -> ReplayBuffer:
    buf = ReplayBuffer(f"sqlite:///{tmp_path}/r.db", name="limited")
    buf.set_rate_limiter(RateLimiter(samples_per_insert=1.0, min_size=1, error_buffer=1000.0))
    buf.store_batch(
        [
            DataRow(exp_meta=ExpMeta(task_id=f"t{i}", agent_id="a", step=0), exp_data=Experience())
            for i in range(20)
        ]
    )
    return buf


def test_through_the_buffer_the_count_is_what_callers_got(
    limited: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A released claim's samples come back; a claim or a draw whose fetch fails gives its
    whole count back; a draw counts what it handed out."""
    claim = limited.claim(5, consumer="c")
    assert limited.rate_limit_stats().sampled == 5
    claim.release()
    assert limited.rate_limit_stats().sampled == 0
    limited.sample(batch_size=7)
    assert limited.rate_limit_stats().sampled == 7

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("the fetch failed")

    monkeypatch.setattr(limited.storage, "fetch", broken)
    monkeypatch.setattr(limited.storage, "fetch_read", broken)
    with pytest.raises(KeyError):
        limited.claim(3, consumer="c")
    with pytest.raises(KeyError):
        limited.sample(batch_size=3)
    assert limited.rate_limit_stats().sampled == 7
    monkeypatch.undo()
    assert len(limited.claim(13, consumer="c", wait_s=0).ids) == 13  # the failed claim's rows
    assert limited.rate_limit_stats().sampled == 20
