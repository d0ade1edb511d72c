"""Cancellation paths of expstore.aio that go wrong."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from expstore import claims as sync_claims
from expstore.aio import AsyncReplayBuffer
from tests.helpers import make_row


def _rows(n: int) -> list[Any]:
    return [make_row("t", "a", i) for i in range(n)]


def test_an_abandoned_claim_is_never_released_on_the_event_loop_thread(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's thread finished, its result is on its way to the loop, and the caller
    is cancelled before it lands (asyncio.wait_for / a timeout firing in that iteration):
    _submit then adds the `abandoned` callback to a future already done, so
    concurrent.futures runs it at once, on the loop thread: claim.release() (a database
    transaction) blocks the event loop."""
    released_on: list[str] = []
    real = sync_claims.Claim.release

    def release(self: Any, **kw: Any) -> int:
        released_on.append(threading.current_thread().name)
        return real(self, **kw)

    monkeypatch.setattr(sync_claims.Claim, "release", release)

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name) as buffer:
            await buffer.store_batch(_rows(4))
            task = asyncio.create_task(buffer.claim(2, consumer="learner"))
            await asyncio.sleep(0)  # submitted
            time.sleep(1.0)  # (the loop busy elsewhere) the claim lands meanwhile
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await buffer.settle()
            assert released_on, "the abandoned claim was not released"
            assert released_on[0] != threading.main_thread().name, released_on

    asyncio.run(main())


def test_cancelling_a_block_whose_ack_is_running_raises_cancelled_error(
    db_url: str, buffer_name: str
) -> None:
    """`async with claim:` whose `await claim.ack()` is cancelled while the ack runs on
    the thread: __aexit__ sees state 'held' (the ack has not returned), queues a release
    behind the ack, and that release raises ClaimFinishedError (the ack committed), which
    replaces the CancelledError: the task does not end cancelled (asyncio.timeout(),
    TaskGroup and wait_for rely on it)."""

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            await buffer.store_batch(_rows(4))
            claim = await buffer.claim(2, consumer="learner")
            gate = threading.Event()
            real_ack = claim.sync.ack

            def gated_ack(*a: Any, **kw: Any) -> int:
                gate.wait(20)
                return real_ack(*a, **kw)

            claim.sync.ack = gated_ack  # type: ignore[method-assign]

            async def learner() -> None:
                async with claim:
                    await claim.ack()

            task = asyncio.create_task(learner())
            while not buffer.calls._running:
                await asyncio.sleep(0.001)
            task.cancel()
            await asyncio.sleep(0.05)  # __aexit__ queued its release behind the ack
            gate.set()
            got = await asyncio.gather(task, return_exceptions=True)
            assert isinstance(got[0], asyncio.CancelledError), got

    asyncio.run(main())
