"""A group commit whose transaction COMMITTED but whose store_together then raised (here:
the dialect's after-commit hook ``wrote``, which on Postgres opens a new connection and
runs EXPLAIN/ANALYZE) is run again write by write: extend without ids stores its rows
twice, store_batch with ids reports a DuplicateIdError for rows it did store."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from expstore.aio import AsyncReplayBuffer
from expstore.errors import StorageError


def _columns(task: str, n: int) -> dict[str, Any]:
    return {"task_id": [task] * n, "agent_id": "a", "step": list(range(n)), "reward_t": np.ones(n)}


def test_a_failure_after_the_group_committed_does_not_write_twice(
    db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with AsyncReplayBuffer(db_url, name=buffer_name, threads=1) as buffer:
            dialect = buffer.sync.sql.handle.dialect
            real = dialect.wrote
            failed: list[int] = []

            def wrote(engine: Any, buffer_id: int, n: int) -> None:
                if not failed:  # the first after-commit call fails (a lost connection...)
                    failed.append(n)
                    raise StorageError("after-commit step failed")
                real(engine, buffer_id, n)

            monkeypatch.setattr(dialect, "wrote", wrote)
            gate = threading.Event()
            blocker = asyncio.create_task(buffer.run(lambda _s: gate.wait(20)))
            while not buffer.calls._running:
                await asyncio.sleep(0.001)
            writes = [asyncio.create_task(buffer.extend(_columns(f"g{k}", 4))) for k in range(3)]
            await asyncio.sleep(0)
            gate.set()
            await blocker
            await asyncio.gather(*writes, return_exceptions=True)
            assert failed == [12]  # the group of 3 writes committed, then wrote() raised
            # each extend was awaited once: the database must hold 12 rows, not 24
            assert await buffer.count() == 12

    asyncio.run(main())
