"""Waits that still run on the handle's one call thread (not on a wait thread), holding up
every other call of the handle, the ones they wait for included; aclose() does not end
them either (they are not registered as waits)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from expstore import RateLimiter, ReplayBuffer
from expstore.aio import AsyncReplayBuffer
from tests.helpers import make_row


def _prompt(i: int) -> Any:
    row = make_row(f"task{i}", state={"question": f"q{i}"})
    return row.model_copy(update={"id": f"p{i}"})


def test_an_admission_wait_does_not_hold_up_the_release_it_waits_for(
    db_url: str, buffer_name: str
) -> None:
    """Actor 1 holds the one prompt the admission bound allows in flight; actor 2's claim
    (no wait_s=) waits for admission on the handle's only call thread; actor 1's rollout
    fails and it releases its claim, which would let actor 2 in at once -- but the release
    is queued behind actor 2's wait until the admission timeout."""

    async def main() -> None:
        with ReplayBuffer(db_url, name=buffer_name + "_rollouts") as rollouts:
            async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as prompts:
                await prompts.store_prompts([_prompt(i) for i in range(4)], group_size=2)
                await prompts.set_admission(
                    rollouts, batch_size=2, max_batches_ahead=0, timeout_s=8
                )
                first = await prompts.claim(1, consumer="actor-1")
                assert first.ids == ["p0"]
                second = asyncio.create_task(prompts.claim(1, consumer="actor-2"))
                await asyncio.sleep(0.3)  # actor 2 is waiting for admission now
                await asyncio.wait_for(first.release(), 20)
                assert (await asyncio.wait_for(second, 20)).ids == ["p0"]

    asyncio.run(main())


def _columns(n: int) -> dict[str, Any]:
    return {
        "task_id": [f"t{i}" for i in range(n)],
        "agent_id": "a",
        "step": 0,
        "reward_t": np.ones(n),
    }


def test_a_rate_limit_set_elsewhere_does_not_deadlock_writes_and_samples(
    db_url: str, buffer_name: str
) -> None:
    """The async handle last saw no rate limit; another process then set a queue limit
    (block_writers). A group-committed extend that the limit holds waits on the call
    thread; the sample (same handle) that would let it go is queued behind it: both stall
    until the limiter's timeout (forever with timeout=None)."""

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            await buffer.count()
            with ReplayBuffer(db_url, name=buffer_name) as other:  # another process
                other.set_rate_limiter(RateLimiter.queue(4, timeout_s=8))
            assert await buffer.extend(_columns(4)) == 4  # the backlog is full now
            write = asyncio.create_task(buffer.extend(_columns(2)))
            await asyncio.sleep(0.3)  # held by block_writers on the call thread
            batch = await asyncio.wait_for(buffer.sample(batch_size=2), 20)
            assert len(batch) == 2
            assert await asyncio.wait_for(write, 20) == 2

    asyncio.run(main())


def test_a_consumer_claim_waiting_on_the_rate_limit_does_not_hold_up_the_release(
    db_url: str, buffer_name: str
) -> None:
    """AsyncConsumer.claim() picks its thread by `wait is not None` alone (the buffer's
    claim() also by the rate limit): without wait_s= its rate-limit wait runs on the call
    thread, where the release that would give the budget back is queued behind it."""
    from tests.helpers import make_row

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            await buffer.set_rate_limiter(RateLimiter(1, samples_per_insert=0.5, timeout_s=8))
            await buffer.store_batch([make_row("t", "a", i) for i in range(4)])
            first = await buffer.claim(2, consumer="l1")  # the budget (2.5 samples) is spent
            assert len(first) == 2
            other = await buffer.consumer("l2")
            second = asyncio.create_task(other.claim(1))  # waits for budget
            await asyncio.sleep(0.3)
            await asyncio.wait_for(first.release(), 20)  # gives the budget back
            assert len(await asyncio.wait_for(second, 20)) == 1

    asyncio.run(main())
