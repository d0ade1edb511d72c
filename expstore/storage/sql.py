"""SqlStorage: rows in SQLite (the embedded default) or PostgreSQL, through SQLAlchemy Core.

Writes run in one transaction each: validation and encoding happen before it starts, the
insert and any eviction inside it, so a batch is stored whole or not at all. On SQLite, write
transactions begin with ``BEGIN IMMEDIATE`` (after a busy timeout), so concurrent writers
queue for the lock instead of failing with "database is locked"; the journal is WAL, so
readers never block writers. On Postgres, inserts go through ``COPY`` and writers of a
buffer with a capacity serialise on that buffer's row, which keeps the capacity exact.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import (
    BigInteger,
    Boolean,
    Connection,
    Double,
    Engine,
    Integer,
    Row,
    Select,
    Text,
    bindparam,
    column,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ColumnElement

from .. import migrate
from .._optional import require
from ..codec import PartDecoder, PayloadWriter, decode_payload
from ..errors import CodecError, StorageError
from ..layout import META_COLUMNS, PAYLOAD_FIELDS, SCALAR_COLUMNS
from ..models import DataRow, Experience, ExpMeta, trusted
from .base import QueryCondition, Storage
from .compiled import CompiledSelect
from .eviction import EVICTION_POLICIES, OLDEST_FIRST_POLICIES, evict
from .fields import SQLITE_ARROW, FieldPlan, Values, field_plans
from .schema import (
    PRIORITY_LOG_KEEP,
    buffers,
    newest_first,
    oldest_first,
    priority_log,
    rows,
)

__all__ = ["SqlStorage", "create_sql_engine"]

_T = TypeVar("_T")

_EXPERIENCE_FIELDS = tuple(Experience.model_fields)
#: Rows fetched per round trip when streaming a query.
CHUNK = 1000
#: Columns that key_index() and query(order_by=...) accept.
ORDERABLE = ("key", "step", "execute_time", "task_id", "agent_id", "task_name")
INDEXABLE = (
    "id",
    *META_COLUMNS,
    *SCALAR_COLUMNS,
    "priority",
)
_WRITE_COLUMNS = ("buffer_id", "id", *META_COLUMNS, *SCALAR_COLUMNS, "data", "tensors")
# SqlStorage._encode_chunk spells these out for speed.
assert PAYLOAD_FIELDS == ("state", "actions", "messages", "next_state", "ext_info")
assert META_COLUMNS == ("task_id", "task_name", "agent_id", "step", "execute_time", "pre_agent")
assert SCALAR_COLUMNS == ("reward_t", "adv_t", "v_t", "done")
_ROW_COLUMNS = [c for c in rows.c if c.name not in ("buffer_id", "priority")]
_ROW_NAMES = [c.name for c in _ROW_COLUMNS]
_AT_ID, _AT_DATA, _AT_TENSORS = (_ROW_NAMES.index(n) for n in ("id", "data", "tensors"))
_AT_META = tuple((c, _ROW_NAMES.index(c)) for c in META_COLUMNS)
_AT_SCALARS = tuple((c, _ROW_NAMES.index(c)) for c in SCALAR_COLUMNS)
_COLUMN_LIST = ", ".join(f'"{c}"' for c in _WRITE_COLUMNS)
# A constant statement over our own column names; every value is a bound parameter.
_SQLITE_INSERT = (
    f"INSERT INTO {rows.name} ({_COLUMN_LIST}) VALUES ({', '.join('?' * len(_WRITE_COLUMNS))})"
)
#: How many key_index() results (condition x columns) a storage keeps.
KEY_INDEX_CACHE = 8
#: Rows encoded and sent per round trip inside one store_batch transaction.
WRITE_CHUNK = 1000
_SQLITE_BUSY_MS = 60_000


def _normalise_url(url: str | URL) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StorageError(
            f"expected a database URL such as sqlite:///path.db, sqlite:// or "
            f"postgresql+psycopg://user@host:5432/db, got {url!r}"
        ) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _is_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_sql_engine(url: str | URL) -> Engine:
    """An Engine set up for expstore: SQLite in WAL mode with a busy timeout and explicit
    BEGIN (``BEGIN IMMEDIATE`` under ``execution_options(expstore_begin="IMMEDIATE")``);
    Postgres through psycopg 3."""
    parsed = _normalise_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.get_driver_name() == "psycopg":
            require("psycopg", "a PostgreSQL URL")
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
    elif backend == "sqlite":
        kwargs = {"connect_args": {"check_same_thread": False, "timeout": _SQLITE_BUSY_MS / 1000}}
        if _is_memory(parsed):
            kwargs["poolclass"] = StaticPool
    else:
        raise StorageError(
            f"expstore stores rows in SQLite or PostgreSQL, got a {backend!r} URL "
            f"({parsed.render_as_string(hide_password=True)}); use sqlite:///path.db or "
            "postgresql+psycopg://user@host:5432/db"
        )
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ArgumentError, ImportError) as exc:
        raise StorageError(
            f"cannot open {parsed.render_as_string(hide_password=True)}: {exc}"
        ) from exc
    if backend == "sqlite":
        memory = _is_memory(parsed)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Let SQLAlchemy's "begin" event (below) issue BEGIN itself.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_MS}")
            if not memory:
                _use_wal(cursor)
                cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("expstore_begin", "")
            conn.exec_driver_sql(f"BEGIN {mode}".strip())

    return engine


def _use_wal(cursor: Any) -> None:
    """Put a SQLite file in WAL mode (it stays so). Switching needs a moment alone with the
    file, which processes opening a new file together may not get at once: retry then."""
    deadline = time.monotonic() + _SQLITE_BUSY_MS / 1000
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class SqlStorage(Storage):
    """One named buffer in a SQL database.

    ``SqlStorage(url, name="default", capacity=None, eviction=None, upgrade=False)``

    - ``url``: ``sqlite:///path.db``, ``sqlite://`` (in memory, private to this object) or
      ``postgresql+psycopg://user@host:5432/db``.
    - ``name``: one database holds many buffers, isolated from each other.
    - ``capacity``: at most this many rows remain after every write; ``eviction`` chooses
      which go (``fifo``, the default, ``max_reward``, ``task_fifo``; see
      :mod:`expstore.storage.eviction`). Both are kept with the buffer in the database, so
      every handle and process that writes evicts alike: the first handle to give them
      sets them, a handle that gives neither uses them, and one that asks for others
      raises ValueError. :meth:`set_retention` changes them for everyone.
    - ``upgrade``: upgrade an older schema instead of raising SchemaVersionError.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        name: str = "default",
        capacity: int | None = None,
        eviction: str | None = None,
        upgrade: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name or len(name) > 255:
            raise ValueError(f"name must be a non-empty string of at most 255 chars, got {name!r}")
        _check_retention(capacity, eviction)
        self.url = _normalise_url(url)
        self.name = name
        # What this handle asked for; the buffer's own retention is read when it opens.
        self.capacity = capacity
        self.eviction = eviction or "fifo"
        self._asked = (capacity, eviction)
        self._upgrade = upgrade
        # key_index() results by (condition, columns), least recently used first.
        self._cache: OrderedDict[
            tuple[str, tuple[str, ...]], tuple[tuple[int, int, int, int], dict[str, np.ndarray]]
        ] = OrderedDict()
        # fetch_fields() plans by paths.
        self._plans: dict[tuple[tuple[str, ...], bool], tuple[FieldPlan, FieldPlan | None]] = {}
        # Statements compiled once (see expstore.storage.compiled), by their columns.
        self._statements: dict[tuple[Any, ...], CompiledSelect] = {}
        self._connect()

    # -- connections ---------------------------------------------------------------------
    def _connect(self) -> None:
        self._pid = os.getpid()
        # An in-memory database is one connection shared by every thread: take turns on it.
        self._memory = _is_memory(self.url)
        self._memory_lock: Any = threading.RLock() if self._memory else nullcontext()
        self._engine = create_sql_engine(self.url)
        self._write_engine = self._engine.execution_options(expstore_begin="IMMEDIATE")
        self.dialect = self._engine.dialect.name
        with self._errors("open"):
            migrate.ensure_schema(self._engine, self._write_engine, upgrade=self._upgrade)
            self.buffer_id = self._buffer_id()
            self._settle_retention(*self._asked)

    def _engines(self) -> tuple[Engine, Engine]:
        if os.getpid() != self._pid:  # forked (e.g. a DataLoader worker): fresh connections
            if self._memory:
                raise StorageError(
                    "an in-memory SQLite buffer (sqlite://) lives in the process that made it "
                    "and cannot be used from a forked process (a DataLoader worker, say); use "
                    "a file (sqlite:///path.db) or Postgres"
                )
            self._pid = os.getpid()
            self._engine.dispose(close=False)
            self._write_engine = self._engine.execution_options(expstore_begin="IMMEDIATE")
            self._cache.clear()
        return self._engine, self._write_engine

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._memory_lock, self._engines()[0].connect() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._memory_lock, self._engines()[1].begin() as conn:
            yield conn

    def _errors(self, action: str) -> Any:
        return _TranslateErrors(self, action)

    def _buffer_id(self) -> int:
        with self._read() as conn:
            found = conn.execute(select(buffers.c.id).where(buffers.c.name == self.name)).scalar()
        if found is not None:
            return int(found)
        with self._write() as conn:
            found = conn.execute(select(buffers.c.id).where(buffers.c.name == self.name)).scalar()
            if found is None:
                if self.dialect == "postgresql":
                    from sqlalchemy.dialects.postgresql import insert as pg_insert

                    conn.execute(
                        pg_insert(buffers)
                        .values(name=self.name, created_at=time.time())
                        .on_conflict_do_nothing()
                    )
                else:
                    conn.execute(insert(buffers).values(name=self.name, created_at=time.time()))
                found = conn.execute(
                    select(buffers.c.id).where(buffers.c.name == self.name)
                ).scalar_one()
        return int(found)

    def _settle_retention(self, capacity: int | None, eviction: str | None) -> None:
        """Take the buffer's retention, setting it first if it has none and this handle
        asks for one; ValueError if the handle asks for another than the buffer keeps."""
        where = buffers.c.id == self.buffer_id
        kept = select(buffers.c.capacity, buffers.c.eviction).where(where)
        with self._read() as conn:
            stored = conn.execute(kept).one()
        if (capacity, eviction) != (None, None) and tuple(stored) == (None, None):
            with self._write() as conn:  # only if nobody set it meanwhile
                conn.execute(
                    update(buffers)
                    .where(where, buffers.c.capacity.is_(None), buffers.c.eviction.is_(None))
                    .values(capacity=capacity, eviction=eviction or "fifo")
                )
                stored = conn.execute(kept).one()
        stored_capacity, stored_eviction = stored[0], stored[1] or "fifo"
        if (capacity is not None and capacity != stored_capacity) or (
            eviction is not None and eviction != stored_eviction
        ):
            asked = ", ".join(
                f"{k}={v!r}" for k, v in (("capacity", capacity), ("eviction", eviction)) if v
            )
            raise ValueError(
                f"buffer {self.name!r} keeps capacity={stored_capacity!r} with "
                f"eviction={stored_eviction!r}, which every writer uses; this handle asked for "
                f"{asked}. Open it without capacity=/eviction= to use the buffer's, or change "
                "it for every writer with buffer.set_retention(capacity, eviction)"
            )
        self.capacity = None if stored_capacity is None else int(stored_capacity)
        self.eviction = stored_eviction

    def set_retention(self, capacity: int | None, eviction: str | None = None) -> int:
        """Change the buffer's capacity (None: unlimited) and eviction policy (None: keep
        the current one) for every handle and process that writes to it; rows beyond the
        new capacity go now, in the same transaction. Returns how many rows went."""
        _check_retention(capacity, eviction)
        where = buffers.c.id == self.buffer_id
        with self._errors("change the retention"), self._write() as conn:
            (current,) = self._lock_buffer(conn, buffers.c.eviction)
            policy = eviction or current or "fifo"
            conn.execute(update(buffers).where(where).values(capacity=capacity, eviction=policy))
            evicted = 0
            if capacity is not None:
                evicted = evict(conn, self.buffer_id, capacity, policy)
                if evicted and policy not in OLDEST_FIRST_POLICIES:
                    self._bump_version(conn)
        self.capacity, self.eviction = capacity, policy
        return int(evicted)

    def close(self) -> None:
        """Close every pooled connection. The storage can't be used afterwards."""
        self._engine.dispose()
        self._cache.clear()

    def __reduce__(self) -> Any:
        # Lets a storage travel to spawned processes (multiprocessing, DataLoader workers)
        # as its URL and options, reconnecting there. Rows are never pickled.
        if _is_memory(self.url):
            raise StorageError(
                "an in-memory SQLite buffer (sqlite://) cannot be shared with another "
                "process; use a file (sqlite:///path.db) or Postgres"
            )
        return (
            _reopen,
            (
                self.url.render_as_string(hide_password=False),
                self.name,
            ),
        )

    def __repr__(self) -> str:
        url = self.url.render_as_string(hide_password=True)
        return f"SqlStorage({url!r}, name={self.name!r}, capacity={self.capacity!r})"

    # -- conditions ----------------------------------------------------------------------
    def _where(self, query_condition: QueryCondition) -> list[ColumnElement[bool]]:
        clauses: list[ColumnElement[bool]] = [rows.c.buffer_id == self.buffer_id]
        if query_condition is not None:
            from ..query import to_sql

            compiled = to_sql(query_condition, rows, self.dialect)
            if compiled is not None:
                clauses.append(compiled)
        return clauses

    # -- writing -------------------------------------------------------------------------
    def _prepare(self, batch: Sequence[DataRow]) -> list[DataRow]:
        """Check the batch's shape and ids before anything is written."""
        if batch is None or isinstance(batch, (DataRow, dict, str, bytes)):
            raise ValueError(
                f"store_batch() needs a list of DataRow, got {type(batch).__name__}; "
                "use store() for one row"
            )
        items = list(batch)
        if items and all(type(row) is DataRow for row in items):
            # The common case in one pass; anything else is explained below.
            if len({row.id for row in items}) == len(items):
                return items
        prepared: list[DataRow] = []
        seen: set[str] = set()
        for position, row in enumerate(items):
            if row is None:
                raise ValueError(
                    f"store_batch() got None at position {position}; every item must be a "
                    "DataRow. Nothing was stored"
                )
            if isinstance(row, dict):
                row = DataRow.model_validate(row)
            elif not isinstance(row, DataRow):
                raise TypeError(
                    f"store_batch() expected DataRow items, got {type(row).__name__} at "
                    f"position {position}. Nothing was stored"
                )
            if row.id in seen:
                raise ValueError(
                    f"row id {row.id!r} appears twice in one batch; ids must be unique. "
                    "Nothing was stored"
                )
            seen.add(row.id)
            prepared.append(row)
        if not prepared:
            raise ValueError("store_batch() got an empty batch; give at least one DataRow")
        return prepared

    def store_batch(self, rows_: Sequence[DataRow]) -> None:
        """Store every row in one transaction, or none.

        Rows are encoded and written in chunks inside that transaction, so memory stays
        small; any failure (a value the codec refuses, a duplicate id) rolls it all back.
        """
        batch = self._prepare(rows_)
        with self._errors("store rows"):
            try:
                with self._write() as conn:
                    # The buffer's retention as it is now (another process may have changed
                    # it). Writers of a buffer take turns on its row, so keys are handed out
                    # in commit order (readers' cached key indexes only ever need the keys
                    # above the largest they saw) and a capacity stays exact.
                    capacity, policy = self._lock_buffer(
                        conn, buffers.c.capacity, buffers.c.eviction
                    )
                    self.capacity, self.eviction = capacity, policy or "fifo"
                    self._insert(conn, self._encoded_chunks(batch))
                    if capacity is not None:
                        evicted = evict(conn, self.buffer_id, capacity, self.eviction)
                        if evicted and self.eviction not in OLDEST_FIRST_POLICIES:
                            self._bump_version(conn)  # readers see FIFO by the min key
            except UnicodeEncodeError as exc:  # a string the row's validation could not see
                text = exc.object[exc.start : exc.end]
                raise CodecError(
                    f"a string in the batch holds {text!r}, which is not Unicode text "
                    f"({exc.reason}) and no database can store; decode the text with "
                    "errors='replace' or store its bytes. Nothing was stored"
                ) from exc
            except IntegrityError as exc:
                duplicate = self._duplicate_error([row.id for row in batch])
                if duplicate is None:
                    raise  # not a duplicate id: reported as the database said it
                raise duplicate from exc

    def _encode_chunk(self, chunk: Sequence[DataRow]) -> list[tuple[Any, ...]]:
        """Each row's values in _WRITE_COLUMNS order, the document as JSON text.

        The hot loop of a write: one pass, fields read from the models' ``__dict__``.
        """
        encode = PayloadWriter().encode
        buffer_id = self.buffer_id
        out: list[tuple[Any, ...]] = []
        append = out.append
        for row in chunk:
            m, d = row.exp_meta.__dict__, row.exp_data.__dict__
            payload = {  # PAYLOAD_FIELDS, in order (checked where _WRITE_COLUMNS is built)
                "state": d["state"],
                "actions": d["actions"],
                "messages": d["messages"],
                "next_state": d["next_state"],
                "ext_info": d["ext_info"],
            }
            try:
                doc, blob = encode(payload)
            except CodecError as exc:
                raise CodecError(f"row {row.id}: {exc}. Nothing was stored") from exc
            append(
                (
                    buffer_id,
                    row.id,
                    m["task_id"],
                    m["task_name"],
                    m["agent_id"],
                    m["step"],
                    m["execute_time"],
                    m["pre_agent"],
                    d["reward_t"],
                    d["adv_t"],
                    d["v_t"],
                    bool(d["done"]),
                    doc,
                    blob,
                )
            )
        return out

    def _encoded_chunks(self, batch: list[DataRow]) -> Iterator[list[tuple[Any, ...]]]:
        """Encoded chunks of ``batch``. On Postgres the next one is encoded in a thread
        while the current one is sent (psycopg releases the GIL while it waits), with at
        most two chunks in flight; on SQLite one after the other."""
        chunks = [batch[i : i + WRITE_CHUNK] for i in range(0, len(batch), WRITE_CHUNK)]
        if len(chunks) == 1 or self.dialect != "postgresql":
            # sqlite3 wants the GIL back between rows, so an encoding thread only makes it
            # wait (measured: a few percent slower than encoding in turn).
            for chunk in chunks:
                yield self._encode_chunk(chunk)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="expstore-encode") as pool:
            pending = deque(pool.submit(self._encode_chunk, c) for c in chunks[:2])
            queued = len(pending)
            while pending:
                params = pending.popleft().result()
                if queued < len(chunks):
                    pending.append(pool.submit(self._encode_chunk, chunks[queued]))
                    queued += 1
                yield params

    def _insert(self, conn: Connection, chunks: Iterator[list[tuple[Any, ...]]]) -> None:
        """Insert encoded rows, chunk by chunk as the encoder hands them over."""
        if self.dialect != "postgresql":
            # The DB-API's executemany directly: the values are already in column order.
            for params in chunks:
                conn.exec_driver_sql(_SQLITE_INSERT, params)
            return
        import psycopg
        from psycopg.copy import QueuedLibpqWriter
        from psycopg.types.json import Jsonb

        raw = conn.connection.driver_connection
        assert raw is not None
        statement = f"COPY {rows.name} ({_COLUMN_LIST}) FROM STDIN (FORMAT BINARY)"
        data_at = _WRITE_COLUMNS.index("data")
        try:
            # The queued writer sends to the server from a thread of its own, so encoding
            # the next rows overlaps the network and the server's work.
            with (
                raw.cursor() as cursor,
                cursor.copy(statement, writer=QueuedLibpqWriter(cursor)) as copy,
            ):
                copy.set_types(_PG_COPY_TYPES)
                for params in chunks:  # one COPY for the whole batch: no stall per chunk
                    for p in params:
                        document = Jsonb(p[data_at], dumps=_as_is)
                        copy.write_row(p[:data_at] + (document,) + p[data_at + 1 :])
        except psycopg.errors.IntegrityError as exc:  # surface as SQLAlchemy's errors do
            raise IntegrityError(statement, None, exc) from exc
        except psycopg.DataError as exc:
            raise DataError(statement, None, exc) from exc
        except psycopg.Error as exc:
            raise OperationalError(statement, None, exc) from exc

    def _duplicate_error(self, ids: list[str]) -> StorageError | None:
        """The error for a batch whose ids are already stored, or None if none is."""
        with self._read() as conn:
            present = list(self._ids_to_keys(conn, ids))
        if not present:
            return None
        shown = ", ".join(repr(i) for i in present[:5])
        return StorageError(
            f"row ids must be unique in buffer {self.name!r}, but {shown} "
            f"{'is' if len(present) == 1 else 'are'} already stored. Nothing was stored; "
            "give the new rows fresh ids (the default id is a new uuid4)"
        )

    def _ids_to_keys(self, conn: Connection, ids: Sequence[str]) -> dict[str, int]:
        """The keys of the rows of this buffer with these ids (unknown ids left out)."""
        found: dict[str, int] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 5000):
            stmt = self._ids_statement(unique[start : start + 5000])
            found.update((row_id, key) for row_id, key in conn.execute(stmt))
        return found

    def _ids_statement(self, ids: list[str]) -> Select[Any]:
        """``SELECT id, key`` of this buffer's rows with these ids."""
        if self.dialect != "postgresql":
            return select(rows.c.id, rows.c.key).where(
                rows.c.buffer_id == self.buffer_id, rows.c.id.in_(ids)
            )
        # Each id's key by a subquery on the (buffer_id, id) unique index, which Postgres
        # uses whatever its statistics say. With "id IN (...)", or a join, and no
        # statistics yet (a freshly loaded table, autovacuum off) it may scan the buffer.
        wanted = (
            func.unnest(bindparam("ids", ids, type_=ARRAY(Text)))
            .table_valued("id")
            .render_derived(name="wanted")
        )
        key = (
            select(rows.c.key)
            .where(rows.c.buffer_id == self.buffer_id, rows.c.id == wanted.c.id)
            .scalar_subquery()
        )
        found = select(wanted.c.id, key.label("key")).subquery()
        return select(found.c.id, found.c.key).where(found.c.key.is_not(None))

    def _lock_buffer(self, conn: Connection, *columns: Any) -> tuple[Any, ...]:
        """``columns`` of this buffer's row, locked until the transaction ends: every change
        to a buffer takes its row first, so changes take turns in one order (on Postgres by
        ``FOR UPDATE``; SQLite's BEGIN IMMEDIATE already lets one writer in at a time)."""
        stmt = select(*columns).where(buffers.c.id == self.buffer_id)
        if self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return tuple(conn.execute(stmt).one())

    def _bump_version(self, conn: Connection, counter: Any = buffers.c.version) -> int:
        """Mark a change other than an insert (``counter``: ``version``, or
        ``priority_version`` for a priority update); returns its new value (the row is
        locked until the transaction ends, so it is exact)."""
        conn.execute(
            update(buffers).where(buffers.c.id == self.buffer_id).values({counter: counter + 1})
        )
        value = select(counter).where(buffers.c.id == self.buffer_id)
        return int(conn.execute(value).scalar_one())

    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows and return how many went. ``None`` is refused: use clear()."""
        if query_condition is None:
            raise ValueError("delete() needs a condition; to delete every row call clear()")
        where = self._where(query_condition)
        with self._errors("delete rows"), self._write() as conn:
            count = conn.execute(delete(rows).where(*where)).rowcount
            if count:
                self._bump_version(conn)
        return int(count)

    def clear(self) -> None:
        """Delete every row of this buffer (other buffers in the database are untouched)."""
        with self._errors("clear the buffer"), self._write() as conn:
            conn.execute(delete(rows).where(rows.c.buffer_id == self.buffer_id))
            self._bump_version(conn)

    def update_priorities(self, ids: Sequence[str], priorities: Sequence[float]) -> int:
        """Set the stored priority of rows by id; returns how many rows were updated.

        Ids no longer in the buffer (evicted since they were sampled, say) are skipped; for
        an id given twice the last priority wins. This process's cached key index is
        patched in place, and the update is logged (``expstore_priority_log``, the last
        PRIORITY_LOG_KEEP updates) so that other processes patch theirs too: a training loop
        that samples and updates priorities every step, with DataLoader workers sampling
        beside it, stays cheap at any size.
        """
        if isinstance(ids, str):
            raise TypeError("update_priorities() needs a list of ids, got one string")
        ids = list(ids)
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(ids) != len(values):
            raise ValueError(
                f"update_priorities() needs one priority per id, got {len(ids)} ids and "
                f"{len(values)} priorities; nothing was updated"
            )
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError("priorities must be finite numbers >= 0; nothing was updated")
        if not ids:
            return 0
        stmt = (
            update(rows)
            .where(rows.c.key == bindparam("row_key"))
            .values(priority=bindparam("new_priority"))
        )
        with self._errors("update priorities"), self._write() as conn:
            # The buffer's row first, as store_batch takes it: locking rows and then the
            # buffer would deadlock with a writer evicting those rows.
            self._lock_buffer(conn, buffers.c.id)
            key_of = self._ids_to_keys(conn, ids)
            # By key, the last priority given for it winning (as the UPDATEs in order would).
            latest = {key_of[i]: float(p) for i, p in zip(ids, values, strict=True) if i in key_of}
            if not latest:
                return 0
            conn.execute(stmt, [{"row_key": k, "new_priority": p} for k, p in latest.items()])
            seq = self._bump_version(conn, buffers.c.priority_version)
            # Logged for other processes' cached key indexes (see _index); old entries go.
            conn.execute(
                insert(priority_log),
                [
                    {"buffer_id": self.buffer_id, "seq": seq, "key": k, "priority": p}
                    for k, p in latest.items()
                ],
            )
            conn.execute(
                delete(priority_log).where(
                    priority_log.c.buffer_id == self.buffer_id,
                    priority_log.c.seq <= seq - PRIORITY_LOG_KEEP,
                )
            )
        keys = np.fromiter(latest, dtype=np.int64, count=len(latest))
        new = np.fromiter(latest.values(), dtype=np.float64, count=len(latest))
        self._patch_priorities(seq, keys, new)
        return len(latest)

    def _patch_priorities(self, seq: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Carry cached key indexes that were current just before this process's priority
        update (priority version ``seq - 1``) over to ``seq``, with the new priorities."""
        for cache_key, (signature, arrays) in list(self._cache.items()):
            if signature[3] != seq - 1:
                continue
            self._cache[cache_key] = ((*signature[:3], seq), _with_priorities(arrays, keys, values))

    def _logged_priorities(
        self, conn: Connection, after: int, upto: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(keys, priorities) set by this buffer's priority updates ``after + 1 .. upto``,
        each key's latest; None if the log no longer reaches back that far."""
        log = priority_log.c
        stmt = (
            select(log.seq, log.key, log.priority)
            .where(log.buffer_id == self.buffer_id, log.seq > after, log.seq <= upto)
            .order_by(log.seq)
        )
        entries = conn.execute(stmt).all()
        if not entries or entries[0][0] != after + 1:
            return None
        latest = {key: priority for _, key, priority in entries}
        return (
            np.fromiter(latest, dtype=np.int64, count=len(latest)),
            np.fromiter(latest.values(), dtype=np.float64, count=len(latest)),
        )

    # -- reading -------------------------------------------------------------------------
    def _decode(self, r: Row[Any]) -> DataRow:
        # Positional access: a sampler decodes hundreds of rows per batch.
        row_id = r[_AT_ID]
        payload = decode_payload(r[_AT_DATA], r[_AT_TENSORS], row_id=row_id)
        meta = trusted(ExpMeta, {c: r[i] for c, i in _AT_META})
        for c, i in _AT_SCALARS:
            payload[c] = r[i]
        data = trusted(Experience, {name: payload[name] for name in _EXPERIENCE_FIELDS})
        return trusted(DataRow, {"exp_meta": meta, "exp_data": data, "id": row_id})

    def _select(self, query_condition: QueryCondition = None) -> Any:
        return select(*_ROW_COLUMNS).where(*self._where(query_condition))

    def get(self, row_id: str) -> DataRow | None:
        with self._errors("read a row"), self._read() as conn:
            found = conn.execute(self._select().where(rows.c.id == row_id)).first()
        return None if found is None else self._decode(found)

    def count(self, query_condition: QueryCondition = None) -> int:
        stmt = select(func.count()).select_from(rows).where(*self._where(query_condition))
        with self._errors("count rows"), self._read() as conn:
            return int(conn.execute(stmt).scalar_one())

    def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        order_by: str = "key",
    ) -> Iterator[DataRow]:
        """Stream matching rows, ``CHUNK`` at a time, in ``order_by`` order.

        ``order_by`` is a column of :data:`ORDERABLE` (``"key"`` is insertion order), with a
        leading ``-`` for descending. Each chunk is fetched in its own short read by keyset
        pagination, so the table is never loaded whole and no connection is held between
        chunks: the loop body may write to the buffer.
        """
        descending = order_by.startswith("-")
        column_name = order_by.lstrip("-")
        if column_name not in ORDERABLE:
            raise ValueError(
                f"order_by must be one of {ORDERABLE} (optionally with '-'), got {order_by!r}"
            )
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
        where = self._where(query_condition)  # compile now: errors surface at the call
        return self._stream(where, column_name, descending, limit)

    def _stream(
        self,
        where: list[ColumnElement[bool]],
        column_name: str,
        descending: bool,
        limit: int | None,
    ) -> Iterator[DataRow]:
        column = rows.c[column_name]
        keys = (column, rows.c.key) if column_name != "key" else (rows.c.key,)
        order = [k.desc() if descending else k.asc() for k in keys]
        position: tuple[Any, ...] | None = None
        remaining = limit
        while remaining is None or remaining > 0:
            size = CHUNK if remaining is None else min(CHUNK, remaining)
            stmt = select(*_ROW_COLUMNS).where(*where).order_by(*order).limit(size)
            if position is not None:
                cursor = tuple_(*keys)
                stmt = stmt.where(
                    cursor < tuple_(*position) if descending else cursor > tuple_(*position)
                )
            with self._errors("query rows"), self._read() as conn:
                chunk = conn.execute(stmt).all()
            for r in chunk:
                yield self._decode(r)
            if len(chunk) < size:
                return
            last = chunk[-1]._mapping
            position = tuple(last[k.name] for k in keys)
            if remaining is not None:
                remaining -= len(chunk)

    def _page(self, query_condition: QueryCondition, *, offset: int, limit: int) -> list[DataRow]:
        stmt = self._select(query_condition).order_by(rows.c.key).offset(offset).limit(limit)
        with self._errors("read a page"), self._read() as conn:
            return [self._decode(r) for r in conn.execute(stmt)]

    def _task_rows(self, task_ids: list[str]) -> dict[str, list[DataRow]]:
        grouped: dict[str, list[DataRow]] = {t: [] for t in task_ids}
        if not task_ids:
            return grouped
        order = (rows.c.task_id, rows.c.step, rows.c.execute_time, rows.c.key)
        with self._errors("read tasks"), self._read() as conn:
            for start in range(0, len(task_ids), 500):
                part = task_ids[start : start + 500]
                stmt = self._select().where(rows.c.task_id.in_(part)).order_by(*order)
                for r in conn.execute(stmt):
                    grouped[r._mapping["task_id"]].append(self._decode(r))
        return grouped

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        return self._task_rows([task_id])[task_id]

    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        if isinstance(task_ids, str):
            raise TypeError("get_batch_by_task_ids() needs a list of task ids, got one string")
        return self._task_rows(list(dict.fromkeys(task_ids)))

    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        stmt = (
            select(rows.c.task_id)
            .where(*self._where(query_condition))
            .group_by(rows.c.task_id)
            .order_by(func.min(rows.c.key))
        )
        with self._errors("list tasks"), self._read() as conn:
            return list(conn.execute(stmt).scalars())

    # -- the samplers' fast path ---------------------------------------------------------
    def _signature(self, conn: Connection) -> tuple[int, int, int, int]:
        """``(max key, version, min key, priority version)``: rows added raise the max key;
        FIFO eviction (which deletes only the oldest rows) raises the min key; priority
        updates bump the priority version; any other change bumps the version."""
        statement = self._statements.get(("signature",))
        if statement is None:
            key = select(rows.c.key)
            max_key = newest_first(key, self.buffer_id).limit(1).scalar_subquery()
            min_key = oldest_first(key, self.buffer_id).limit(1).scalar_subquery()
            this = buffers.c.id == self.buffer_id
            version = select(buffers.c.version).where(this).scalar_subquery()
            priority_version = select(buffers.c.priority_version).where(this).scalar_subquery()
            statement = self._statement(
                ("signature",), select(max_key, version, min_key, priority_version)
            )
        ((key, version, smallest, priority_version),) = statement.run(conn)
        return (int(key or 0), int(version or 0), int(smallest or 0), int(priority_version or 0))

    def key_index(
        self, query_condition: QueryCondition = None, columns: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """The matching rows' keys (``"key"``, int64, ascending) and ``columns`` as arrays.

        Float columns give float64 with NaN for NULL, ``step`` int64, ``done`` bool, string
        columns object arrays. A column may also be a path into the payload
        (``"exp_data.state.difficulty"``): an object array of the values there as JSON
        decodes them (str, int, float, bool, list, dict), None where the value is null or
        the path reaches nothing. The arrays are cached until the buffer changes: new
        inserts are appended, rows evicted by FIFO dropped from the front and priorities
        updated by any process patched from the priority log, so a full buffer with a
        writer and a trainer updating priorities never reloads; other changes (deletes,
        other eviction policies, a reader more than PRIORITY_LOG_KEEP priority updates
        behind) reload.
        """
        return self.key_indexes([(query_condition, columns)])[0]

    def key_indexes(
        self, requests: Sequence[tuple[QueryCondition, Sequence[str]]]
    ) -> list[dict[str, np.ndarray]]:
        """:meth:`key_index` for each ``(condition, columns)``, all from one read with one
        freshness check (a sampler that needs the matching rows and something of the whole
        buffer pays one round trip, and sees both at the same moment)."""
        plans = []
        for query_condition, columns in requests:
            columns = tuple(columns)
            selected = [_index_column(c, self.dialect) for c in columns]
            plans.append((query_condition, columns, selected))
        out = []
        with self._errors("index rows"), self._read() as conn:
            signature = self._signature(conn)
            for query_condition, columns, selected in plans:
                out.append(self._index(conn, signature, query_condition, columns, selected))
        return out

    def _index(
        self,
        conn: Connection,
        signature: tuple[int, int, int, int],
        query_condition: QueryCondition,
        columns: tuple[str, ...],
        selected: list[ColumnElement[Any]],
    ) -> dict[str, np.ndarray]:
        """One key_index() result at ``signature``: cached, brought up to date, or read."""
        cache_key = (_condition_key(query_condition), columns)
        cached = self._cache.get(cache_key)
        if cached is not None:
            self._cache.move_to_end(cache_key)
            if cached[0] == signature:
                return cached[1]
        since, kept = None, None
        if cached is not None and cached[0][1] == signature[1]:
            # The same version: since then rows were only added (keys above the cached
            # max key, which writers hand out in commit order) or evicted oldest first
            # (every key below the buffer's min key).
            since, kept = cached[0][0], cached[1]
            start = int(np.searchsorted(kept["key"], signature[2]))
            if start:
                kept = {k: v[start:] for k, v in kept.items()}
            if cached[0][3] != signature[3] and "priority" in kept:
                # Priorities updated since (by any process): patch them from the log, or
                # read everything again if the log no longer reaches back that far.
                logged = self._logged_priorities(conn, cached[0][3], signature[3])
                if logged is None:
                    since, kept = None, None
                else:
                    kept = _with_priorities(kept, *logged)
        fetched: Sequence[Any] = ()
        if since is None or signature[0] > since:
            # Up to the signature's max key only: rows committed after the signature was
            # read are left to the next call, so the cached arrays are exactly what the
            # signature describes (and a row is never fetched twice).
            stmt = select(rows.c.key, *selected)
            stmt = stmt.where(*self._where(query_condition), rows.c.key <= signature[0])
            if since is not None:
                stmt = stmt.where(rows.c.key > since)
            fetched = conn.execute(stmt.order_by(rows.c.key)).all()
        arrays = _to_arrays(fetched, columns)
        if kept is not None:
            arrays = {k: np.concatenate([kept[k], arrays[k]]) for k in arrays}
        for a in arrays.values():
            a.flags.writeable = False
        self._cache[cache_key] = (signature, arrays)
        while len(self._cache) > KEY_INDEX_CACHE:
            self._cache.popitem(last=False)
        return arrays

    def fetch_fields(
        self, keys: Sequence[int] | np.ndarray, paths: Sequence[str], *, writable: bool = True
    ) -> list[tuple[Any, ...]]:
        """For each key found (in the order given, repeats allowed, vanished keys skipped)
        a tuple ``(id, value at paths[0], value at paths[1], ...)``; MISSING where a row
        has nothing at a path.

        Only the columns the paths need are read, and of the JSON document only the parts
        they reach, extracted by the database (see :mod:`expstore.storage.fields`): the
        fast path for converters that read a few fields (:class:`~expstore.TensorConverter`)
        instead of whole rows. With ``writable=False`` arrays may be read-only views of the
        fetched bytes, for a caller that copies them anyway.
        """
        ids, columns = self.fetch_columns(keys, paths, writable=writable)
        return list(zip(ids, *map(list, columns), strict=True))

    def fetch_columns(
        self, keys: Sequence[int] | np.ndarray, paths: Sequence[str], *, writable: bool = True
    ) -> tuple[list[str], list[Values]]:
        """:meth:`fetch_fields` by column: the ids of the rows found (in the order given,
        repeats allowed, vanished keys skipped) and each path's values over them, as a
        list, or for a tensor field (one dtype and shape in every row) as one array whose
        first axis runs over the rows: the batch, stacked without a per-row array."""
        plans = self._plans.get((tuple(paths), writable))
        if plans is None:
            plans = field_plans(paths, self.dialect, writable=writable)
            if len(self._plans) >= KEY_INDEX_CACHE:
                self._plans.clear()
            self._plans[(tuple(paths), writable)] = plans
        plan, whole = plans
        wanted = _key_list(keys)
        found, ids, values, unread = plan.read_all(
            self._fetch(list(dict.fromkeys(wanted)), plan.columns)
        )
        if unread and whole is not None:
            again, more_ids, more, _ = whole.read_all(self._fetch(unread, whole.columns))
            found, ids = found + again, ids + more_ids
            # A stacked array is a read-only view of the fetched bytes: its rows are copied.
            values = [
                [*(a.copy() if isinstance(a, np.ndarray) else a), *b]
                for a, b in zip(values, more, strict=True)
            ]
        at = {key: i for i, key in enumerate(found)}
        positions = [at[k] for k in wanted if k in at]
        order = np.array(positions, dtype=np.intp)
        return [ids[i] for i in positions], [
            v[order] if isinstance(v, np.ndarray) else [v[i] for i in positions] for v in values
        ]

    def fetch_keys(self, keys: Sequence[int] | np.ndarray) -> list[DataRow]:
        """The rows with these keys in the given order (repeats allowed; vanished keys skipped)."""
        return self._by_keys(keys, _ROW_COLUMNS, self._decode)

    def _by_keys(
        self, keys: Sequence[int] | np.ndarray, columns: Sequence[Any], make: Callable[[Any], _T]
    ) -> list[_T]:
        """``make(row)`` for the rows with these keys (``columns[0]`` must be ``key``), in
        the order given, repeats allowed, keys no longer stored skipped."""
        wanted = _key_list(keys)
        found = self._found(wanted, columns, make)
        return [found[k] for k in wanted if k in found]

    def _found(
        self, wanted: list[int], columns: Sequence[Any], make: Callable[[Any], _T]
    ) -> dict[int, _T]:
        """``make(row)`` by key, for the stored rows among ``wanted``."""
        return {r[0]: make(r) for r in self._fetch(list(dict.fromkeys(wanted)), columns)}

    def _fetch(self, keys: list[int], columns: Sequence[Any]) -> list[Any]:
        """``columns`` (``columns[0]`` the key) of this buffer's rows among the distinct
        ``keys``, in no particular order."""
        statement = self._statements.get(tuple(columns))
        if statement is None:
            # Keys are unique across buffers. The buffer is checked here rather than in the
            # WHERE clause, where it would lead SQLite to look each key up through the
            # (buffer_id, key) index and then the table, instead of the table alone.
            stmt = select(*columns, rows.c.buffer_id).where(_key_in(self.dialect))
            statement = self._statement(tuple(columns), stmt)
        fetched: list[Any] = []
        buffer_id = self.buffer_id
        with self._errors("fetch rows"), self._read() as conn:
            for start in range(0, len(keys), 5000):
                chunk = keys[start : start + 5000]
                fetched += [
                    r
                    for r in statement.run(conn, keys=_key_set(chunk, self.dialect))
                    if r[-1] == buffer_id
                ]
        return fetched

    def _statement(self, key: tuple[Any, ...], stmt: Select[Any]) -> CompiledSelect:
        """``stmt`` compiled for this database, kept under ``key``."""
        if len(self._statements) >= 64:
            self._statements.clear()
        compiled = self._statements[key] = CompiledSelect(stmt, self._engine.dialect)
        return compiled


def _key_in(dialect: str) -> ColumnElement[bool]:
    """``key`` is in the set bound as ``keys`` (see _key_set): one statement whatever the
    number of keys, so it is compiled once."""
    if dialect == "postgresql":
        return rows.c.key == func.any(bindparam("keys"))
    each: Select[Any] = select(column("value")).select_from(func.json_each(bindparam("keys")))
    return rows.c.key.in_(each.scalar_subquery())


def _key_set(keys: list[int], dialect: str) -> Any:
    """The ``keys`` parameter of _key_in: an array for Postgres, JSON text for SQLite."""
    if dialect == "postgresql":
        return keys
    return "[" + ",".join(map(str, keys)) + "]"


def _key_list(keys: Sequence[int] | np.ndarray) -> list[int]:
    return np.asarray(keys, dtype=np.int64).reshape(-1).tolist()  # type: ignore[no-any-return]


_PG_COPY_TYPES = [
    "int4",  # buffer_id
    "text",  # id
    "text",  # task_id
    "text",  # task_name
    "text",  # agent_id
    "int8",  # step
    "float8",  # execute_time
    "text",  # pre_agent
    "float8",  # reward_t
    "float8",  # adv_t
    "float8",  # v_t
    "bool",  # done
    "jsonb",  # data
    "bytea",  # tensors
]


def _as_is(text: str) -> str:
    """psycopg's JSON dumps for a document the codec already serialised."""
    return text


def _reopen(url: str, name: str) -> SqlStorage:
    """The storage in another process: the buffer's retention comes from the database."""
    return SqlStorage(url, name=name)


def _check_retention(capacity: Any, eviction: Any) -> None:
    if capacity is not None and (
        isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
    ):
        raise ValueError(f"capacity must be None or an int >= 1, got {capacity!r}")
    if eviction is not None and eviction not in EVICTION_POLICIES:
        raise ValueError(f"eviction must be one of {sorted(EVICTION_POLICIES)}, got {eviction!r}")


def _condition_key(query_condition: QueryCondition) -> str:
    if query_condition is None:
        return ""
    from ..query import as_condition

    condition = as_condition(query_condition)
    return (
        "" if condition is None else json.dumps(condition.to_dict(), sort_keys=True, default=repr)
    )


def _array_dtype(column: Any) -> Any:
    if isinstance(column.type, Double):
        return np.float64  # NULL becomes NaN
    if isinstance(column.type, Boolean):
        return bool
    if isinstance(column.type, BigInteger | Integer):
        return np.int64
    return object


#: The numpy dtype of each key_index() column, from the schema's column types.
_ARRAY_DTYPES = {c.name: _array_dtype(c) for c in rows.c if c.name not in ("data", "tensors")}


def _with_priorities(
    arrays: dict[str, np.ndarray], keys: np.ndarray, values: np.ndarray
) -> dict[str, np.ndarray]:
    """``arrays`` with ``priority`` set to ``values`` at ``keys`` (those it holds); arrays
    without priorities as they are."""
    if "priority" not in arrays or not len(arrays["key"]):
        return arrays
    positions = np.searchsorted(arrays["key"], keys)
    inside = positions < len(arrays["key"])
    hit = inside.copy()
    hit[inside] = arrays["key"][positions[inside]] == keys[inside]
    priority = arrays["priority"].copy()
    priority[positions[hit]] = values[hit]
    priority.flags.writeable = False
    return {**arrays, "priority": priority}


def _index_column(name: str, dialect: str) -> ColumnElement[Any]:
    """What key_index() selects for ``name``: a column, or the JSON text at a payload path."""
    if name == "priority":
        return rows.c.priority
    from ..query.compiler import json_text
    from ..query.fields import resolve_field

    path = resolve_field(name)
    if path.column is not None:
        return rows.c[path.column.name].label(name)
    return json_text(path, rows, dialect, sqlite_arrow=SQLITE_ARROW)


def _array_dtype_of(name: str) -> Any:
    if name in _ARRAY_DTYPES:
        return _ARRAY_DTYPES[name]
    from ..paths import parse_path

    column = parse_path(name).column
    return None if column is None else _ARRAY_DTYPES[column.name]


def _to_arrays(fetched: Sequence[Row[Any]], columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    # zip(*rows) transposes in C: no Python-level loop per row, even at millions of rows.
    transposed = list(zip(*fetched, strict=True)) if fetched else [()] * (len(columns) + 1)
    out: dict[str, np.ndarray] = {"key": np.array(transposed[0], dtype=np.int64)}
    for name, values in zip(columns, transposed[1:], strict=True):
        dtype = _array_dtype_of(name)
        out[name] = _json_values(values) if dtype is None else np.array(values, dtype=dtype)
    return out


def _json_value(text: str) -> Any:
    """A stored JSON part as the codec decodes it (NaN, escaped dicts); a tensor, which
    needs its row's blob, stays its placeholder."""
    value = json.loads(text)
    try:
        return PartDecoder(None, "").decode_part(value, "value")
    except CodecError:
        return value


def _json_values(texts: Sequence[str | None]) -> np.ndarray:
    """The decoded values of JSON texts (None for SQL NULL and JSON null), each distinct
    text parsed once."""
    parsed: dict[str | None, Any] = {None: None}
    for text in set(texts):
        if text not in parsed:
            parsed[text] = _json_value(text)  # type: ignore[arg-type]
    return np.fromiter(map(parsed.__getitem__, texts), dtype=object, count=len(texts))


class _TranslateErrors:
    """Turns driver errors into StorageError with what to do; lets expstore errors through."""

    def __init__(self, storage: SqlStorage, action: str) -> None:
        self.storage = storage
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, DBAPIError):
            return
        url = self.storage.url.render_as_string(hide_password=True)
        reason = str(exc.orig).strip() or str(exc)
        if isinstance(exc, DataError | IntegrityError):
            advice = "the database refused the data; fix the value it names"
        else:
            advice = "check that the database is reachable and writable"
        raise StorageError(
            f"could not {self.action} in {url} (buffer {self.storage.name!r}): {reason}. "
            f"Nothing was changed; {advice}"
        ) from exc
