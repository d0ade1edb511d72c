"""Statements built with SQLAlchemy Core, compiled once, run on the driver's cursor.

The sampling path runs the same few statements for every batch: the freshness check of a
cached key index and the fetch of the chosen keys. There SQLAlchemy's per-execution work
(cache keys, parameter processing, Row objects) costs as much as the database's, so these
statements are compiled once per storage and run on the DB-API cursor. Everything else
still goes through SQLAlchemy: the SQL text is SQLAlchemy's, values are bound parameters,
result columns get the processors SQLAlchemy would apply, and driver errors become
SQLAlchemy's exception classes, as ``Connection.execute`` raises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError

__all__ = ["CompiledSelect", "CompiledWrite", "Pending", "driver_error", "execute_many"]


class CompiledSelect:
    """A SELECT (or an INSERT, UPDATE or DELETE ... RETURNING) compiled for one dialect;
    :meth:`run` returns its rows as tuples.

    Parameters given to :meth:`run` must be values the driver takes as they are (int,
    str, float, bytes, lists of ints for Postgres arrays): no bind processors run on them.
    """

    def __init__(self, stmt: Any, dialect: Dialect) -> None:
        compiled = stmt.compile(dialect=dialect)
        self.sql = str(compiled)
        positional: Sequence[str] | None = compiled.positiontup
        literal = {compiled.bind_names[b] for b in compiled.literal_execute_params}
        if literal:
            # Parameters marked literal_execute (SQLite's JSON paths) are written into the
            # SQL, escaped by SQLAlchemy, as Connection.execute would at each run.
            required = {name: None for name, b in compiled.binds.items() if b.required}
            expanded = compiled.construct_expanded_state(params=required)
            self.sql, positional = expanded.statement, expanded.positiontup
        # Values bound at build time get their bind processors once here.
        self._defaults: dict[str, Any] = {}
        for name, value in compiled.params.items():
            if name in literal:
                continue
            processor = compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
            self._defaults[name] = value if processor is None else processor(value)
        self._order = list(positional) if dialect.positional and positional is not None else None
        self._error: type[Exception] = dialect.loaded_dbapi.Error
        # Statements run on every call are prepared on the server where the driver can
        # (psycopg; SQLAlchemy turns its automatic preparing off); sqlite3 caches its own.
        self._prepare = dialect.driver == "psycopg"
        self._dialect = dialect
        # What it selects (a SELECT) or returns (an INSERT, UPDATE or DELETE ... RETURNING).
        selected = getattr(stmt, "selected_columns", None) or stmt.exported_columns
        self._types = [column.type.dialect_impl(dialect) for column in selected]
        # Result processors need the driver's type codes: set at the first run.
        self._processors: list[tuple[int, Any]] | None = None

    def _args(self, params: dict[str, Any]) -> Any:
        values = {**self._defaults, **params}
        return values if self._order is None else [values[n] for n in self._order]

    def plan(self, conn: Connection, **params: Any) -> list[str]:
        """The database's plan of this statement, a line each (SQLite's ``EXPLAIN QUERY
        PLAN`` details, Postgres's ``EXPLAIN``)."""
        driver = conn.connection.driver_connection
        assert driver is not None
        sqlite = self._dialect.name == "sqlite"
        cursor = driver.cursor()
        try:
            cursor.execute(
                ("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + self.sql, self._args(params)
            )
            return [str(line[-1] if sqlite else line[0]) for line in cursor.fetchall()]
        finally:
            _close_quietly(cursor)

    def run(self, conn: Connection, **params: Any) -> list[Sequence[Any]]:
        return self.send(conn, **params).rows()

    def send(self, conn: Connection, **params: Any) -> Pending:
        """Send the statement without reading its result yet: :meth:`Pending.rows` reads
        it (as :meth:`run` returns it). Inside a pipeline (:mod:`expstore.db.pipeline`)
        statements sent so go to the server together, in one round trip."""
        args = self._args(params)
        driver = conn.connection.driver_connection
        assert driver is not None
        cursor = driver.cursor()
        try:
            if self._prepare:  # psycopg: parsed and planned once per connection
                cursor.execute(self.sql, args, prepare=True)
            else:
                cursor.execute(self.sql, args)
        except self._error as exc:
            error = driver_error(conn, exc, self.sql, args, cursor)
            _close_quietly(cursor)
            raise error from exc
        except BaseException:
            _close_quietly(cursor)
            raise
        return Pending(self, conn, cursor, args)

    def _read(self, conn: Connection, cursor: Any, args: Any) -> list[Sequence[Any]]:
        try:
            if not self._types:  # an UPDATE, INSERT or DELETE: how many rows it changed
                return [(cursor.rowcount,)]
            fetched: list[Any] = cursor.fetchall()
            processors = self._processors
            if processors is None:
                codes = [d[1] for d in cursor.description]
                processors = self._processors = [
                    (i, p)
                    for i, (kind, code) in enumerate(zip(self._types, codes, strict=True))
                    if (p := kind.result_processor(self._dialect, code)) is not None
                ]
        except self._error as exc:
            raise driver_error(conn, exc, self.sql, args, cursor) from exc
        finally:
            _close_quietly(cursor)
        if processors:
            fetched = [self._process(list(r), processors) for r in fetched]
        return fetched

    @staticmethod
    def _process(row: list[Any], processors: list[tuple[int, Any]]) -> list[Any]:
        for i, processor in processors:
            row[i] = processor(row[i])
        return row


class Pending:
    """A statement sent (:meth:`CompiledSelect.send`) whose result is read later."""

    __slots__ = ("_statement", "_conn", "_cursor", "_args")

    def __init__(self, statement: CompiledSelect, conn: Connection, cursor: Any, args: Any):
        self._statement = statement
        self._conn = conn
        self._cursor = cursor
        self._args = args

    def rows(self) -> list[Sequence[Any]]:
        """The statement's rows (an UPDATE, INSERT or DELETE without RETURNING: one row of
        how many rows it changed)."""
        return self._statement._read(self._conn, self._cursor, self._args)


class CompiledWrite(CompiledSelect):
    """An UPDATE, INSERT or DELETE (no RETURNING: it selects no columns) compiled once for
    one dialect; :meth:`execute` returns how many rows it changed."""

    def execute(self, conn: Connection, **params: Any) -> int:
        return int(self.run(conn, **params)[0][0])


def execute_many(conn: Connection, sql: str, params: Sequence[Any]) -> None:
    """``sql`` (the driver's own SQL, parameters in its style) for each of ``params`` on
    the DB-API cursor: ``exec_driver_sql`` without SQLAlchemy's per-execution work (an
    execution context, events, a result), its errors raised as SQLAlchemy raises them."""
    driver = conn.connection.driver_connection
    assert driver is not None
    cursor = driver.cursor()
    try:
        cursor.executemany(sql, params)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise driver_error(conn, exc, sql, params, cursor) from exc
    finally:
        _close_quietly(cursor)


def driver_error(
    conn: Connection, exc: Exception, sql: str, args: Any, cursor: Any = None
) -> StatementError:
    """The SQLAlchemy error ``Connection.execute`` would raise for the driver's ``exc``
    (an IntegrityError for a constraint, and so on). As it would, a lost connection is
    marked so (and dropped from the pool) for callers that retry elsewhere."""
    dialect = conn.dialect
    driver = conn.connection.driver_connection
    lost = dialect.is_disconnect(exc, driver, cursor)  # type: ignore[arg-type]
    error = DBAPIError.instance(
        sql, args, exc, dialect.loaded_dbapi.Error, connection_invalidated=lost
    )
    if lost:
        if cursor is not None:
            _close_quietly(cursor)
        conn.invalidate(error)
    return error


def _close_quietly(cursor: Any) -> None:
    try:
        cursor.close()
    except Exception:  # noqa: BLE001 - a cursor of a lost connection may refuse to close
        pass
