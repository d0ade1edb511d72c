"""Blocking calls run off the event loop: the threads of one async handle.

Every call of an :class:`~expstore.aio.AsyncReplayBuffer` runs the synchronous buffer's own
code (compiled statements, row cache, retries) on a thread the handle owns, and the
coroutine awaiting it waits on the loop without blocking it, as aiosqlite does inside.

- **Calls** go to the handle's call threads (``threads``, 1 by default: a SQLite database
  takes one write at a time anyway, and one thread keeps the calls of one handle in the
  order they were made).
- **Waits** (a claim with ``wait_s=``, ``wait_for``) go to threads of their own, so a learner
  waiting for rows never holds up the writes that bring them.
- **Cancellation.** A cancelled ``await`` of a call that has not started yet runs nothing.
  One already running finishes on its thread and commits whole or not at all, as the
  synchronous call does; a wait it was in ends at once (see
  :func:`expstore._retry.interruptible`), giving up. :meth:`Calls.settle` waits for such
  calls to end, after which the database says which way each went (a row's id, a claim's
  ``state``). A claim that lands after its caller was cancelled is released at once, so
  its rows go back to the queue instead of waiting out the lease.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from .._retry import interruptible
from ..errors import InvalidArgumentError, StorageError

__all__ = ["Calls"]

P = ParamSpec("P")
R = TypeVar("R")

#: Threads a handle's waits may hold at once (a claim with ``wait_s=``, ``wait_for``).
MAX_WAITS = 32


class Calls:
    """The threads of one async handle: ``threads`` for calls, up to :data:`MAX_WAITS` for
    waits, started on first use and stopped by :meth:`close`."""

    def __init__(self, threads: int = 1) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidArgumentError(
                f"threads must be a whole number of at least 1 (the handle's call threads), "
                f"got {threads!r}"
            )
        self.threads = threads
        self._calls = ThreadPoolExecutor(threads, thread_name_prefix="expstore-aio")
        self._waits: ThreadPoolExecutor | None = None
        # Calls started and not ended: their stop events (waits' only: interrupt_waits()).
        self._running: dict[Future[Any], threading.Event | None] = {}
        self._lock = threading.Lock()
        self.closed = False

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` on a call thread, awaited without blocking the loop."""
        return await self._submit(False, None, fn, *args, **kwargs)

    async def wait(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)``, a call that may wait long, on a thread of its own."""
        return await self._submit(True, None, fn, *args, **kwargs)

    async def run_then(
        self,
        waits: bool,
        abandoned: Callable[[R], object],
        fn: Callable[P, R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """As :meth:`run` (``waits``: :meth:`wait`), then, if the call returns after its
        caller was cancelled, ``abandoned(result)`` on a call thread (a claim to release, a
        storage to close)."""
        return await self._submit(waits, abandoned, fn, *args, **kwargs)

    def start(self, fn: Callable[[], object], *, waits: bool = False) -> None:
        """Queue ``fn()`` on a call thread (``waits``: a thread of its own) without awaiting
        it (it tells its own callers how it went; :meth:`settle` waits for it)."""
        self._queue(waits, fn)

    def _queue(self, waits: bool, fn: Callable[[], R]) -> tuple[Future[R], threading.Event]:
        stop = threading.Event()

        def call() -> R:
            with interruptible(stop):
                return fn()

        with self._lock:
            if self.closed:
                raise StorageError("this async buffer handle was closed (aclose()); open a new one")
            pool = self._calls
            if waits:
                if self._waits is None:
                    self._waits = ThreadPoolExecutor(MAX_WAITS, "expstore-aio-wait")
                pool = self._waits
            future = pool.submit(call)
            self._running[future] = stop if waits else None
        future.add_done_callback(self._finished)
        return future, stop

    async def _submit(
        self,
        waits: bool,
        abandoned: Callable[[R], object] | None,
        fn: Callable[P, R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        future, stop = self._queue(waits, functools.partial(fn, *args, **kwargs))
        try:
            # Cancelling the awaiting task cancels a call not yet started (it never runs);
            # one running finishes on its thread.
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            stop.set()
            if abandoned is not None:
                # Never inline: a future already done runs its callback here, on the loop.
                future.add_done_callback(lambda done: self._abandon(done, abandoned))
            raise

    def _abandon(self, done: Future[R], abandoned: Callable[[R], object]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        result = done.result()
        try:
            self.start(lambda: _quietly(abandoned, result))
        except StorageError:  # closed meanwhile: the lease (or the pool) ends it
            pass

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.pop(future, None)

    async def settle(self) -> None:
        """Wait until every call started on this handle has ended (those whose callers
        were cancelled included): then the database holds what each did."""
        while True:  # (a call may start another: a group commit's writes alone)
            with self._lock:
                running = list(self._running)
            if not running:
                return
            # Their results and errors were their callers'; cancelling this wait leaves
            # the calls running.
            await asyncio.wait([asyncio.wrap_future(future) for future in running])

    def interrupt_waits(self) -> None:
        """End the waits running now (their callers get the wait's timeout error)."""
        with self._lock:
            stops = [stop for stop in self._running.values() if stop is not None]
        for stop in stops:
            stop.set()

    def refuse(self) -> None:
        """Refuse new calls from now on (the first step of closing)."""
        with self._lock:
            self.closed = True

    def close(self, wait: bool = True) -> None:
        """Refuse new calls and stop the threads (after the calls queued or running, with
        ``wait``)."""
        self.refuse()
        self._calls.shutdown(wait=wait)
        if self._waits is not None:
            self._waits.shutdown(wait=wait)


def _quietly(fn: Callable[[R], object], value: R) -> None:
    try:
        fn(value)
    except Exception:  # nobody is there to hear it; a claim's lease ends it anyway
        pass
