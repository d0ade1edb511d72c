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

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

from ._args import check_int

__all__ = ["Hooks", "Prefetcher"]

_T = TypeVar("_T")

#: How often a waiting thread (to hand over a batch, or for one) looks whether the stream
#: was stopped (s).
_POLL_S = 0.05
#: How long close() waits for the batch being made (a rate limit's wait may outlast it:
#: that batch is then dropped by the thread itself when it ends).
_CLOSE_WAIT_S = 0.5


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class Hooks(Generic[_T]):
    """What a stream does besides making batches (each optional):

    - ``mark()`` is called before each batch is made and ``rewind(mark)`` with the mark of
      the first batch made but never handed out, once the thread has stopped (a sampler's
      epoch goes back to where the caller stopped taking batches);
    - ``discard(batch)`` for each batch made and never handed out (a rate limit's count
      given back), in the thread;
    - ``deliver(batch)`` in the caller's thread as a batch is handed out, returning what
      the caller gets and what the stream keeps as its ``last_info`` (the batch's
      sampler info).
    """

    def __init__(
        self,
        *,
        mark: Callable[[], object] | None = None,
        rewind: Callable[[object], None] | None = None,
        discard: Callable[[_T], None] | None = None,
        deliver: Callable[[_T], tuple[object, object]] | None = None,
    ) -> None:
        self.mark = mark
        self.rewind = rewind
        self.discard = discard
        self.deliver = deliver


class _Worker:
    """The background thread's side, holding nothing of the iterator (so an iterator
    dropped without ``close()`` is collected, and its ``__del__`` stops the thread)."""

    def __init__(
        self, make: Callable[[], object], prefetch: int, num_batches: int | None, hooks: Hooks[Any]
    ) -> None:
        self.make = make
        self.num_batches = num_batches
        self.hooks = hooks
        self.stop = threading.Event()
        self.queue: queue.Queue[object] = queue.Queue(maxsize=prefetch)
        #: Batches taken by the caller (counted by the iterator, read when the thread ends).
        self.taken = 0
        self.thread = threading.Thread(target=self.run, name="expstore-prefetch", daemon=True)
        self.thread.start()

    def run(self) -> None:
        marks: list[object] = []  # the mark before each batch made
        held: object = None  # a batch made that the stop kept from the queue
        try:
            while not self.stop.is_set():
                if self.num_batches is not None and len(marks) >= self.num_batches:
                    self.hand_over(_DONE)
                    return
                marks.append(self.hooks.mark() if self.hooks.mark else None)
                try:
                    item: object = self.make()
                except BaseException as exc:  # raised in the caller's thread, at its batch
                    marks.pop()  # (a failed batch gave nothing to go back over)
                    self.hand_over(_Failed(exc))
                    return
                if not self.hand_over(item):
                    held = item
                    return
        finally:
            if self.stop.is_set():
                self.settle(marks, held)

    def settle(self, marks: list[object], held: object) -> None:
        """Stopped: drop what was made and not taken, and rewind to the first of it."""
        dropped: list[object] = []
        while True:
            try:
                dropped.append(self.queue.get_nowait())
            except queue.Empty:
                break
        if held is not None:
            dropped.append(held)
        dropped = [d for d in dropped if d is not _DONE and not isinstance(d, _Failed)]
        # Best effort, with no caller left to tell: the database may be gone by now (a
        # batch that waited out a rate limit after close()).
        with contextlib.suppress(Exception):
            if self.hooks.discard is not None:
                for item in dropped:
                    self.hooks.discard(item)
            first = self.taken
            if dropped and self.hooks.rewind is not None and first < len(marks):
                self.hooks.rewind(marks[first])

    def hand_over(self, item: object) -> bool:
        """Put ``item`` in the queue, waiting for room; False if stopped meanwhile."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def shut(self) -> None:
        """Stop the thread; wait a while for the batch being made (the thread drops what
        it made, and rewinds, when it ends)."""
        self.stop.set()
        self.thread.join(timeout=_CLOSE_WAIT_S)


class Prefetcher(Generic[_T], Iterator[_T]):
    """``Prefetcher(make, prefetch=2, num_batches=None, hooks=None)``: an iterator of
    ``make()``'s results, ``num_batches`` of them (None: endless), made ahead in a
    background thread: ``prefetch`` waiting and one being made (0: each made when asked,
    in the caller's thread). ``hooks`` (:class:`Hooks`): what the stream does besides.

    ``waited_s`` is the time the caller spent waiting in ``next()`` in all, ``batches``
    how many it was given.
    """

    def __init__(
        self,
        make: Callable[[], Any],
        *,
        prefetch: int = 2,
        num_batches: int | None = None,
        hooks: Hooks[Any] | None = None,
    ) -> None:
        self.prefetch = check_int("prefetch", prefetch, minimum=0)
        self.num_batches = check_int("num_batches", num_batches, minimum=0, optional=True)
        self._make = make
        self._hooks: Hooks[Any] = hooks if hooks is not None else Hooks()
        self.batches = 0
        self.waited_s = 0.0
        #: What ``hooks.deliver`` said of the batch last handed out (None without one).
        self.last_info: Any = None
        self._ended = False
        self._worker: _Worker | None = None
        if self.prefetch and self.num_batches != 0:
            self._worker = _Worker(make, self.prefetch, self.num_batches, self._hooks)

    def __iter__(self) -> Prefetcher[_T]:
        return self

    def __next__(self) -> _T:
        if self._ended:
            raise StopIteration
        started = time.perf_counter()
        try:
            item = self._next_item()
        finally:
            self.waited_s += time.perf_counter() - started
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        if item is _DONE:
            self.close()
            raise StopIteration
        self.batches += 1
        deliver = self._hooks.deliver
        if deliver is None:
            return item  # type: ignore[return-value]
        batch, self.last_info = deliver(item)
        return batch  # type: ignore[return-value]

    def _next_item(self) -> object:
        worker = self._worker
        if worker is None:
            if self.num_batches is not None and self.batches >= self.num_batches:
                self._ended = True
                raise StopIteration
            try:
                return self._make()
            except BaseException:
                self._ended = True
                raise
        while True:  # (a close() from another thread ends the wait)
            try:
                item = worker.queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._ended or worker.stop.is_set():
                    raise StopIteration from None
                continue
            if not isinstance(item, _Failed) and item is not _DONE:
                worker.taken += 1
            return item

    def close(self) -> None:
        """Stop making batches. The batches made ahead are dropped (their rate-limit
        count given back, the sampler's epoch rewound to the first of them); a batch
        still being made (waiting on a rate limit, say) is dropped when it is done. The
        iterator is exhausted. Safe to call more than once, from any thread."""
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
