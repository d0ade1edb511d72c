"""Where SQLite and PostgreSQL differ, one class each, as SQLAlchemy keeps dialect
differences in dialect classes: how chosen keys are bound, how rows are inserted in bulk,
how ids become keys, how a buffer's row is locked and how it is first created.

The query compiler keeps the JSON-path differences in one place of its own
(:mod:`expstore.query.compiler`); migrations keep theirs (:mod:`expstore.db.migrate`).
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple
from typing import cast as as_type

from sqlalchemy import (
    BigInteger,
    Boolean,
    Connection,
    Double,
    Engine,
    Integer,
    LargeBinary,
    Select,
    String,
    Text,
    bindparam,
    cast,
    column,
    func,
    insert,
    literal,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.sql.elements import ColumnElement

from ..errors import UnsupportedTypeError
from ..model.paths import FieldPath
from ..query.compiler import json_text
from .compiled import execute_many
from .schema import ROW_KEY, buffers, counters, rows

__all__ = [
    "Dialect",
    "Inserted",
    "PostgresDialect",
    "SqliteDialect",
    "WRITE_COLUMNS",
    "dialect_for",
]

#: The columns a write fills, in the order of the encoded tuples (see writer.py).
WRITE_COLUMNS: tuple[str, ...] = tuple(c.name for c in rows.c if c.name not in ("key", "priority"))
_COLUMN_LIST = ", ".join(f'"{c}"' for c in WRITE_COLUMNS)

#: Encoded rows, one tuple per row in WRITE_COLUMNS order, a chunk at a time.
Chunks = Iterator[list[tuple[Any, ...]]]
#: Rows a Postgres write inserts with one INSERT statement; more go by COPY (measured: at
#: 8 rows the two cost the same, at 32 and 64 the COPY takes half the time).
SMALL_INSERT = 8


def _jsonb_key(item: tuple[str, Any]) -> tuple[int, bytes]:
    """Where JSONB puts an object's key: by its length in bytes, then its bytes."""
    encoded = item[0].encode("utf-8", "surrogatepass")
    return len(encoded), encoded


class Inserted(NamedTuple):
    """What :meth:`Dialect.insert_rows` did beside inserting."""

    #: Whether the insert counted its rows on the buffer's row itself.
    counted: bool = False
    #: The keys the rows got, in the order given, where the insert knows them without a
    #: statement of its own (SQLite hands them out; a few rows on Postgres return theirs);
    #: else None.
    keys: Sequence[int] | None = None


#: The largest row key ever handed out (kept by SQLite writers, see SqliteDialect).
_ISSUED = select(counters.c.value).where(counters.c.name == ROW_KEY)
#: SQLite's key state: the largest key of the table, and the largest ever handed out.
_KEY_STATE = [
    select(func.max(rows.c.key)).scalar_subquery(),
    _ISSUED.scalar_subquery(),
]
#: Raise the largest key handed out to the table's largest (before a removal).
_RAISE_ISSUED = (
    sqlite_insert(counters)
    .values(name=ROW_KEY, value=select(func.coalesce(func.max(rows.c.key), 0)).scalar_subquery())
    .on_conflict_do_update(
        index_elements=["name"],
        set_={"value": func.max(counters.c.value, literal_column("excluded.value"))},
    )
)


#: The database's clock in seconds since the Unix epoch, built once (an expression is
#: immutable, and building it cost every statement that reads the clock). SQLite:
#: julianday('now') has millisecond resolution; day 2440587.5 is the Unix epoch.
_SQLITE_NOW: ColumnElement[float] = (func.julianday("now") - 2440587.5) * 86400.0
#: Postgres: the transaction's start, one instant for every row a claim or an ack writes.
_POSTGRES_NOW: ColumnElement[float] = cast(func.extract("epoch", func.now()), Double)


class Dialect(ABC):
    """What one backend does its own way."""

    name: str
    #: Whether encoding the next chunk in a thread overlaps the insert of the current one.
    encodes_in_thread: bool = False
    #: Whether the database extracts a part of a JSON document as text by its path (``->``),
    #: so a fetch reads only the parts a converter needs.
    extracts_json: bool = True
    #: Whether transactions lock rows (:meth:`locked`, :meth:`key_shared`) to take turns
    #: with each other; False where one writer runs at a time anyway (SQLite).
    locks_rows: bool = False
    #: Whether a statement may hold INSERT/UPDATE ... RETURNING in its WITH clause
    #: (Postgres): a claim is then one statement per round.
    modifying_ctes: bool = False

    def as_stored(self, value: Any) -> Any:
        """A part of a document (parsed JSON) as the database gives it back: the same
        (SQLite keeps a document's text as written)."""
        return value

    def column_as_stored(self, value: Any) -> Any:
        """A typed column's value as the database gives it back: the same."""
        return value

    def says_keys(self, n: int) -> bool:
        """Whether :meth:`insert_rows` of ``n`` rows returns their keys."""
        return False

    def json_text(self, path: FieldPath) -> ColumnElement[Any]:
        """The JSON text of the value at a payload path of the rows' document (NULL where
        there is none), as conditions read it (:func:`expstore.query.compiler.json_text`)."""
        return json_text(path, rows, self.name, sqlite_arrow=self.extracts_json)

    @abstractmethod
    def key_in(self, column: Any = rows.c.key) -> ColumnElement[bool]:
        """``column`` (the rows' ``key`` by default) is in the set bound as ``keys``: one
        statement whatever the number of keys, so it is compiled once."""

    @abstractmethod
    def key_set(self, keys: list[int]) -> Any:
        """The ``keys`` parameter of :meth:`key_in`."""

    @abstractmethod
    def text_in(self, column: Any, name: str) -> ColumnElement[bool]:
        """``column`` (of text: ``id``, ``task_id``) is in the set of texts bound as
        ``name`` (:meth:`text_set`): as :meth:`key_in`, one statement whatever the number
        of values, so it is compiled once."""

    @abstractmethod
    def text_set(self, values: Sequence[str]) -> Any:
        """The parameter of :meth:`text_in` for these texts."""

    @abstractmethod
    def bound_keys(self) -> Any:
        """The keys bound as ``keys`` (see :meth:`key_set`) as a subquery of one column,
        ``key``."""

    @abstractmethod
    def bound_key_values(self) -> Any:
        """Keys and a number for each, bound by :meth:`key_value_params`, as a subquery of
        two columns, ``key`` and ``value``."""

    @abstractmethod
    def key_value_params(self, keys: Sequence[int], values: Sequence[float]) -> dict[str, Any]:
        """The parameters of :meth:`bound_key_values` for these keys and their values
        (finite numbers), one value per key."""

    def insert_per_key(
        self, table: Any, values: dict[str, Any], given: Any = None, where: Any = None
    ) -> Any:
        """``INSERT INTO table`` one row per key of ``given`` (by default :meth:`bound_keys`;
        or :meth:`bound_key_values`, whose ``value`` column ``values`` may use), with
        ``values`` (plain values or SQL expressions) for its other columns, for the keys
        ``where`` (a condition on ``given``) holds: one statement whatever the number of
        keys. It is an upsert statement (``on_conflict_do_...``) of this database."""
        given = self.bound_keys() if given is None else given
        columns = {
            name: value if isinstance(value, ColumnElement) else literal(value)
            for name, value in values.items()
        }
        # WHERE true: SQLite reads "INSERT ... SELECT ... FROM t ON CONFLICT" as a join.
        chosen = select(given.c.key, *columns.values()).where(true() if where is None else where)
        return self.upsert(table).from_select(["key", *columns], chosen)

    @abstractmethod
    def insert_rows(
        self,
        conn: Connection,
        chunks: Chunks,
        key_state: Sequence[Any] | None = None,
        count: int = 0,
        *,
        keys_said: bool = True,
    ) -> Inserted:
        """Insert encoded rows, chunk by chunk as the encoder hands them over
        (``key_state``: the values of :meth:`key_state` as the write read them with the
        buffer's row, which it holds; None: read them now). ``count``: the rows going in,
        which the insert may count on the buffer's row in its own statement (its
        ``inserted`` and ``row_count`` up by ``count``, ``inserted_at`` now, as the
        write's count does): :class:`Inserted` says whether it did, and the keys the rows
        got where it knows them (``keys_said=False``: never, its result not read: an
        insert sent in a pipeline, see :meth:`pipelines_insert`)."""

    def pipelines_insert(self, rows: int) -> bool:
        """Whether an insert of ``rows`` rows may be sent in a pipeline (see
        :mod:`expstore.db.pipeline`; not a COPY), its result unread, counting its rows
        on the buffer's row itself (:meth:`insert_rows` with ``count`` of them all says
        ``counted``)."""
        return False

    def key_state(self) -> list[Any]:
        """Scalar subqueries the writer reads with the buffer's row, for
        :meth:`insert_rows` to hand keys out (none: the database does it alone)."""
        return []

    def before_delete(
        self, conn: Connection, top: int, key_state: Sequence[Any]
    ) -> tuple[Any, ...]:
        """Called in a transaction that holds a buffer's row, before rows are deleted
        (``top``: the largest key of those; ``key_state``: :meth:`key_state`'s values as
        the transaction read them); returns the key state as the delete leaves it, for
        :meth:`insert_rows` later in the transaction."""
        return tuple(key_state)

    def state_check(self, buffer_id: Any) -> list[Any]:
        """Two values read with a buffer's row taken for a write: where they differ, the
        row changed while the statement waited for it, and what the statement read of
        other tables (in the snapshot it started with) must be read again. None where a
        write's statements never wait inside a statement (SQLite: BEGIN IMMEDIATE waits
        before the first)."""
        return []

    @abstractmethod
    def ids_statement(self, buffer_id: int, ids: list[str]) -> Select[Any]:
        """``SELECT id, key`` of a buffer's rows with these ids."""

    def locked(self, stmt: Select[Any]) -> Select[Any]:
        """``stmt`` locking the rows it reads until the transaction ends."""
        return stmt

    def share_locked(self, stmt: Select[Any]) -> Select[Any]:
        """``stmt`` locking the rows it reads against updates until the transaction ends,
        letting other readers that lock them so go on (a consumer's claims hold its row
        so, while opening a new epoch updates it)."""
        return stmt

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        """``stmt`` locking the rows it reads, passing over rows another transaction holds
        (claims: concurrent claimers never wait on each other)."""
        return stmt

    def key_shared(self, stmt: Select[Any]) -> Select[Any]:
        """``stmt`` taking a lock on the rows it reads that keeps them from being deleted
        (not from being locked for update otherwise) until the transaction ends."""
        return stmt

    @abstractmethod
    def snapshot(self, conn: Connection) -> None:
        """Make every statement ``conn`` runs from now on (a fresh read connection) read one
        snapshot of the database, so that several statements of one draw agree."""

    @abstractmethod
    def now(self) -> ColumnElement[float]:
        """The database's clock in seconds since the epoch, the one clock leases are
        measured by whatever host a process runs on."""

    def in_key_order(self, buffer_id: int) -> ColumnElement[bool]:
        """The condition "a row of this buffer" for a statement that walks the buffer's
        rows in key order from a key (a keyset page): written so the planner seeks the
        ``(buffer_id, key)`` index on both, not the primary key's range over every
        buffer's rows."""
        return rows.c.buffer_id == buffer_id

    def in_key_order_found(self) -> Any:
        """The ORDER BY term of rows found by another index (by their ids: a replace)
        sorted by key: written so the planner looks the rows up by that index and sorts
        the few it finds, not walks every row of the buffer in key order."""
        return rows.c.key

    @abstractmethod
    def keys_text(self, column: Any) -> ColumnElement[str]:
        """An aggregate: the group's ``column`` values (integer keys) as one comma-separated
        text, in any order."""

    def commit_without_flush(self) -> ColumnElement[bool]:
        """A true condition that, evaluated by a statement, lets its transaction commit
        without waiting for the log to reach disk (for counters whose loss in a crash only
        loosens a budget: the row lock is then held for the statement, not for a flush)."""
        return true()

    @abstractmethod
    def upsert(self, table: Any) -> Any:
        """``INSERT INTO table`` with ``on_conflict_do_update`` / ``do_nothing``."""

    def wrote(self, engine: Engine, buffer_id: int, rows_written: int) -> None:
        """Called after a write of ``rows_written`` rows to a buffer commits; the dialect
        may refresh what its planner knows of the table."""
        return None

    @abstractmethod
    def create_buffer(self, conn: Connection, name: str) -> None:
        """Add the buffer's row unless another process just added it."""


class SqliteDialect(Dialect):
    name = "sqlite"
    # SQLite's -> operator (JSON text of a part, NULL where there is none) came in 3.38.
    extracts_json = sqlite3.sqlite_version_info >= (3, 38, 0)

    def __init__(self) -> None:
        marks = ", ".join("?" * len(WRITE_COLUMNS))
        # A constant statement over our own column names; every value is a bound parameter.
        self._insert = f"INSERT INTO {rows.name} ({_COLUMN_LIST}) VALUES ({marks})"
        self._insert_keyed = f'INSERT INTO {rows.name} ("key", {_COLUMN_LIST}) VALUES (?, {marks})'

    def key_in(self, column: Any = rows.c.key) -> ColumnElement[bool]:
        keys = func.json_each(bindparam("keys"))
        each: Select[Any] = select(literal_column("value")).select_from(keys)
        return as_type("ColumnElement[bool]", column.in_(each.scalar_subquery()))

    def key_set(self, keys: list[int]) -> Any:
        return "[" + ",".join(map(str, keys)) + "]"

    def text_in(self, column: Any, name: str) -> ColumnElement[bool]:
        values = func.json_each(bindparam(name, type_=Text))
        each: Select[Any] = select(literal_column("value")).select_from(values)
        return as_type("ColumnElement[bool]", column.in_(each.scalar_subquery()))

    def text_set(self, values: Sequence[str]) -> Any:
        return json.dumps(list(values))

    def keys_text(self, column: Any) -> ColumnElement[str]:
        return func.group_concat(column)

    def bound_keys(self) -> Any:
        each = func.json_each(bindparam("keys"))
        return select(literal_column("value").label("key")).select_from(each).subquery()

    def bound_key_values(self) -> Any:
        # One JSON array of [key, value] pairs, read in one pass (two arrays joined by
        # position would be read once per pair).
        pairs = func.json_each(bindparam("pairs")).table_valued("value").alias("pairs")
        key = cast(func.json_extract(pairs.c.value, "$[0]"), BigInteger).label("key")
        value = cast(func.json_extract(pairs.c.value, "$[1]"), Double).label("value")
        return select(key, value).select_from(pairs).subquery()

    def key_value_params(self, keys: Sequence[int], values: Sequence[float]) -> dict[str, Any]:
        pairs = ",".join(f"[{int(k)},{float(v)!r}]" for k, v in zip(keys, values, strict=True))
        return {"pairs": f"[{pairs}]"}

    def key_state(self) -> list[Any]:
        return _KEY_STATE

    def insert_rows(
        self,
        conn: Connection,
        chunks: Chunks,
        key_state: Sequence[Any] | None = None,
        count: int = 0,
        *,
        keys_said: bool = True,
    ) -> Inserted:
        # The DB-API's executemany directly: the values are already in column order.
        # SQLite gives a new row the table's largest key + 1, which is the key of a deleted
        # row when the newest rows were deleted: then the keys are given here, above the
        # largest ever handed out (expstore_counters.row_key, which every removal raises
        # to the largest key before it deletes: see before_delete; writers take turns).
        if key_state is None:
            key_state = tuple(conn.execute(select(*_KEY_STATE)).one())
        largest, issued = key_state
        next_key = None if issued is None or (largest or 0) >= issued else issued + 1
        # (without a key given, each row gets the table's largest key + 1: writers take
        # turns, so the rows' keys follow the largest as the write read it)
        first_key = (largest or 0) + 1 if next_key is None else next_key
        stored = 0
        for params in chunks:
            stored += len(params)
            if next_key is None:
                execute_many(conn, self._insert, params)
                continue
            keyed = [(key, *p) for key, p in enumerate(params, next_key)]
            execute_many(conn, self._insert_keyed, keyed)
            next_key += len(params)
        # (no statement of SQLite's modifies in its WITH clause: never counted)
        return Inserted(False, range(first_key, first_key + stored))

    def before_delete(
        self, conn: Connection, top: int, key_state: Sequence[Any]
    ) -> tuple[Any, ...]:
        # The largest key handed out so far, kept before rows may go (see insert_rows).
        # Rows all below the table's largest key as this transaction first read it take
        # nothing from the top: that key is still there (keys only grow), or a removal of
        # this transaction took it and raised the counter above these (the oldest rows an
        # eviction takes).
        largest = key_state[0] if key_state else None
        if largest is not None and top < largest:
            return tuple(key_state)
        conn.execute(_RAISE_ISSUED)
        if not key_state:
            return ()
        # The counter now holds at least the largest key; the table's largest after the
        # delete is unknown (None), so an insert gives keys above the counter.
        return (None, max(int(largest or 0), int(key_state[1] or 0)))

    def ids_statement(self, buffer_id: int, ids: list[str]) -> Select[Any]:
        return select(rows.c.id, rows.c.key).where(
            rows.c.buffer_id == buffer_id, rows.c.id.in_(ids)
        )

    def column_as_stored(self, value: Any) -> Any:
        # A REAL column keeps an integral value as an integer: -0.0 comes back 0.0.
        return 0.0 if type(value) is float and value == 0.0 else value

    def says_keys(self, n: int) -> bool:
        return True

    # SQLite's BEGIN IMMEDIATE already lets one writer in at a time: no row locks.

    def snapshot(self, conn: Connection) -> None:
        # A read transaction (BEGIN, from the engine's begin event): in WAL mode its
        # snapshot is taken at the first read and kept to its end. Statements run on the
        # driver's cursor otherwise commit one by one.
        conn.begin()

    def in_key_order(self, buffer_id: int) -> ColumnElement[bool]:
        # Without the hint, SQLite's planner takes a key range on the rowid (thinking the
        # buffer column unselective) and reads every other buffer's rows in the range.
        return as_type(
            "ColumnElement[bool]",
            func.likelihood(rows.c.buffer_id == buffer_id, literal_column("0.001")),
        )

    def in_key_order_found(self) -> Any:
        # A bare key would have SQLite's planner walk the (buffer_id, key) index for the
        # order and test every row of the buffer (a replace of one row of 20k: 30 ms).
        return rows.c.key + 0

    def now(self) -> ColumnElement[float]:
        return _SQLITE_NOW

    def upsert(self, table: Any) -> Any:
        return sqlite_insert(table)

    def create_buffer(self, conn: Connection, name: str) -> None:
        conn.execute(insert(buffers).values(name=name, created_at=time.time()))


#: The planner's estimate of a buffer's rows, as EXPLAIN reports it.
_ESTIMATE = text(f"EXPLAIN (FORMAT JSON) SELECT key FROM {rows.name} WHERE buffer_id = :buffer_id")


def _copy_type(sql_type: Any) -> str:
    """The binary COPY type name of a column type of the rows table."""
    sql_type = getattr(sql_type, "_variant_mapping", {}).get("postgresql", sql_type)
    for kind, name in (
        (Boolean, "bool"),
        (BigInteger, "int8"),
        (Integer, "int4"),
        (Double, "float8"),
        ((String, Text), "text"),
        (JSONB, "jsonb"),
        (LargeBinary, "bytea"),
    ):
        if isinstance(sql_type, kind):
            return name
    raise UnsupportedTypeError(f"no COPY type for {sql_type!r}")  # pragma: no cover


@contextmanager
def _as_sqlalchemy_errors(statement: str) -> Iterator[None]:
    """psycopg's errors raised inside, surfaced as SQLAlchemy's ``Connection.execute``
    would raise them (for statements run on psycopg's own cursor)."""
    import psycopg

    try:
        yield
    except psycopg.errors.IntegrityError as exc:
        raise IntegrityError(statement, None, exc) from exc
    except psycopg.DataError as exc:
        raise DataError(statement, None, exc) from exc
    except psycopg.Error as exc:
        raise OperationalError(statement, None, exc) from exc


def _as_is(text: str) -> str:
    """psycopg's JSON dumps for a document the codec already serialised."""
    return text


class PostgresDialect(Dialect):
    name = "postgresql"
    # psycopg releases the GIL while it waits on the server.
    encodes_in_thread = True
    locks_rows = True
    modifying_ctes = True

    def says_keys(self, n: int) -> bool:
        return n <= SMALL_INSERT  # (one INSERT ... RETURNING; more go by COPY)

    def as_stored(self, value: Any) -> Any:
        # JSONB keeps an object's keys shorter first, then in byte order
        if type(value) is dict:
            items = sorted(value.items(), key=_jsonb_key)
            return {k: self.as_stored(v) for k, v in items}
        if type(value) is list:
            return [self.as_stored(v) for v in value]
        return value

    def __init__(self) -> None:
        self.copy_types = [_copy_type(rows.c[name].type) for name in WRITE_COLUMNS]
        self._copy = f"COPY {rows.name} ({_COLUMN_LIST}) FROM STDIN (FORMAT BINARY)"
        self._small: dict[tuple[int, bool, bool], str] = {}
        #: now() as the write's count of its rows writes it (see _small_insert)
        self._now_sql = str(self.now().compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
        self._data_at = WRITE_COLUMNS.index("data")
        self._unchecked = 0
        self._may_analyze = True
        self._chance = random.Random()

    def key_in(self, column: Any = rows.c.key) -> ColumnElement[bool]:
        return as_type("ColumnElement[bool]", column == func.any(bindparam("keys")))

    def key_set(self, keys: list[int]) -> Any:
        return keys

    def text_in(self, column: Any, name: str) -> ColumnElement[bool]:
        values = bindparam(name, type_=ARRAY(Text))
        return as_type("ColumnElement[bool]", column == func.any(values))

    def text_set(self, values: Sequence[str]) -> Any:
        return list(values)

    def keys_text(self, column: Any) -> ColumnElement[str]:
        return func.string_agg(cast(column, Text), literal(","))

    def bound_keys(self) -> Any:
        keys = bindparam("keys", type_=ARRAY(BigInteger))
        return select(func.unnest(keys).label("key")).subquery()

    def bound_key_values(self) -> Any:
        keys = bindparam("keys", type_=ARRAY(BigInteger))
        values = bindparam("values", type_=ARRAY(Double))
        pairs = (
            func.unnest(keys, values)
            .table_valued(column("key", BigInteger), column("value", Double))
            .render_derived(name="given")
        )
        return select(pairs.c.key, pairs.c.value).subquery()

    def key_value_params(self, keys: Sequence[int], values: Sequence[float]) -> dict[str, Any]:
        return {"keys": [int(k) for k in keys], "values": [float(v) for v in values]}

    def insert_rows(
        self,
        conn: Connection,
        chunks: Chunks,
        key_state: Sequence[Any] | None = None,
        count: int = 0,
        *,
        keys_said: bool = True,
    ) -> Inserted:
        from psycopg.copy import QueuedLibpqWriter
        from psycopg.types.json import Jsonb

        raw = conn.connection.driver_connection
        assert raw is not None
        data_at = self._data_at

        def as_sent(p: tuple[Any, ...]) -> tuple[Any, ...]:  # the codec's JSON, as JSONB
            return (*p[:data_at], Jsonb(p[data_at], dumps=_as_is), *p[data_at + 1 :])

        chunks = iter(chunks)
        first = next(chunks, None)
        if first is None:
            return Inserted()
        following = next(chunks, None)
        if following is None and len(first) <= SMALL_INSERT:
            # A few rows (a step of vector envs, a GRPO group): one INSERT of them all, one
            # round trip, prepared once per connection and row count (SQLAlchemy turns
            # psycopg's automatic preparing off); a COPY through a thread costs more. The
            # write's count of them on the buffer's row goes in its WITH clause: no round
            # trip of its own.
            counting = count == len(first)
            statement = self._small_insert(len(first), counting, keys_said)
            values = [v for p in first for v in as_sent(p)]
            if counting:
                values[:0] = [count, count, first[0][0]]  # (WRITE_COLUMNS[0]: buffer_id)
            with _as_sqlalchemy_errors(statement), raw.cursor() as cursor:
                cursor.execute(statement, values, prepare=True)
                if not keys_said:
                    return Inserted(counting)
                returned = dict(cursor.fetchall())
            # (keys by id: the order RETURNING gives rows in is not promised)
            return Inserted(counting, [returned[p[1]] for p in first])
        chunks = itertools.chain([first], [] if following is None else [following], chunks)
        # The queued writer sends to the server from a thread of its own, so encoding the
        # next rows overlaps the network and the server's work.
        with (
            _as_sqlalchemy_errors(self._copy),
            raw.cursor() as cursor,
            cursor.copy(self._copy, writer=QueuedLibpqWriter(cursor)) as copy,
        ):
            copy.set_types(self.copy_types)
            for params in chunks:  # one COPY for the whole batch: no stall per chunk
                for p in params:
                    copy.write_row(as_sent(p))
        return Inserted()

    def pipelines_insert(self, rows: int) -> bool:
        return 0 < rows <= SMALL_INSERT  # one INSERT, its count in its WITH clause

    def state_check(self, buffer_id: Any) -> list[Any]:
        # READ COMMITTED: a SELECT ... FOR UPDATE that waited for another writer returns
        # the row as that writer left it (its xmin), but its subqueries read the snapshot
        # taken before the wait. Every change to what they read touches the buffer's row.
        held = buffers.alias("held")
        before: Select[Any] = select(literal_column("held.xmin::text"))
        before = before.where(held.c.id == buffer_id)
        return [literal_column(f"{buffers.name}.xmin::text"), before.scalar_subquery()]

    def _small_insert(self, n: int, counting: bool = False, returning: bool = True) -> str:
        """``INSERT`` of ``n`` rows in WRITE_COLUMNS order, every value a placeholder;
        ``counting``: with the count of them on the buffer's row in its WITH clause (its
        parameters first: the rows stored twice, as ``inserted`` and ``row_count`` grow,
        and the buffer's id); ``returning``: each row's id and key returned."""
        found = self._small.get((n, counting, returning))
        if found is None:
            row = "(" + ", ".join(["%s"] * len(WRITE_COLUMNS)) + ")"
            found = f"INSERT INTO {rows.name} ({_COLUMN_LIST}) VALUES " + ", ".join([row] * n)
            if returning:
                found += " RETURNING id, key"
            if counting:
                found = (
                    f"WITH counted AS (UPDATE {buffers.name} SET "
                    "inserted = inserted + %s::bigint, row_count = row_count + %s::bigint, "
                    f"inserted_at = {self._now_sql} WHERE id = %s::integer) {found}"
                )
            self._small[(n, counting, returning)] = found
        return found

    def ids_statement(self, buffer_id: int, ids: list[str]) -> Select[Any]:
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
            .where(rows.c.buffer_id == buffer_id, rows.c.id == wanted.c.id)
            .scalar_subquery()
        )
        found = select(wanted.c.id, key.label("key")).subquery()
        return select(found.c.id, found.c.key).where(found.c.key.is_not(None))

    def locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update()

    def share_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(read=True)  # FOR SHARE

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        # NO KEY UPDATE: other claimers skip the row, while inserting its consumption entry
        # (a foreign key check, FOR KEY SHARE) does not wait.
        return stmt.with_for_update(key_share=True, skip_locked=True, of=rows)

    def key_shared(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(read=True, key_share=True)

    def commit_without_flush(self) -> ColumnElement[bool]:
        # set_config(..., is_local => true): synchronous_commit off for this transaction
        # only, set by the statement itself (no round trip of its own).
        return func.set_config("synchronous_commit", "off", True).is_not(None)

    def snapshot(self, conn: Connection) -> None:
        # READ COMMITTED gives each statement its own snapshot; REPEATABLE READ one for the
        # transaction (on a hot standby too). psycopg sends it with the BEGIN.
        conn.execution_options(isolation_level="REPEATABLE READ")

    def now(self) -> ColumnElement[float]:
        return _POSTGRES_NOW

    def upsert(self, table: Any) -> Any:
        return pg_insert(table)

    #: Rows written to a buffer, by every handle together, between two looks at what the
    #: planner expects of it (on average).
    STATISTICS_EVERY = 2000

    def wrote(self, engine: Engine, buffer_id: int, rows_written: int) -> None:
        """ANALYZE the rows table when the planner expects this buffer to hold fewer than
        half the rows it holds.

        The planner's picture of the table decides how a buffer's rows are found: with
        statistics taken before a new buffer was bulk-loaded (autovacuum off, or not yet
        round), Postgres estimates that buffer at one row and may look each id up through
        any (buffer_id, ...) index, filtering every row of the buffer per id (measured:
        over 20 minutes for update_priorities of 10,000 ids after loading 1M rows into a
        second buffer). Autovacuum does the same when it runs; this does it at once, from
        the writer that made the change, looking (one EXPLAIN and the buffer's row count)
        about every STATISTICS_EVERY rows written to the buffer by all its writers: each
        write looks with a chance proportional to its rows (so many actors each writing a
        group of 8 rows look as often as one writing them all), and a handle that wrote
        STATISTICS_EVERY rows since it last looked looks at once.
        """
        self._unchecked += rows_written
        if not self._may_analyze:
            return
        due = self._unchecked >= self.STATISTICS_EVERY
        if not due and self._chance.random() >= rows_written / self.STATISTICS_EVERY:
            return
        self._unchecked = 0
        with engine.connect() as conn:
            (plan,) = conn.execute(_ESTIMATE, {"buffer_id": buffer_id}).scalar_one()
            held = conn.execute(
                select(buffers.c.row_count).where(buffers.c.id == buffer_id)
            ).scalar()
            if held is None or plan["Plan"]["Plan Rows"] * 2 >= held:
                conn.rollback()
                return
            try:
                conn.execute(text(f"ANALYZE {rows.name}"))  # our own table's constant name
                conn.commit()
            except DBAPIError:  # not the table's owner: autovacuum's job, then
                conn.rollback()
                self._may_analyze = False

    def create_buffer(self, conn: Connection, name: str) -> None:
        conn.execute(
            pg_insert(buffers).values(name=name, created_at=time.time()).on_conflict_do_nothing()
        )


def dialect_for(name: str) -> Dialect:
    """The Dialect of a SQLAlchemy dialect name (``sqlite`` or ``postgresql``)."""
    return PostgresDialect() if name == "postgresql" else SqliteDialect()


def chunked(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``items`` in slices of ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
