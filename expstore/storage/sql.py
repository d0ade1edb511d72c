"""SqlStorage: rows in SQLite (the embedded default) or PostgreSQL, through SQLAlchemy Core.

The storage is a thin front over one module per role, which a reader can find by name:

- :mod:`~expstore.db.engine`: engines and fork-aware connections;
- :mod:`~expstore.db.dialects`: what SQLite and Postgres each do their own way;
- :mod:`~expstore.db.handle`: which buffer, its statements, error translation;
- :mod:`~expstore.lifecycle.registry`: the buffer's row and version counters;
- :mod:`~expstore.retention.capacity`: the buffer's retention;
  :mod:`~expstore.retention.eviction`: the retention policies;
- :mod:`~expstore.storage.writer`: checking, encoding and inserting a batch, duplicates;
- :mod:`~expstore.storage.reader`: whole rows by id, key, condition, page and task;
- :mod:`~expstore.storage.fetch`: a few fields of chosen rows;
- :mod:`~expstore.priorities`: stored priorities and their log;
- :mod:`~expstore.policy_versions`: the current policy version and what is stale;
- :mod:`~expstore.limits.counters`: rate limits and their counters;
- :mod:`~expstore.storage.key_index`: the cached key arrays samplers choose from;
- :mod:`~expstore.group_summaries`: group summaries (GRPO groups);
- :mod:`~expstore.stats.summary`: stats as SQL aggregates;
  :mod:`~expstore.stats.task_stats`: per-task summaries kept by writers, and
  :mod:`~expstore.stats.summary_build`: creating, building and dropping them.

Writes run in one transaction each: the insert and any eviction inside it, so a batch is
stored whole or not at all. On SQLite, write transactions begin with ``BEGIN IMMEDIATE``
(after a busy timeout), so concurrent writers queue for the lock instead of failing with
"database is locked"; the journal is WAL, so readers never block writers. On Postgres,
inserts go through ``COPY`` and writers of a buffer serialise on that buffer's row, which
keeps a capacity exact.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import numpy as np
from sqlalchemy import Connection, delete
from sqlalchemy.engine import URL

from .. import draw_counts
from .. import policy_versions as versions
from .. import priorities as priority_log
from .._args import check_text
from ..arrays import stored_once as arrays
from ..db import migrate, path_indexes
from ..db.engine import create_sql_engine, is_memory, normalise_url
from ..db.handle import BufferHandle, read_tracked
from ..db.replicas import ReadRouter
from ..db.schema import buffers
from ..db.schema import rows as rows_table
from ..db.tuning import Tuning
from ..dedup import Dedup
from ..errors import InvalidArgumentError, RowValidationError, StorageError, UnsupportedTypeError
from ..group_summaries import GroupIndex, GroupSpec
from ..lifecycle import registry
from ..lifecycle.registry import BufferInfo
from ..limits.counters import RateLimits, WriteBlocked, discard_once
from ..model.columnar import column_error
from ..model.rows import DataRow
from ..query import QueryCondition
from ..retention import capacity as retention
from ..retention import tombstones
from ..retention.eviction import Eviction
from ..stats import summary_build, task_stats
from ..stats.summary import summarise
from ..tracking import changes
from . import writer
from .base import Fetched, KeySpace, Storage, Values
from .cache import DEFAULT_CACHE_BYTES, RowCache
from .column_rows import EncodedColumns, column_source
from .fetch import FieldFetcher
from .key_index import KeyIndex
from .key_space import KeySpaces
from .reader import ReadAlready, RowReader, RowsPage, key_list
from .writer import StoreReport

_log = logging.getLogger("expstore.storage")
#: Rows written are offered to the row cache only for this many paths read at most
#: (a trainer's converter reads a few; a process reading many paths, a viewer, reads rows
#: as it needs them).
_OFFERED_PATHS = 16

_T = TypeVar("_T")

__all__ = ["SqlStorage", "create_sql_engine"]

#: The two writes :meth:`SqlStorage.write_together` groups.
WriteKind = Literal["extend", "store_batch"]


class SqlStorage(Storage):
    """One named buffer in a SQL database.

    ``SqlStorage(url, name="default", capacity=None, eviction=None, upgrade=False)``

    - ``url``: ``sqlite:///path.db``, ``sqlite://`` (in memory, private to this object) or
      ``postgresql+psycopg://user@host:5432/db``.
    - ``name``: one database holds many buffers, isolated from each other.
    - ``capacity``: at most this many rows remain after every write; ``eviction`` chooses
      which go (``fifo``, the default, ``max_reward``, ``task_fifo``; see
      :mod:`expstore.retention.eviction`). Both are kept with the buffer in the database, so
      every handle and process that writes evicts alike: the first handle to give them
      sets them, a handle that gives neither uses them, and one that asks for others
      raises :class:`~expstore.errors.RetentionConflictError` (a ValueError).
      :meth:`set_retention` changes them for everyone.
    - ``upgrade``: upgrade an older schema instead of raising SchemaVersionError.
    - ``tuning``: a :class:`~expstore.db.tuning.Tuning`, knobs for tests and measurements
      (default ``Tuning()``): how much this storage keeps or reads at a time, never what
      the buffer holds or the distribution a draw follows.
    - ``cache_bytes``: the budget of this handle's decoded-row cache, which samples and
      claims fetch through (default :data:`~expstore.storage.cache.DEFAULT_CACHE_BYTES`,
      an eighth of the machine's memory, at least 256 MiB; 0 turns it off; see
      :mod:`expstore.storage.cache`).
    """

    def __init__(
        self,
        url: str | URL,
        *,
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
        if not isinstance(name, str) or not name or len(name) > 255:
            raise InvalidArgumentError(
                f"name must be a non-empty string of at most 255 chars, got {name!r}"
            )
        check_text("name", name)
        retention.check_retention(capacity, eviction)
        self.name = name
        self._upgrade = upgrade
        #: The URL as :attr:`identity` gives it (made on first use).
        self._where: str | None = None
        if tuning is not None and not isinstance(tuning, Tuning):
            raise UnsupportedTypeError(f"tuning must be a Tuning, got {type(tuning).__name__}")
        self._handle = handle = BufferHandle(normalise_url(url), name, tuning)
        self._reader = RowReader(handle)
        self._fields = FieldFetcher(self._reader)
        self._index = KeyIndex(handle)
        self._spaces = KeySpaces(handle, self._index.state)
        self._groups = GroupIndex(handle, self._index.state)
        self._limits = RateLimits(handle)
        self._index.on_limit = self._limits.observe
        #: The decoded-row cache :meth:`fetch` goes through (see ``cache_bytes``).
        self.row_cache = RowCache(DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes)
        handle.caches += [
            self.row_cache.reset,
            self._index.clear,
            self._spaces.clear,
            self._groups.clear,
        ]
        handle.connections.on_fork.append(handle.forget_caches)
        with handle.errors("open"):
            connections = handle.connections
            migrate.ensure_schema(connections.engine, connections.write_engine, upgrade=upgrade)
            handle.buffer_id = registry.open_buffer(handle)
            self.capacity, self.eviction = retention.settle_retention(handle, capacity, eviction)
            self._read: dict[str, Any] = {
                "read_urls": None if read_urls is None else list(read_urls),
                "read_your_writes": read_your_writes,
                "max_lag_s": max_lag_s,
            }
            if read_urls is not None:
                router = ReadRouter(
                    connections.engine,
                    read_urls,
                    read_your_writes=read_your_writes,
                    max_lag_s=max_lag_s,
                )
                router.check()
                connections.router = router

    @property
    def url(self) -> URL:
        return self._handle.url

    @property
    def identity(self) -> tuple[Any, ...]:
        where = self._where
        if where is None:  # once: the URL, a SQLite file's path however it is spelt
            url = self._handle.url
            path = url.database or ""
            if url.get_backend_name() == "sqlite" and not is_memory(url) and "file:" not in path:
                url = url.set(database=os.path.realpath(path))
            where = self._where = url.render_as_string()
        return (where, self.name, self._handle.created_at)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._handle.dialect.name

    @property
    def buffer_id(self) -> int:
        return self._handle.buffer_id

    @property
    def handle(self) -> BufferHandle:
        """The buffer's handle (connections, dialect, compiled statements): what the
        features (:mod:`expstore.lifecycle` and the packages over it) take, for tools and
        tests that call them."""
        return self._handle

    @property
    def index(self) -> KeyIndex:
        """The cached key indexes (see :mod:`expstore.storage.key_index`)."""
        return self._index

    def forget_caches(self) -> None:
        """Forget everything this handle cached of the buffer (key indexes, what draws over
        the key space found, group summaries, claims' floors): the next reads read it
        anew. Never needed for correctness (caches follow the buffer's changes by
        themselves); for tests and measurements that must start cold."""
        self._handle.forget_caches()

    @property
    def spaces(self) -> KeySpaces:
        """What draws over the key space keep from draw to draw (see
        :class:`~expstore.storage.key_space.KeySpaces`)."""
        return self._spaces

    def count_draws(self, keys: np.ndarray, limit: int) -> np.ndarray:
        return draw_counts.count_draws(self._handle, keys, limit)

    def spent_keys(self, limit: int, among: np.ndarray | None = None) -> np.ndarray:
        return draw_counts.spent_keys(self._handle, limit, among)

    @property
    def rate_limits(self) -> RateLimits:
        """The buffer's rate limit (see :mod:`expstore.limits.counters`)."""
        return self._limits

    def acquire_samples(self, n: int, since: float | None = None) -> tuple[int, bool]:
        limits = self._limits
        before = limits.waits
        counted = limits.acquire(n, since)
        return counted, limits.waits != before

    def refund_samples(self, n: int) -> None:
        self._limits.refund(n)

    def sampling_limited(self) -> bool:
        return self._limits.limited()

    @property
    def group_index(self) -> GroupIndex:
        """The cached group summaries (see :mod:`expstore.group_summaries`)."""
        return self._groups

    def groups(self, query_condition: QueryCondition, spec: GroupSpec) -> dict[str, Any]:
        return self._groups.get(query_condition, spec)

    def discard_rows(self, conn: Connection, keys: list[int]) -> None:
        """Count the rows of ``keys`` that can never be drawn (groups a group claim's index
        left out for good) as discarded by the rate limit, each once, in ``conn``'s
        transaction (see :func:`~expstore.limits.counters.discard_once`)."""
        discard_once(self._handle, conn, keys)

    @property
    def fetcher(self) -> FieldFetcher:
        """What reads fields of chosen rows (see :mod:`expstore.storage.fetch`)."""
        return self._fields

    # -- writing -------------------------------------------------------------------------
    @overload
    def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: Literal[False] = False
    ) -> int: ...

    @overload
    def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: Literal[True]
    ) -> StoreReport: ...

    def store_batch(
        self, rows: Sequence[DataRow], *, dedup: Dedup = None, report: bool = False
    ) -> int | StoreReport:
        """Store every row in one transaction, or none; returns how many were stored
        (``report=True``: a :class:`~expstore.storage.writer.StoreReport` of what the
        write stored, skipped and evicted).

        Rows are checked, encoded and written in chunks inside that transaction, so memory
        stays small; any failure (a value the codec or the model refuses, a duplicate id)
        rolls it all back. ``dedup``: see :mod:`expstore.dedup`.
        """
        done = self._kept(writer.store_batch(self._handle, rows, dedup))
        return done if report else done.stored

    @overload
    def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: Literal[False] = False
    ) -> int: ...

    @overload
    def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: Literal[True]
    ) -> StoreReport: ...

    def extend(
        self, columns: Mapping[str, Any], *, dedup: Dedup = None, report: bool = False
    ) -> int | StoreReport:
        """Store the rows a dict of columns holds in one transaction, or none (see
        :mod:`expstore.model.columnar`); returns how many were stored (``report=True``: a
        :class:`~expstore.storage.writer.StoreReport`)."""
        source = column_source(columns)
        try:
            done = self._kept(writer.store_rows(self._handle, source, dedup))
        except RowValidationError as exc:
            if isinstance(source, EncodedColumns):  # checked whole: no row's own error
                raise
            raise column_error(exc, source) from None
        return done if report else done.stored

    def _kept(self, written: writer.Written) -> StoreReport:
        """After a write committed: the retention it found, and its rows offered to the
        :attr:`row_cache` for the fields this process's fetches read, decoded from the rows
        as written (no read): a trainer that stores and samples in one process finds its
        new rows held, so a batch holding them costs no read. Returns its report."""
        self.capacity, self.eviction = written.capacity, written.policy
        cache, fresh = self.row_cache, written.fresh
        if fresh is None or not cache.enabled or written.report.evicted_at_once:
            return written.report
        paths = cache.paths_read()
        if not paths or len(paths) > _OFFERED_PATHS:
            return written.report
        try:
            written_columns = self._fields.written_columns(fresh, paths)
            if written_columns is not None:
                ids, values = written_columns
                fields = dict(zip(paths, values, strict=True))
                cache.offer(self.identity, (fresh.keys, ids), fields)
        except Exception as exc:  # noqa: BLE001 - the rows are stored: a read decodes them
            _log.warning("keeping rows just written in the row cache failed: %s", exc)
        return written.report

    def write_alone(self, kind: WriteKind, data: Any, dedup: Dedup) -> StoreReport:
        """``extend(data)`` or ``store_batch(data)`` (``kind``) with ``report=True``: one
        write of :meth:`write_together`'s on its own."""
        if kind == "extend":
            return self.extend(data, dedup=dedup, report=True)
        return self.store_batch(data, dedup=dedup, report=True)

    def write_together(
        self, writes: Sequence[tuple[WriteKind, Any, Dedup]]
    ) -> list[StoreReport | Exception]:
        """Several ``extend`` / ``store_batch`` calls (``(kind, columns or rows, dedup)``)
        committed together, a group commit (what :mod:`expstore.aio` makes of the writes
        its coroutines await at once): each written as its own call writes it, all in one
        transaction. If that transaction fails before its commit, nothing of it stays and
        each write runs again alone, so each gets what its own call would give: a report,
        or its error (a write refused before it reaches the database gets its error at once
        and is left out of the transaction). An error at the commit itself (its outcome
        unknown) is every write's, none run again. A rate limit holding writers back
        (``block_writers``) raises the limiter's WriteBlocked instead, nothing written, for
        the caller to make each write alone where it may wait."""
        results: list[StoreReport | Exception | None] = [None] * len(writes)
        prepared: list[tuple[int, Any, Dedup]] = []
        for i, (kind, data, dedup) in enumerate(writes):
            if i:
                time.sleep(0)  # the GIL to other threads (an event loop) between encodings
            try:
                source = column_source(data) if kind == "extend" else writer.prepare(data)
                prepared.append((i, source, dedup))
            except Exception as exc:  # this write's own error; the others go on
                results[i] = exc
        together: list[StoreReport] | None = None
        if prepared:
            try:
                self.capacity, self.eviction, together = writer.store_together(
                    self._handle, [(source, dedup) for _, source, dedup in prepared]
                )
            except writer.GroupRolledBack as rolled_back:
                if isinstance(rolled_back.__cause__, WriteBlocked):
                    # A rate limit's block_writers: each write waits its turn alone, where
                    # the caller chooses (expstore.aio: on a thread that may wait).
                    self.rate_limits.observe(True)
                    raise rolled_back.__cause__ from None
                together = None  # nothing stayed: each alone, for its own result
            except Exception as exc:  # at the commit: its outcome unknown, run nothing again
                for i, _, _ in prepared:
                    results[i] = exc
                return [r for r in results if r is not None]
        for n, (i, _, _) in enumerate(prepared):
            if together is not None:
                results[i] = together[n]
                continue
            try:
                results[i] = self.write_alone(*writes[i])
            except Exception as exc:
                results[i] = exc
        return [r for r in results if r is not None]

    def replace(self, rows: Sequence[DataRow]) -> None:
        """Store ``rows``, each replacing the stored row of its id if there is one, in one
        transaction (see :func:`expstore.storage.writer.replace_rows`)."""
        writer.replace_rows(self._handle, rows)

    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows and return how many went. ``None`` is refused: use clear()."""
        if query_condition is None:
            raise InvalidArgumentError(
                "delete() needs a condition; to delete every row call clear()"
            )
        handle = self._handle
        where = handle.matching(query_condition)
        with handle.errors("delete rows"), handle.write() as conn:
            registry.lock_buffer(handle, conn, buffers.c.id)  # see clear()
            count = registry.remove(handle, conn, where)
            if count:
                registry.bump_version(handle, conn)
        return count

    def clear(self) -> None:
        """Delete every row of this buffer (other buffers in the database are untouched)."""
        handle = self._handle
        with handle.errors("clear the buffer"), handle.write() as conn:
            # Writers of the buffer take turns on its row: holding it first, the DELETE
            # sees every committed insert, and the count loses none in progress.
            registry.lock_buffer(handle, conn, buffers.c.id)
            tombstones.record_clear(handle, conn)
            handle.dialect.before_delete(conn, 2**63 - 1, ())  # every row: the top too
            gone = conn.execute(
                delete(rows_table).where(rows_table.c.buffer_id == handle.buffer_id)
            ).rowcount
            arrays.drop_all(conn, handle.buffer_id)
            registry.count_removed(handle, conn, gone)
            registry.bump_version(handle, conn)
            kept = task_stats.state(conn, handle.buffer_id)
            if kept is not None:
                task_stats.drop_all(handle, conn, kept)

    def set_retention(
        self,
        capacity: int | None,
        eviction: Eviction | None = None,
        *,
        stale_after: int | None = None,
        tombstones: int | None = None,
    ) -> int:
        """Change the buffer's capacity (None: unlimited) and eviction policy (None: keep
        the current one) for every handle and process that writes to it; rows beyond the
        new capacity go now, in the same transaction. ``stale_after``: the ``"stale"``
        policy's k; ``tombstones``: how many tombstones of rows gone the buffer keeps
        (None: keep the setting). Returns how many rows went."""
        evicted, self.eviction = retention.set_retention(
            self._handle, capacity, eviction, stale_after, tombstones
        )
        self.capacity = capacity
        return evicted

    def retention(self) -> retention.RetentionSetting:
        return retention.read_retention(self._handle)

    def set_compression(
        self,
        compression: str | None,
        *,
        max_array_bytes: int | None = None,
        fields: Mapping[str, str | None] | None = None,
    ) -> None:
        """Set how arrays stored by digest are compressed from now on (per payload path
        over that: ``fields``) and the largest array a row may hold, for every writer (rows
        stored before stay as they are, readable); see :mod:`expstore.codec.compression`."""
        handle = self._handle
        arrays.check_setting(compression, max_array_bytes, fields)
        with handle.errors("change the compression"), handle.write() as conn:
            registry.lock_buffer(handle, conn, buffers.c.id)
            arrays.set_compression(handle, conn, compression, max_array_bytes, fields)

    def compression(self) -> arrays.ArraySetting:
        handle = self._handle
        with handle.errors("read the compression setting"), handle.read() as conn:
            return arrays.read_setting(conn, handle.buffer_id)

    def array_stats(self) -> tuple[int, int, int]:
        handle = self._handle
        with handle.errors("count arrays"), handle.read() as conn:
            return arrays.array_stats(conn, handle.buffer_id)

    def policy_version(self) -> int | None:
        return versions.current_version(self._handle)

    def set_policy_version(self, version: int, *, force: bool = False) -> int:
        return versions.set_version(self._handle, version, force=force)

    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> int:
        """Set the stored priority of rows by id; returns how many rows were updated.

        Ids no longer in the buffer (evicted since they were sampled, say) are skipped; for
        an id given twice the last priority wins. This process's cached key index is
        patched in place, and the update is logged so that other processes patch theirs
        too (see :mod:`expstore.priorities`).
        """
        done = priority_log.update_priorities(self._handle, ids, priorities)
        return self.priorities_updated(done)

    def priorities_updated(self, done: priority_log.Update | None) -> int:
        """Patch this handle's cached key index with a priority update committed through
        it (:meth:`update_priorities`, or a learner's training step); returns how many
        rows it set."""
        if done is None:
            return 0
        seq, keys, values = done
        self._index.patch_priorities(seq, keys, values)
        return len(keys)

    # -- reading -------------------------------------------------------------------------
    def get(self, row_id: str) -> DataRow | None:
        return self._reader.get(check_text("row_id", row_id))

    def count(self, query_condition: QueryCondition = None) -> int:
        return self._reader.count(query_condition)

    def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        offset: int = 0,
        order_by: str = "key",
    ) -> Iterator[DataRow]:
        """Stream matching rows in ``order_by`` order (a column that is never NULL, ``key``
        being insertion order; a leading ``-`` for descending), from the ``offset``-th.
        Chunks are read by keyset pagination in short reads of their own (the first one
        skips ``offset`` rows), so the loop body may write to the buffer."""
        return self._reader.query(query_condition, limit=limit, offset=offset, order_by=order_by)

    def rows_after(
        self, query_condition: QueryCondition, *, after: str | None, limit: int, order_by: str
    ) -> RowsPage:
        """One page of matching rows by keyset (see :class:`~expstore.storage.reader.RowsPage`)."""
        return self._reader.rows_after(query_condition, after=after, limit=limit, order_by=order_by)

    def keys_after(
        self, query_condition: QueryCondition, *, after: str | None, limit: int, order_by: str
    ) -> tuple[list[int], str | None]:
        """:meth:`rows_after`'s keys and next cursor, without reading the rows."""
        return self._reader.keys_after(query_condition, after=after, limit=limit, order_by=order_by)

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        return self._reader.task_rows([check_text("task_id", task_id)])[task_id]

    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        if isinstance(task_ids, str):
            raise UnsupportedTypeError(
                "get_batch_by_task_ids() needs a list of task ids, got one string"
            )
        return self._reader.task_rows([check_text("task id", t) for t in task_ids])

    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        return self._reader.task_ids(query_condition)

    # -- sampling ------------------------------------------------------------------------
    def key_indexes(
        self, requests: Sequence[tuple[QueryCondition, Sequence[str]]]
    ) -> list[dict[str, np.ndarray]]:
        """The matching rows' keys (``"key"``, int64, ascending) and columns as arrays, for
        each ``(condition, columns)``, all from one read with one freshness check.

        A column is ``priority``, a column of the row (``step``, ``exp_meta.agent_id``...):
        floats and nullable ints (``policy_version``) as float64 with NaN for NULL, other
        ints as int64, ``done`` bool, strings as object arrays; or a path into the payload
        (``exp_data.state.difficulty``): an object array of the values there as JSON
        decodes them, None where the value is null or the path reaches nothing. The arrays
        are read-only and cached until the buffer changes (see
        :mod:`expstore.storage.key_index`)."""
        return self._index.get(requests)

    def key_space(
        self,
        query_condition: QueryCondition,
        use: Callable[[KeySpace], _T],
        *,
        max_staleness: int | None = None,
        consume_after: int | None = None,
        snapshot: bool = False,
    ) -> _T:
        """``use(space)`` over the buffer's key space read now, on one connection (see
        :mod:`expstore.storage.key_space`); ``snapshot``: all on one snapshot."""
        return self._spaces.draw(
            query_condition,
            use,
            max_staleness=max_staleness,
            consume_after=consume_after,
            snapshot=snapshot,
        )

    def create_index(self, path: str) -> bool:
        """Index the rows on ``path`` (a payload path or a column) so conditions on it are
        index ranges; whether it was made now (see :mod:`expstore.db.path_indexes`)."""
        return path_indexes.create_path_index(self._handle, path)

    def indexes(self) -> dict[str, str]:
        """The database's path indexes, ``{path: index name}``."""
        return path_indexes.list_path_indexes(self._handle)

    def drop_index(self, path: str) -> bool:
        """Drop the index :meth:`create_index` made on ``path``; whether there was one."""
        return path_indexes.drop_path_index(self._handle, path)

    def track_changes(self, path: str) -> bool:
        """Keep, for every row, whether the value at ``path`` equals the previous and the
        next step's, so ``changed(path)`` reads flags instead of probing each row's
        neighbour; the rows stored are done now, in one transaction. Whether the path was
        not tracked already (see :mod:`expstore.tracking.changes`)."""
        return self._set_tracking(path, changes.track, f"track changes of {path}")

    def untrack_changes(self, path: str) -> bool:
        """Stop tracking ``path`` (its flags go); whether it was tracked."""
        return self._set_tracking(path, changes.untrack, f"stop tracking changes of {path}")

    def _set_tracking(
        self, path: str, change: Callable[[BufferHandle, Connection, str], bool], what: str
    ) -> bool:
        """``change`` (track or untrack) ``path`` holding the buffer's row; readers'
        statements, compiled with the tracked paths, are made anew when it did."""
        handle = self._handle
        changes.check_path(path)
        with handle.errors(what), handle.write() as conn:
            registry.lock_buffer(handle, conn, buffers.c.id)
            done = change(handle, conn, path)
            if done:
                registry.bump_version(handle, conn)
            found = read_tracked(conn, handle.buffer_id)
        handle.note_tracked(found)
        return done

    def tracked_changes(self) -> list[str]:
        """The paths whose changes the buffer tracks."""
        return sorted(self._handle.tracked_paths())

    def create_summary(
        self,
        *,
        step: int = task_stats.BUILD_STEP,
        progress: Callable[[int], object] | None = None,
    ) -> bool:
        """Keep per-task summaries (see :mod:`expstore.stats.task_stats`), building them
        for the rows present ``step`` rows per transaction (``progress`` is told how many
        rows each step summarised); whether there was anything to build (False: the
        buffer kept them, built, already)."""
        before = self.summary_state()
        summary_build.create(self._handle, step, progress)
        return before is None or not before.built

    def drop_summary(self) -> bool:
        """Stop keeping per-task summaries; whether the buffer kept any."""
        return summary_build.drop_summary(self._handle)

    def summary_state(self) -> task_stats.SummaryState | None:
        """Whether the buffer keeps task summaries and how far they are built."""
        return summary_build.state_now(self._handle)

    def summary_tasks(self) -> int:
        """How many tasks the buffer's task summaries hold."""
        return summary_build.count_now(self._handle)

    def summary(self, query_condition: QueryCondition, success_above: float) -> dict[str, Any]:
        return summarise(self._handle, query_condition, success_above)

    def fetch_keys(self, keys: Sequence[int] | np.ndarray) -> list[DataRow]:
        """The rows with these keys in the given order (repeats allowed; vanished keys skipped)."""
        return self._reader.fetch_keys(keys)

    def fetch(
        self,
        keys: Sequence[int] | np.ndarray,
        paths: Sequence[str] | None = None,
        *,
        writable: bool = True,
    ) -> Fetched:
        """The rows with these keys: whole (``paths=None``) or the values at ``paths``,
        through the :attr:`row_cache` (rows it holds are not read again; see
        :mod:`expstore.storage.cache`)."""
        cache = self.row_cache
        if not cache.enabled:
            return super().fetch(keys, paths, writable=writable)
        identity = self.identity
        if paths is None:
            rows, hits = cache.fetch_rows(identity, keys, self._reader)
            fetched = Fetched([row.id for row in rows], rows=rows)
        else:
            ids, columns, hits = cache.fetch_columns(
                identity, keys, paths, writable, self._read_columns
            )
            fetched = Fetched(ids, columns=columns)
        if hits:  # a call by id soon after (a priority update) finds these rows by key
            self._handle.remember_pairs(hits)
        return fetched

    def fetch_read(
        self, keys: Sequence[int] | np.ndarray, read: Sequence[Sequence[Any]]
    ) -> Fetched:
        """:meth:`fetch` of whole rows, where ``read`` holds them as another statement read
        them (:data:`~expstore.storage.reader.ROW_COLUMNS`: a claim's own, which reads the
        rows it takes): no read of its own, unless some refer to stored arrays."""
        source = ReadAlready(self._reader, read)
        cache = self.row_cache
        if cache.enabled:
            rows_, hits = cache.fetch_rows(self.identity, keys, source)
            if hits:
                self._handle.remember_pairs(hits)
        else:
            wanted = key_list(keys)
            raw, arrays = source.read_raw(list(dict.fromkeys(wanted)))
            decoded = dict(zip((r[0] for r in raw), source.decode_raw(raw, arrays), strict=True))
            rows_ = [decoded[k] for k in wanted if k in decoded]
        return Fetched([row.id for row in rows_], rows=rows_)

    def _read_columns(
        self, keys: list[int], paths: Sequence[str], writable: bool
    ) -> tuple[list[str], list[Values]]:
        return self.fetch_columns(keys, paths, writable=writable)

    def set_cache_bytes(self, budget_bytes: int) -> None:
        """Resize this handle's row cache (0 turns it off and empties it)."""
        self.row_cache.resize(budget_bytes)

    def fetch_columns(
        self, keys: Sequence[int] | np.ndarray, paths: Sequence[str], *, writable: bool = True
    ) -> tuple[list[str], list[Values]]:
        """The ids of the rows found (in the order given, repeats allowed, vanished keys
        skipped) and each path's values over them: a list (MISSING where a row has nothing
        there), or for a tensor field (one dtype and shape in every row) one array whose
        first axis runs over the rows. Only the columns the paths need are read, and of the
        JSON document only the parts they reach (see :mod:`expstore.storage.fetch`)."""
        return self._fields.fetch_columns(keys, paths, writable=writable)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Close every pooled connection. The storage can't be used afterwards."""
        self._handle.connections.close()
        self._handle.forget_caches()

    def __reduce__(self) -> Any:
        # Lets a storage travel to spawned processes (multiprocessing, DataLoader workers)
        # as its URL and name, reconnecting there. Rows are never pickled.
        if self._handle.connections.memory:
            raise StorageError(
                "an in-memory SQLite buffer (sqlite://) cannot be shared with another "
                "process; use a file (sqlite:///path.db) or Postgres"
            )
        read = dict(self._read)
        if read["read_urls"] is not None:
            read["read_urls"] = [
                normalise_url(u).render_as_string(hide_password=False) for u in read["read_urls"]
            ]
        url = self.url.render_as_string(hide_password=False)
        budget = None if self.row_cache is None else self.row_cache.budget
        return (_reopen, (url, self.name, read, self._handle.tuning, budget))

    def __repr__(self) -> str:
        url = self._handle.shown_url()
        return f"SqlStorage({url!r}, name={self.name!r}, capacity={self.capacity!r})"


def _reopen(
    url: str,
    name: str,
    read: dict[str, Any] | None = None,
    tuning: Tuning | None = None,
    cache_bytes: int | None = None,
) -> SqlStorage:
    """The storage in another process: the buffer's retention comes from the database, the
    handle's tuning and its cache's budget (not its rows) along with it."""
    return SqlStorage(url, name=name, tuning=tuning, cache_bytes=cache_bytes, **(read or {}))


def describe_database(
    url: str | URL, *, count_rows: bool = True
) -> tuple[str | None, list[BufferInfo] | None]:
    """What the database at ``url`` holds, creating nothing: its schema revision (None: no
    expstore tables) and its buffers (:func:`~expstore.lifecycle.registry.list_buffers`;
    None unless the revision is this expstore's). What ``expstore buffers`` lists and
    every reading command checks first."""
    engine = create_sql_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            revision = migrate.current_revision(conn)
            if revision is None or revision != migrate.head_revision():
                return revision, None
            return revision, registry.list_buffers(conn, count_rows=count_rows)
    finally:
        engine.dispose()
