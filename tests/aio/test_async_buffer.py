"""expstore.aio: the async handle gives what the sync one gives, never blocks the event loop,
keeps waits off the writes' thread, and a cancelled await leaves a write whole or absent.

Nothing here depends on timing: a call that would block the loop (or a wait that held the
writes' thread) deadlocks on a gate only the loop can open, and the gate's own timeout turns
that into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from expstore import (
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    QueryBuilder,
    ReplayBuffer,
    UniformSampler,
)
from expstore.aio import AsyncClaim, AsyncReplayBuffer
from expstore.errors import (
    DuplicateIdError,
    FencedError,
    InvalidArgumentError,
    StorageError,
    UnsupportedTypeError,
    WaitTimeoutError,
)

GATE_S = 20.0  # only reached when the code under test is wrong


def _row(task: str, step: int, reward: float = 0.0, row_id: str | None = None) -> DataRow:
    meta = ExpMeta(task_id=task, agent_id="a", step=step)
    data = Experience(state={"obs": np.full(3, step, np.float32)}, reward_t=reward)
    if row_id is None:
        return DataRow(exp_meta=meta, exp_data=data)
    return DataRow(id=row_id, exp_meta=meta, exp_data=data)


def _open(gate: threading.Event) -> Any:
    async def opener() -> None:
        gate.set()

    return opener()


def _waits_for(gate: threading.Event) -> Any:
    def blocked(_: ReplayBuffer) -> bool:
        if not gate.wait(GATE_S):
            raise AssertionError("the gate was never opened: the event loop was blocked")
        return True

    return blocked


def test_the_async_handle_gives_what_the_sync_handle_gives(db_url: str, buffer_name: str) -> None:
    rows = [_row(f"t{i % 3}", i, reward=float(i)) for i in range(12)]
    cond = QueryBuilder().eq("exp_meta.task_id", "t1").build()

    async def main() -> dict[str, Any]:
        async with AsyncReplayBuffer(db_url, name=buffer_name) as buffer:
            assert await buffer.store_batch(rows[:8]) == 8
            assert (
                await buffer.extend(
                    {
                        "id": [r.id for r in rows[8:]],
                        "task_id": [r.exp_meta.task_id for r in rows[8:]],
                        "agent_id": "a",
                        "step": [r.exp_meta.step for r in rows[8:]],
                        "state": {"obs": np.stack([r.exp_data.state["obs"] for r in rows[8:]])},
                        "reward_t": [r.exp_data.reward_t for r in rows[8:]],
                    }
                )
                == 4
            )
            page = await buffer.page(cond, limit=2)
            return {
                "count": await buffer.count(),
                "cond": await buffer.count(cond),
                "get": await buffer.get(rows[5].id),
                "query": [r.id async for r in buffer.query(cond)],
                "page": [r.id for r in page.rows],
                "tasks": await buffer.task_ids(),
                "by_task": await buffer.get_by_task_id("t2"),
                "sample": [
                    r.id for r in await buffer.sample(UniformSampler(seed=3), cond, batch_size=5)
                ],
            }

    got = asyncio.run(main())
    with ReplayBuffer(db_url, name=buffer_name) as sync:  # another handle: sees it all
        assert got["count"] == len(sync) == 12
        assert got["cond"] == sync.count(cond) == 4
        assert got["get"] == sync.get(rows[5].id) == rows[5]
        assert got["query"] == [r.id for r in sync.query(cond)] == [r.id for r in rows[1::3]]
        assert got["page"] == got["query"][:2]
        assert got["tasks"] == sync.task_ids() == ["t0", "t1", "t2"]
        assert got["by_task"] == sync.get_by_task_id("t2")
        again = sync.sample(UniformSampler(seed=3), cond, batch_size=5)
        assert got["sample"] == [r.id for r in again]


def test_sync_and_async_handles_see_each_others_writes_at_once(
    db_url: str, buffer_name: str
) -> None:
    async def main() -> None:
        with ReplayBuffer(db_url, name=buffer_name) as sync:
            async with AsyncReplayBuffer(db_url, name=buffer_name) as aio:
                sync.store(_row("s", 0))
                assert await aio.count() == 1
                await aio.store(_row("a", 0))
                assert sync.count() == 2
                assert sorted(await aio.task_ids()) == ["a", "s"]

    asyncio.run(main())


def test_calls_run_off_the_event_loop(tmp_path: Any) -> None:
    """A call that waits for the loop to do something completes: it is not on the loop."""

    async def main() -> None:
        async with AsyncReplayBuffer(f"sqlite:///{tmp_path / 'b.db'}") as buffer:
            gate = threading.Event()
            blocked, _ = await asyncio.gather(buffer.run(_waits_for(gate)), _open(gate))
            assert blocked
            loop_thread = threading.get_ident()
            seen: list[int] = []
            together = buffer.sync.sql.write_together

            def spy(writes: Any) -> Any:
                seen.append(threading.get_ident())
                return together(writes)

            buffer.sync.sql.write_together = spy  # type: ignore[method-assign]
            await buffer.store_batch([_row("t", 0)])
            assert seen and seen[0] != loop_thread

    asyncio.run(main())


def test_a_wait_never_holds_up_the_writes_it_waits_for(db_url: str, buffer_name: str) -> None:
    """One call thread: wait_for and claim(wait=) run beside it, so the rows they wait for,
    written through the same handle, arrive (else they would time out)."""

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:

            async def write() -> None:
                for i in range(3):
                    await asyncio.sleep(0)
                    await buffer.store(_row("t", i))

            seen, _ = await asyncio.gather(buffer.wait_for(3, timeout_s=GATE_S), write())
            assert seen == 3
            claim, _ = await asyncio.gather(
                buffer.claim(2, consumer="l", wait_s=GATE_S, min_batch_size=2, order="oldest"),
                buffer.store_batch([_row("u", 0), _row("u", 1)]),
            )
            assert isinstance(claim, AsyncClaim) and len(claim) == 2
            assert await claim.ack(checkpoint={"step": 1}) == 2
            assert await buffer.checkpoint("l") == {"step": 1}
            with pytest.raises(WaitTimeoutError):
                await buffer.wait_for(100, timeout_s=0.05)

    asyncio.run(main())


def test_a_cancelled_wait_stops_waiting_and_claims_nothing(db_url: str, buffer_name: str) -> None:
    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name) as buffer:
            waiting = asyncio.create_task(buffer.claim(1, consumer="l", wait_s=3600))
            while not buffer.calls._running:  # the claim has reached its thread
                await asyncio.sleep(0.001)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The thread's wait was interrupted: settle returns (an hour's wait would not).
            await asyncio.wait_for(buffer.settle(), GATE_S)
            await buffer.store(_row("t", 0, row_id="r0"))
            claim = await buffer.claim(1, consumer="other")
            assert claim.ids == ["r0"]

    asyncio.run(main())


class _GatedConverter(DefaultConverter):
    """Builds the batch only once the gate opens: a claim that lands after its caller left."""

    def __init__(self, reached: threading.Event, gate: threading.Event) -> None:
        super().__init__()
        self.reached, self.gate = reached, gate

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[DataRow]:
        self.reached.set()
        assert self.gate.wait(GATE_S)
        return list(rows)


def test_a_claim_landing_after_its_caller_was_cancelled_is_released(
    db_url: str, buffer_name: str
) -> None:
    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name) as buffer:
            await buffer.store(_row("t", 0, row_id="r0"))
            reached, gate = threading.Event(), threading.Event()
            task = asyncio.create_task(
                buffer.claim(1, consumer="l", converter=_GatedConverter(reached, gate))
            )
            while not reached.is_set():
                await asyncio.sleep(0.001)
            task.cancel()  # the claim is made, its batch being built: it returns later
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()
            await buffer.settle()
            stats = await buffer.queue_stats()
            assert (stats.unclaimed, stats.leased) == (1, 0)
            assert (await buffer.claim(1, consumer="l2")).ids == ["r0"]

    asyncio.run(main())


def test_a_cancelled_write_is_whole_or_absent(db_url: str, buffer_name: str) -> None:
    """Cancelled before its thread took it: nothing runs. Cancelled while running: it
    commits whole. settle() waits for it; the ids say which way it went."""

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            gate = threading.Event()
            blocker = asyncio.create_task(buffer.run(_waits_for(gate)))
            queued = asyncio.create_task(buffer.store_batch([_row("q", i) for i in range(4)]))
            await asyncio.sleep(0)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued

            def write_when_open(sync: ReplayBuffer) -> int:
                assert gate.wait(GATE_S)
                return sync.store_batch([_row("w", i, row_id=f"w{i}") for i in range(4)])

            gate.set()
            await blocker
            gate.clear()
            running = asyncio.create_task(buffer.run(write_when_open))
            while not buffer.calls._running:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
            running.cancel()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await running
            await buffer.settle()
            assert await buffer.task_ids() == ["w"]
            assert await buffer.count() == 4

    asyncio.run(main())


def test_errors_reach_the_awaiting_coroutine_and_change_nothing(
    db_url: str, buffer_name: str
) -> None:
    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name) as buffer:
            await buffer.store(_row("t", 0, row_id="r0"))
            with pytest.raises(UnsupportedTypeError, match="DataRow"):
                await buffer.store_batch([_row("t", 1), "not a row"])  # type: ignore[list-item]
            with pytest.raises(InvalidArgumentError):
                await buffer.claim(0, consumer="l")
            assert await buffer.count() == 1
        with pytest.raises(StorageError, match="closed"):
            await buffer.count()

    asyncio.run(main())


def test_consumers_fence_and_steps_commit_whole(db_url: str, buffer_name: str) -> None:
    async def main() -> None:
        buffer = await AsyncReplayBuffer.open(db_url, name=buffer_name)
        async with buffer:
            await buffer.store_batch([_row("t", i, reward=float(i)) for i in range(4)])
            old = await buffer.consumer("learner")
            claim = await old.claim(2)
            new = await buffer.consumer("learner", takeover=True)
            with pytest.raises(FencedError):
                await claim.ack()
            fresh = await new.claim(4, wait_s=GATE_S, min_batch_size=4)
            async with new.step() as step:
                step.ack(fresh)
                step.save_checkpoint({"step": 7})
                step.set_policy_version(3)
            assert (step.state, step.acked) == ("committed", 4)
            assert await new.checkpoint() == {"step": 7}
            assert await buffer.policy_version() == 3
            assert fresh.state == "acked"

    asyncio.run(main())


def test_bad_thread_counts_are_refused() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="threads"):
            AsyncReplayBuffer(threads=bad)  # type: ignore[arg-type]


def _columns(task: str, n: int, ids: list[str] | None = None) -> dict[str, Any]:
    cols: dict[str, Any] = {
        "task_id": [task] * n,
        "agent_id": "a",
        "step": list(range(n)),
        "state": {"obs": np.arange(n * 3, dtype=np.float32).reshape(n, 3)},
        "reward_t": np.ones(n),
    }
    if ids is not None:
        cols["id"] = ids
    return cols


def test_writes_awaited_at_once_commit_together_each_with_its_own_result(
    db_url: str, buffer_name: str
) -> None:
    """While the handle's thread is busy, writes queue; it then commits them in one
    transaction. A write that fails (a duplicate id, refused columns) gets its own error
    and the others land; a cancelled one that was still waiting never runs."""

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            await buffer.store(_row("old", 0, row_id="dup"))
            groups: list[int] = []
            together = buffer.sync.sql.write_together

            def spy(writes: Any) -> Any:
                groups.append(len(writes))
                return together(writes)

            buffer.sync.sql.write_together = spy  # type: ignore[method-assign]
            gate = threading.Event()
            blocker = asyncio.create_task(buffer.run(_waits_for(gate)))
            while not buffer.calls._running:
                await asyncio.sleep(0.001)
            good = [asyncio.create_task(buffer.extend(_columns(f"g{k}", 4))) for k in range(8)]
            rows = [asyncio.create_task(buffer.store_batch([_row("r", i) for i in range(3)]))]
            dup = asyncio.create_task(buffer.extend(_columns("d", 2, ids=["new", "dup"])))
            short = asyncio.create_task(buffer.extend({**_columns("s", 2), "step": [1]}))
            cancelled = asyncio.create_task(buffer.extend(_columns("c", 2)))
            skipped = asyncio.create_task(
                buffer.store_batch([_row("r", i) for i in range(3)], dedup="skip", report=True)
            )
            await asyncio.sleep(0)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            gate.set()
            await blocker
            assert [await t for t in good] == [4] * 8
            assert await rows[0] == 3
            with pytest.raises(DuplicateIdError, match="dup"):
                await dup
            with pytest.raises(InvalidArgumentError, match="step"):
                await short
            report = await skipped
            assert (report.stored, report.duplicates) == (0, 3)
            await buffer.settle()
            assert groups[0] == 12  # one transaction tried for the 12 writes waiting
            tasks = await buffer.task_ids()
            assert sorted(tasks) == sorted(["old", "r", *(f"g{k}" for k in range(8))])
            assert await buffer.count() == 1 + 32 + 3
            assert await buffer.get("new") is None

    asyncio.run(main())


def test_batches_stream_what_the_sync_stream_gives(db_url: str, buffer_name: str) -> None:
    async def main() -> list[list[str]]:
        async with AsyncReplayBuffer(db_url, name=buffer_name) as buffer:
            await buffer.store_batch([_row("t", i, row_id=f"r{i}") for i in range(20)])
            got = []
            async with buffer.batches(UniformSampler(seed=5), batch_size=4, num_batches=3) as s:
                async for batch in s:
                    got.append([row.id for row in batch])
                assert s.last_info is not None and list(s.last_info.ids) == got[-1]
            return got

    got = asyncio.run(main())
    with ReplayBuffer(db_url, name=buffer_name) as sync:
        with sync.batches(UniformSampler(seed=5), batch_size=4, num_batches=3) as stream:
            assert [[row.id for row in batch] for batch in stream] == got
    assert len(got) == 3


def test_a_sample_waiting_on_the_rate_limit_does_not_hold_up_the_writes(
    db_url: str, buffer_name: str
) -> None:
    """Under a rate limit a sample waits for rows (min_size): on a thread of its own, so
    the writes of the same handle (one call thread) reach it."""
    from expstore import RateLimiter

    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            await buffer.set_rate_limiter(RateLimiter(min_size=4, timeout_s=GATE_S))

            async def write() -> None:
                for i in range(4):
                    await asyncio.sleep(0)
                    await buffer.store(_row("t", i))

            batch, _ = await asyncio.gather(buffer.sample(batch_size=2), write())
            assert len(batch) == 2

    asyncio.run(main())


def test_closing_ends_the_waits_running(db_url: str, buffer_name: str) -> None:
    async def main() -> None:
        buffer = AsyncReplayBuffer(db_url, name=buffer_name)
        waiting = asyncio.create_task(buffer.wait_for(1, timeout_s=3600))
        while not buffer.calls._running:
            await asyncio.sleep(0.001)
        await asyncio.wait_for(buffer.aclose(), GATE_S)  # an hour's wait would not end
        with pytest.raises(WaitTimeoutError):
            await waiting

    asyncio.run(main())


def test_settle_can_be_cancelled_and_leaves_the_calls_running(tmp_path: Any) -> None:
    """Cancelling a settle() ends the wait, not the calls it waited for."""

    async def main() -> None:
        async with AsyncReplayBuffer(f"sqlite:///{tmp_path / 'b.db'}") as buffer:
            gate = threading.Event()
            blocked = asyncio.create_task(buffer.run(_waits_for(gate)))
            while not buffer.calls._running:
                await asyncio.sleep(0.001)
            settling = asyncio.create_task(buffer.settle())
            await asyncio.sleep(0.01)
            settling.cancel()
            with pytest.raises(asyncio.CancelledError):
                await settling
            assert not blocked.done()
            gate.set()
            assert await blocked

    asyncio.run(main())
