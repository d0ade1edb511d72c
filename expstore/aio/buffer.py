"""AsyncReplayBuffer: :class:`~expstore.ReplayBuffer` for asyncio code.

>>> import asyncio
>>> from expstore import DataRow, Experience, ExpMeta
>>> from expstore.aio import AsyncReplayBuffer
>>> async def main() -> int:
...     async with AsyncReplayBuffer() as buffer:
...         await buffer.store(DataRow(exp_meta=ExpMeta(task_id="t1", agent_id="a", step=0),
...                                    exp_data=Experience(reward_t=1.0)))
...         return await buffer.count()
>>> asyncio.run(main())
1
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from itertools import islice
from types import TracebackType
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from sqlalchemy.engine import URL

from .._args import check_flag
from ..buffer import ReplayBuffer
from ..claims import DEFAULT_LEASE_S
from ..converters.base import Converter
from ..db.tuning import Tuning
from ..dedup import Dedup
from ..errors import UnsupportedTypeError
from ..model.rows import DataRow
from ..prefetch import Prefetcher
from ..query import QueryCondition
from ..retention.eviction import Eviction
from ..storage.base import Storage
from ..storage.cache import CacheStats
from ..storage.sql import SqlStorage, WriteKind
from ..storage.writer import StoreReport
from .calls import Calls
from .claims import AsyncClaim, AsyncConsumer, claim_on
from .group_commit import GroupCommit

__all__ = ["AsyncReplayBuffer"]

P = ParamSpec("P")
R = TypeVar("R")

#: Rows :meth:`AsyncReplayBuffer.query` reads per trip to its thread.
QUERY_CHUNK = 256


def _on_thread(
    method: Callable[Concatenate[ReplayBuffer, P], R],
) -> Callable[Concatenate[AsyncReplayBuffer, P], Coroutine[Any, Any, R]]:
    """The coroutine of :class:`ReplayBuffer`'s ``method``, run on the handle's thread
    (a thread of its own when the buffer has a rate limit, whose waits could otherwise hold
    up the writes they wait for); same arguments, same result, same docs."""

    async def call(self: AsyncReplayBuffer, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._limited():
            return await self.calls.wait(method, self.sync, *args, **kwargs)
        return await self.calls.run(method, self.sync, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


class AsyncReplayBuffer:
    """:class:`~expstore.ReplayBuffer` whose database calls are coroutines that never block
    the event loop: the same arguments, results, errors and guarantees, for agent and
    learner code written with asyncio (AWorld, AReaL, verl, SkyRL...).

    ``AsyncReplayBuffer(storage=None, *, threads=1, **options)``: ``storage`` and
    ``options`` as :class:`~expstore.ReplayBuffer`'s (``name``, ``capacity``,
    ``eviction``, ``cache_bytes``...); or :meth:`wrap` an open ReplayBuffer. Each call runs
    the synchronous buffer's own code on a thread the handle owns (``threads`` of them;
    waits, ``claim(wait=...)`` and ``wait_for``, on threads of their own), so a blocking
    database call never stalls the other coroutines; see :mod:`expstore.aio.calls` for why
    threads rather than SQLAlchemy's asyncio drivers, and for cancellation: a cancelled
    ``await`` of a write leaves it committed whole or not at all (``await settle()``, then
    look for its ids, or store with ids and ``dedup="skip"`` to retry safely). Sync and
    async handles of one database see each other's writes at once (they are one database).

    ``buffer.sync`` is the synchronous buffer underneath (for what is not a database
    call: ``cache_stats()``, ``sql``); ``await buffer.run(fn, *args)`` runs any
    ``fn(sync_buffer, *args)`` on the handle's thread, e.g. several calls in a row.
    """

    def __init__(
        self,
        storage: Storage | str | URL | None = None,
        *,
        threads: int = 1,
        name: str = "default",
        capacity: int | None = None,
        eviction: Eviction | None = None,
        upgrade: bool = False,
        read_urls: Sequence[str | URL] | None = None,
        read_your_writes: bool = False,
        max_lag_s: float | None = None,
        tuning: Tuning | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        calls = Calls(threads)
        # Opening runs migrations and reads settings: done here, before any loop runs it,
        # as sync code (use ``await AsyncReplayBuffer.open(...)`` from a running loop).
        sync = ReplayBuffer(
            storage,
            name=name,
            capacity=capacity,
            eviction=eviction,
            upgrade=upgrade,
            read_urls=read_urls,
            read_your_writes=read_your_writes,
            max_lag_s=max_lag_s,
            tuning=tuning,
            cache_bytes=cache_bytes,
        )
        self._attach(calls, sync)
        self._look_for_a_rate_limit()

    def _attach(self, calls: Calls, sync: ReplayBuffer) -> None:
        self.calls = calls
        self.sync = sync
        storage = sync.storage
        self._group = GroupCommit(calls, storage) if isinstance(storage, SqlStorage) else None

    @classmethod
    def wrap(cls, buffer: ReplayBuffer, *, threads: int = 1) -> AsyncReplayBuffer:
        """An async handle over ``buffer`` (which stays usable as it is; closing either
        closes the storage)."""
        if not isinstance(buffer, ReplayBuffer):
            raise UnsupportedTypeError(
                f"AsyncReplayBuffer.wrap() takes a ReplayBuffer, got {type(buffer).__name__}"
            )
        handle = cls.__new__(cls)
        handle._attach(Calls(threads), buffer)  # (a rate limit not known yet: assumed)
        return handle

    @classmethod
    async def open(
        cls, storage: Storage | str | URL | None = None, **options: Any
    ) -> AsyncReplayBuffer:
        """:class:`AsyncReplayBuffer` opened on a thread, so opening a database (creating or
        upgrading its schema, reading the buffer's settings) does not block a running loop
        either: ``buffer = await AsyncReplayBuffer.open("sqlite:///x.db", capacity=...)``."""
        threads = options.pop("threads", 1)
        calls = Calls(threads)
        try:
            sync = await calls.run_then(
                False, ReplayBuffer.close, functools.partial(ReplayBuffer, storage, **options)
            )
            handle = cls.__new__(cls)
            handle._attach(calls, sync)
            await calls.run(handle._look_for_a_rate_limit)
        except BaseException:
            calls.close(wait=False)
            raise
        return handle

    def _look_for_a_rate_limit(self) -> None:
        """Read whether the buffer has a rate limit (with opening: a read of its own)."""
        sql = self.sync.storage
        if isinstance(sql, SqlStorage):
            sql.rate_limits.maybe_limited()

    def _limited(self) -> bool:
        """Whether calls may wait on the buffer's rate limit, as this handle last saw (a
        limit set since by another process is seen at its first sample or claim here;
        unknown: yes)."""
        sql = self.sync.storage
        if not isinstance(sql, SqlStorage):
            return False
        seen = sql.rate_limits.seen
        return seen is None or bool(seen[1])

    async def run(
        self, fn: Callable[Concatenate[ReplayBuffer, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``fn(buffer.sync, *args, **kwargs)`` on the handle's thread."""
        return await self.calls.run(fn, self.sync, *args, **kwargs)

    async def settle(self) -> None:
        """Wait until every call started on this handle has ended, including those whose
        ``await`` was cancelled: then the database holds what each did."""
        await self.calls.settle()

    # -- writing -------------------------------------------------------------------------
    store = _on_thread(ReplayBuffer.store)

    @overload
    async def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: Literal[False] = False
    ) -> int: ...

    @overload
    async def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: Literal[True]
    ) -> StoreReport: ...

    async def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: bool = False
    ) -> int | StoreReport:
        """:meth:`ReplayBuffer.store_batch <expstore.ReplayBuffer.store_batch>`, awaited;
        writes awaited at once commit together, each whole (see
        :mod:`expstore.aio.group_commit`)."""
        return await self._write("store_batch", rows, dedup, check_flag("report", report))

    @overload
    async def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: Literal[False] = False
    ) -> int: ...

    @overload
    async def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: Literal[True]
    ) -> StoreReport: ...

    async def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: bool = False
    ) -> int | StoreReport:
        """:meth:`ReplayBuffer.extend <expstore.ReplayBuffer.extend>`, awaited; writes
        awaited at once commit together, each whole (see :mod:`expstore.aio.group_commit`)."""
        return await self._write("extend", columns, dedup, check_flag("report", report))

    async def _write(
        self, kind: WriteKind, data: Any, dedup: Dedup, report: bool
    ) -> int | StoreReport:
        limited = self._limited()
        if self._group is not None and not limited:
            done = await self._group.write(kind, data, dedup)
            return done if report else done.stored
        # Alone: a storage that is not SQL, or under a rate limit (a wait of its own).
        run = self.calls.wait if limited else self.calls.run
        return await run(_write_alone, self.sync, kind, data, dedup, report)

    delete = _on_thread(ReplayBuffer.delete)
    clear = _on_thread(ReplayBuffer.clear)
    update_priorities = _on_thread(ReplayBuffer.update_priorities)
    store_prompts = _on_thread(ReplayBuffer.store_prompts)

    # -- reading -------------------------------------------------------------------------
    get = _on_thread(ReplayBuffer.get)
    count = _on_thread(ReplayBuffer.count)
    page = _on_thread(ReplayBuffer.page)
    get_by_task_id = _on_thread(ReplayBuffer.get_by_task_id)
    get_batch_by_task_ids = _on_thread(ReplayBuffer.get_batch_by_task_ids)
    task_ids = _on_thread(ReplayBuffer.task_ids)
    to_arrow = _on_thread(ReplayBuffer.to_arrow)
    to_pandas = _on_thread(ReplayBuffer.to_pandas)
    lineage = _on_thread(ReplayBuffer.lineage)
    queue_stats = _on_thread(ReplayBuffer.queue_stats)

    async def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        order_by: str = "key",
    ) -> AsyncIterator[DataRow]:
        """``async for row in buffer.query(...)``: the matching rows as
        :meth:`ReplayBuffer.query <expstore.ReplayBuffer.query>` streams them, read
        :data:`QUERY_CHUNK` at a time on the handle's thread."""
        rows = await self.calls.run(
            self.sync.query, query_condition, limit=limit, offset=offset, order_by=order_by
        )
        while True:
            chunk = await self.calls.run(_take, rows)
            for row in chunk:
                yield row
            if len(chunk) < QUERY_CHUNK:
                return

    # -- sampling ------------------------------------------------------------------------
    sample = _on_thread(ReplayBuffer.sample)
    sample_task = _on_thread(ReplayBuffer.sample_task)

    def batches(
        self,
        sampler: Any = None,
        query_condition: QueryCondition = None,
        converter: Any = None,
        batch_size: int = 1000,
        *,
        prefetch: int = 2,
        num_batches: int | None = None,
    ) -> AsyncBatches:
        """:meth:`ReplayBuffer.batches <expstore.ReplayBuffer.batches>` for ``async for``:
        batches made ahead in the stream's own thread, each awaited without blocking the
        loop; ``async with`` (or ``await stream.aclose()``) stops it::

            async with buffer.batches(sampler, converter=conv, batch_size=256) as stream:
                async for batch in stream:
                    await train_step(batch)
        """
        stream = self.sync.batches(
            sampler,
            query_condition,
            converter,
            batch_size,
            prefetch=prefetch,
            num_batches=num_batches,
        )
        return AsyncBatches(self.calls, stream)

    # -- settings ------------------------------------------------------------------------
    create_index = _on_thread(ReplayBuffer.create_index)
    drop_index = _on_thread(ReplayBuffer.drop_index)
    indexes = _on_thread(ReplayBuffer.indexes)
    track_changes = _on_thread(ReplayBuffer.track_changes)
    untrack_changes = _on_thread(ReplayBuffer.untrack_changes)
    tracked_changes = _on_thread(ReplayBuffer.tracked_changes)
    create_summary = _on_thread(ReplayBuffer.create_summary)
    drop_summary = _on_thread(ReplayBuffer.drop_summary)
    summary_state = _on_thread(ReplayBuffer.summary_state)
    set_retention = _on_thread(ReplayBuffer.set_retention)
    retention = _on_thread(ReplayBuffer.retention)
    set_compression = _on_thread(ReplayBuffer.set_compression)
    compression = _on_thread(ReplayBuffer.compression)
    array_stats = _on_thread(ReplayBuffer.array_stats)
    set_policy_version = _on_thread(ReplayBuffer.set_policy_version)
    policy_version = _on_thread(ReplayBuffer.policy_version)
    set_rate_limiter = _on_thread(ReplayBuffer.set_rate_limiter)
    rate_limiter = _on_thread(ReplayBuffer.rate_limiter)
    rate_limit_stats = _on_thread(ReplayBuffer.rate_limit_stats)
    set_admission = _on_thread(ReplayBuffer.set_admission)
    admission = _on_thread(ReplayBuffer.admission)
    admission_stats = _on_thread(ReplayBuffer.admission_stats)
    ready_groups = _on_thread(ReplayBuffer.ready_groups)

    # -- claims --------------------------------------------------------------------------
    async def claim(
        self,
        batch_size: int,
        query_condition: QueryCondition = None,
        *,
        consumer: str,
        lease_s: float = DEFAULT_LEASE_S,
        order: Any = "oldest",
        converter: Converter[Any] | None = None,
        wait_s: float | None = None,
        max_staleness: int | None = None,
        min_batch_size: int | None = None,
    ) -> AsyncClaim:
        """:meth:`ReplayBuffer.claim <expstore.ReplayBuffer.claim>`, awaited; the claim's
        ``ack``, ``release``, ``renew`` and ``save_progress`` are coroutines. A claim that
        waits (``wait_s=``) does so on a thread of its own; cancelled, it stops waiting, and
        rows it took after all are released at once."""
        return await claim_on(
            self.calls,
            functools.partial(
                self.sync.claim,
                batch_size,
                query_condition,
                consumer=consumer,
                lease_s=lease_s,
                order=order,
                converter=converter,
                wait_s=wait_s,
                max_staleness=max_staleness,
                min_batch_size=min_batch_size,
            ),
        )

    async def consumer(self, name: str, *, takeover: bool = False) -> AsyncConsumer:
        """:meth:`ReplayBuffer.consumer <expstore.ReplayBuffer.consumer>`, awaited: a new
        incarnation of consumer ``name`` whose claims and steps are coroutines."""
        opened = await self.calls.run(self.sync.consumer, name, takeover=takeover)
        return AsyncConsumer(self.calls, opened)

    checkpoint = _on_thread(ReplayBuffer.checkpoint)

    async def wait_for(
        self,
        min_rows: int,
        query_condition: QueryCondition = None,
        *,
        timeout_s: float | None = None,
        claimable: bool = False,
        max_staleness: int | None = None,
    ) -> int:
        """:meth:`ReplayBuffer.wait_for <expstore.ReplayBuffer.wait_for>` on a thread of
        its own (the handle's writes go on meanwhile); cancelled, it stops polling."""
        return await self.calls.wait(
            self.sync.wait_for,
            min_rows,
            query_condition,
            timeout_s=timeout_s,
            claimable=claimable,
            max_staleness=max_staleness,
        )

    # -- what is not a database call -----------------------------------------------------
    def cache_stats(self) -> CacheStats:
        """This handle's row cache (see :meth:`expstore.ReplayBuffer.cache_stats`)."""
        return self.sync.cache_stats()

    # -- lifecycle -----------------------------------------------------------------------
    async def aclose(self) -> None:
        """End the waits running (a ``claim(wait=...)`` or ``wait_for`` raises its
        WaitTimeoutError), wait for the other calls started, then stop the threads and
        close the storage."""
        calls = self.calls
        if calls.closed:
            return
        calls.refuse()  # no new call from now on; then the waits end and the rest finish
        calls.interrupt_waits()
        await calls.settle()
        await asyncio.to_thread(self.sync.close)
        calls.close(wait=False)  # (every thread is idle by now)

    async def __aenter__(self) -> AsyncReplayBuffer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncReplayBuffer({self.sync.storage!r}, threads={self.calls.threads})"


class AsyncBatches:
    """The async face of a :class:`~expstore.prefetch.Prefetcher` (see
    :meth:`AsyncReplayBuffer.batches`); ``stream.sync`` is the Prefetcher (``last_info``,
    ``waited_s``, ``batches``)."""

    def __init__(self, calls: Calls, stream: Prefetcher[Any]) -> None:
        self._calls = calls
        self.sync = stream

    @property
    def last_info(self) -> Any:
        """What the batch last handed out was made of (see ``ReplayBuffer.batches``)."""
        return self.sync.last_info

    def __aiter__(self) -> AsyncBatches:
        return self

    async def __anext__(self) -> Any:
        item = await self._calls.wait(next, self.sync, _END)
        if item is _END:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        """Stop making batches (see :meth:`expstore.prefetch.Prefetcher.close`)."""
        await self._calls.run(self.sync.close)

    async def __aenter__(self) -> AsyncBatches:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


_END = object()


def _write_alone(
    sync: ReplayBuffer, kind: WriteKind, data: Any, dedup: Dedup, report: bool
) -> int | StoreReport:
    if kind == "extend":
        return (
            sync.extend(data, dedup=dedup, report=True)
            if report
            else sync.extend(data, dedup=dedup)
        )
    if report:
        return sync.store_batch(data, dedup=dedup, report=True)
    return sync.store_batch(data, dedup=dedup)


def _take(rows: Iterator[DataRow]) -> list[DataRow]:
    """Up to :data:`QUERY_CHUNK` more rows of the iterator ``rows``."""
    return list(islice(rows, QUERY_CHUNK))
