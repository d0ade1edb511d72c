"""An async handle over a Storage that is not SQL; aclose() twice."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from expstore import ReplayBuffer
from expstore.aio import AsyncReplayBuffer
from expstore.storage.base import Storage
from expstore.storage.sql import SqlStorage


def _proxy(inner: SqlStorage) -> Storage:
    """A Storage that is not a SqlStorage (a user's own; here delegating to SQL)."""
    names = set(Storage.__abstractmethods__)

    def delegate(name: str) -> Any:
        return lambda self, *a, **k: getattr(inner, name)(*a, **k)

    ns: dict[str, Any] = {n: delegate(n) for n in names if n != "url"}
    ns["url"] = property(lambda self: inner.url)
    ns["name"] = inner.name
    ns["__getattr__"] = lambda self, n: getattr(inner, n)
    return type("MyStorage", (Storage,), ns)()


def test_extend_on_a_storage_that_is_not_sql(db_url: str, buffer_name: str) -> None:
    cols = {"task_id": ["t0", "t1"], "agent_id": "a", "step": 0, "reward_t": np.ones(2)}
    storage = _proxy(SqlStorage(db_url, name=buffer_name))
    sync = ReplayBuffer(storage)
    assert sync.extend(cols) == 2  # the sync buffer takes it

    async def main() -> None:
        buffer = AsyncReplayBuffer.wrap(sync)
        assert await buffer.extend(cols) == 2  # the async one: the same, promised

    asyncio.run(main())


def test_aclose_twice(db_url: str, buffer_name: str) -> None:
    async def main() -> None:
        buffer = AsyncReplayBuffer(db_url, name=buffer_name)
        await buffer.aclose()
        await buffer.aclose()  # sync close() may be called twice

    sync = ReplayBuffer(db_url, name=buffer_name)
    sync.close()
    sync.close()
    asyncio.run(main())
