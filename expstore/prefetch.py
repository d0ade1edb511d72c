"""Batches made ahead in a background thread while the trainer works on the last one
(TorchRL's ``ReplayBuffer(prefetch=k)``), behind an iterator: ``buffer.batches(...)``.

:class:`Prefetcher` calls one function (a draw: choose, fetch, convert) over and over in a
thread of its own and keeps at most ``prefetch`` finished batches waiting. Batches come out
in the order they were made, so a seeded sampler gives the same batches as calling
``sample`` in a loop. An error is raised in the caller's thread at the batch it belongs
to (its traceback kept), after the batches made before it, and the stream ends there.
:meth:`Prefetcher.close` (or leaving its ``with`` block, or the iterator's collection)
stops the thread; a batch being made finishes first, and is dropped.

The database does the waiting (a round trip, a lock) and numpy, torch and the drivers let
go of the GIL while they copy, so the thread overlaps with training even in one Python
process; the Python-heavy parts of a draw still take turns with the trainer's own Python.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

from ._args import check_int

__all__ = ["Prefetcher"]

_T = TypeVar("_T")

#: How often a thread waiting to hand over a batch looks whether it was stopped (s).
_POLL_S = 0.05


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class _Worker:
    """The background thread's side, holding nothing of the iterator (so an iterator
    dropped without ``close()`` is collected, and its ``__del__`` stops the thread)."""

    def __init__(self, make: Callable[[], object], prefetch: int, num_batches: int | None):
        self.make = make
        self.num_batches = num_batches
        self.stop = threading.Event()
        self.queue: queue.Queue[object] = queue.Queue(maxsize=prefetch)
        self.thread = threading.Thread(target=self.run, name="expstore-prefetch", daemon=True)
        self.thread.start()

    def run(self) -> None:
        made = 0
        while not self.stop.is_set():
            if self.num_batches is not None and made >= self.num_batches:
                self.hand_over(_DONE)
                return
            try:
                item: object = self.make()
            except BaseException as exc:  # raised in the caller's thread, at its batch
                self.hand_over(_Failed(exc))
                return
            made += 1
            if not self.hand_over(item):
                return

    def hand_over(self, item: object) -> bool:
        """Put ``item`` in the queue, waiting for room; False if stopped meanwhile."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def drain(self) -> None:
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return

    def shut(self) -> None:
        """Stop the thread and drop what it made ahead (waits for the batch being made)."""
        self.stop.set()
        while self.thread.is_alive():  # make room, so a thread handing over sees the stop
            self.drain()
            self.thread.join(timeout=_POLL_S)
        self.drain()


class Prefetcher(Generic[_T], Iterator[_T]):
    """``Prefetcher(make, prefetch=2, num_batches=None)``: an iterator of ``make()``'s
    results, ``num_batches`` of them (None: endless), up to ``prefetch`` made ahead in a
    background thread (0: each made when asked, in the caller's thread).

    ``waited_s`` is the time the caller spent waiting in ``next()`` in all, ``batches``
    how many it was given.
    """

    def __init__(
        self, make: Callable[[], _T], *, prefetch: int = 2, num_batches: int | None = None
    ) -> None:
        self.prefetch = check_int("prefetch", prefetch, minimum=0)
        self.num_batches = check_int("num_batches", num_batches, minimum=0, optional=True)
        self._make = make
        self.batches = 0
        self.waited_s = 0.0
        self._ended = False
        self._worker: _Worker | None = None
        if self.prefetch and self.num_batches != 0:
            self._worker = _Worker(make, self.prefetch, self.num_batches)

    def __iter__(self) -> Prefetcher[_T]:
        return self

    def __next__(self) -> _T:
        if self._ended:
            raise StopIteration
        started = time.perf_counter()
        try:
            if self._worker is None:
                if self.num_batches is not None and self.batches >= self.num_batches:
                    self._ended = True
                    raise StopIteration
                try:
                    item: object = self._make()
                except BaseException:
                    self._ended = True
                    raise
            else:
                item = self._worker.queue.get()
        finally:
            self.waited_s += time.perf_counter() - started
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        if item is _DONE:
            self.close()
            raise StopIteration
        self.batches += 1
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop making batches: the thread finishes the batch it is making (dropped) and
        ends; the iterator is exhausted. Safe to call more than once."""
        self._ended = True
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shut()

    def __enter__(self) -> Prefetcher[_T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.stop.set()  # the thread ends at its next look (no join in a finaliser)

    def __repr__(self) -> str:
        return (
            f"Prefetcher(prefetch={self.prefetch}, num_batches={self.num_batches}, "
            f"batches={self.batches}, waited_s={self.waited_s:.3f})"
        )
