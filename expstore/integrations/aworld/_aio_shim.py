"""Stand-in for expstore.aio.AsyncReplayBuffer until it lands on main (to be deleted)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...buffer import ReplayBuffer


class AsyncReplayBuffer:
    def __init__(self, storage: Any = None, **options: Any) -> None:
        self.sync = (
            storage if isinstance(storage, ReplayBuffer) else ReplayBuffer(storage, **options)
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="expstore-aio")

    @classmethod
    def wrap(cls, buffer: ReplayBuffer) -> AsyncReplayBuffer:
        return cls(buffer)

    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self._pool.submit(fn, self.sync, *args, **kwargs))

    async def aclose(self) -> None:
        self._pool.shutdown()
        self.sync.close()
