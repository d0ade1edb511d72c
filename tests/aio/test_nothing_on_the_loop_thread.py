"""Database statements run on the event loop's thread by expstore.aio calls made from a
coroutine (each one a blocking call on the loop)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sqlalchemy import event

from expstore import ReplayBuffer, UniformSampler
from expstore.aio import AsyncReplayBuffer
from tests.helpers import make_row


def _on_loop(buffer: ReplayBuffer) -> list[str]:
    seen: list[str] = []
    loop_thread = threading.current_thread()

    def before(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        if threading.current_thread() is loop_thread:
            seen.append(statement.split("\n")[0][:80])

    event.listen(buffer.sql.handle.connections.engine, "before_cursor_execute", before)
    return seen


def test_wrap_from_a_coroutine_queries_on_the_loop(db_url: str, buffer_name: str) -> None:
    sync = ReplayBuffer(db_url, name=buffer_name)
    ReplayBuffer(db_url, name=buffer_name).store_batch([make_row("t", "a", i) for i in range(8)])
    assert sync.sql.rate_limits.seen is None  # a fresh handle: never looked
    seen = _on_loop(sync)

    async def main() -> None:
        seen.clear()
        buffer = AsyncReplayBuffer.wrap(sync)  # documented as the way to wrap a buffer
        assert not seen
        async with buffer.batches(UniformSampler(seed=1), batch_size=2, num_batches=1) as s:
            async for _ in s:
                pass
        await buffer.aclose()

    asyncio.run(main())
