"""Group commit: the writes an async handle's coroutines await at once, committed together.

When 64 rollouts on one event loop each await ``extend`` of a few rows, the writes queue
up behind the one the handle's thread is running. Instead of one transaction each, the
thread takes every write waiting when it gets to them and commits them in one
transaction (:meth:`expstore.storage.sql.SqlStorage.write_together`), as databases
group commits and Kafka's producer batches sends: each write is still whole, checked and
stored as its own call would, with its own report; if the shared transaction fails, each
runs again alone, so a bad write gets its own error and the others land. A write whose
``await`` is cancelled before the thread took it is never run; one already taken commits
with its group (``settle()`` then the database says which).

Used for ``extend`` and ``store_batch`` of a SQL buffer without a rate limit (whose
``block_writers`` waits are each write's own).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

from ..dedup import Dedup
from ..errors import StorageError
from ..limits.counters import WriteBlocked
from ..storage.sql import SqlStorage, WriteKind
from ..storage.writer import StoreReport
from .calls import Calls

__all__ = ["GroupCommit"]


class _Write:
    __slots__ = ("kind", "data", "dedup", "future")

    def __init__(self, kind: WriteKind, data: Any, dedup: Dedup, future: asyncio.Future[Any]):
        self.kind, self.data, self.dedup, self.future = kind, data, dedup, future


class GroupCommit:
    """The writes waiting for one handle's thread (see the module doc)."""

    def __init__(self, calls: Calls, storage: SqlStorage) -> None:
        self._calls = calls
        self._storage = storage
        self._lock = threading.Lock()
        self._waiting: list[_Write] = []
        self._queued = False  # a flush is queued on the thread and has not taken them yet

    async def write(self, kind: WriteKind, data: Any, dedup: Dedup) -> StoreReport:
        write = _Write(kind, data, dedup, asyncio.get_running_loop().create_future())
        with self._lock:
            self._waiting.append(write)
            start = not self._queued
            self._queued = True
        if start:
            try:
                self._calls.start(self._flush)
            except BaseException:
                with self._lock:
                    self._queued = False
                    self._waiting.remove(write)
                raise
        try:
            result = await write.future
        except asyncio.CancelledError:
            with self._lock:  # not taken yet: never run
                if write in self._waiting:
                    self._waiting.remove(write)
            raise
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    def _flush(self) -> None:
        """On the handle's thread: commit every write waiting now, together."""
        with self._lock:
            writes, self._waiting = self._waiting, []
            self._queued = False
        if not writes:
            return
        try:
            results: list[Any] = self._storage.write_together(
                [(w.kind, w.data, w.dedup) for w in writes]
            )
        except WriteBlocked:
            # A rate limit holds writers back (set since this handle looked): nothing was
            # written; each write waits its turn alone, on a thread that may wait.
            for write in writes:
                try:
                    self._calls.start(functools.partial(self._alone, write), waits=True)
                except StorageError as closed:  # the handle is closing: not written
                    self._deliver([write], [closed])
            return
        except BaseException as exc:  # every waiting caller hears of it
            results = [exc] * len(writes)
        self._deliver(writes, results)

    def _alone(self, write: _Write) -> None:
        try:
            result: Any = self._storage.write_alone(write.kind, write.data, write.dedup)
        except BaseException as exc:
            result = exc
        self._deliver([write], [result])

    @staticmethod
    def _deliver(writes: list[_Write], results: list[Any]) -> None:
        by_loop: dict[Any, list[tuple[_Write, Any]]] = {}
        for write, result in zip(writes, results, strict=True):
            by_loop.setdefault(write.future.get_loop(), []).append((write, result))
        for loop, done in by_loop.items():
            try:
                loop.call_soon_threadsafe(_set_results, done)
            except RuntimeError:  # that loop was closed: nobody is waiting any more
                pass


def _set_results(done: list[tuple[_Write, Any]]) -> None:
    for write, result in done:
        if not write.future.done():
            write.future.set_result(result)
