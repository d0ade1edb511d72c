"""Every statement a buffer's calls send, as the driver sends them: for tests that prove a
feature costs nothing where it is unused, and for benchmarks that print statements per
call.

SQLAlchemy's ``before_cursor_execute`` misses what runs on the driver's own cursor (the
compiled hot statements, Postgres's INSERT and COPY), so this watches the driver:
SQLite's trace callback (every statement, ``BEGIN``/``COMMIT`` included; an
``executemany`` is one entry however many rows it binds, and so is a DELETE whose foreign
keys cascade) and, on Postgres, a psycopg cursor class that notes each ``execute``,
``executemany`` and ``copy``, plus ``BEGIN`` and ``COMMIT``/``ROLLBACK``, which psycopg
sends as statements of their own. Connections made while tracing are traced; those the
pool held before are closed first.

Round trips (:attr:`Statements.round_trips`): on SQLite none; on Postgres each statement
is one, except statements sent in a pipeline (:mod:`expstore.db.pipeline`), which count
nothing themselves: each time psycopg waits for a pipeline's results (a sync, the end of
the pipeline, a fetch that flushes it) is one. While tracing, psycopg's pipelines are
watched in every thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["Statements", "driver_statements"]


class Statements(list[str]):
    """The statements a trace saw, in order, and the round trips they took."""

    def __init__(self, trips: bool) -> None:
        super().__init__()
        self._trips = trips
        #: Round trips up to each statement, that one's included.
        self._upto: list[int] = []
        self._pending = 0

    def add(self, text: str, pipelined: bool = False) -> None:
        self.append(text)
        before = self._upto[-1] if self._upto else 0
        self._upto.append(before + self._pending + (self._trips and not pipelined))
        self._pending = 0

    def waited(self) -> None:
        """A pipeline's results waited for: one round trip, the last statement's (those
        sent in the pipeline are before it)."""
        if not self._trips:
            return
        if self._upto:
            self._upto[-1] += 1
        else:
            self._pending += 1

    @property
    def round_trips(self) -> int:
        """Round trips so far (Postgres; SQLite: 0)."""
        return (self._upto[-1] if self._upto else 0) + self._pending

    def round_trips_since(self, start: int) -> int:
        """Round trips after the first ``start`` statements."""
        return self.round_trips - (self._upto[start - 1] if start else 0)


@contextmanager
def driver_statements(engine: Engine) -> Iterator[Statements]:
    """The statements sent on ``engine``'s connections inside the block, in order, each
    with its white space folded (and the round trips they took)."""
    sqlite = engine.dialect.name == "sqlite"
    seen = Statements(not sqlite)

    def note(sql: Any, pipelined: bool = False) -> None:
        text = " ".join(str(sql).split())
        if sqlite and seen and _head(text) == _head(seen[-1]):
            # sqlite3 traces each row of an executemany (its values written in), and a
            # DELETE again for each foreign key it cascades to
            return
        seen.add(text, pipelined)

    def connected(dbapi_connection: Any, record: Any) -> None:
        if sqlite:
            dbapi_connection.set_trace_callback(note)
        else:
            dbapi_connection.cursor_factory = _counting_cursor(note)
            dbapi_connection.add_notice_handler(lambda _: None)

    def begun(conn: Any) -> None:
        if not sqlite:
            note("BEGIN")

    def ended(conn: Any) -> None:
        if not sqlite:
            note("COMMIT")

    engine.dispose()
    event.listen(engine, "connect", connected)
    event.listen(engine, "begin", begun)
    event.listen(engine, "commit", ended)
    event.listen(engine, "rollback", ended)
    undo = None if sqlite else _watch_pipelines(seen.waited)
    try:
        yield seen
    finally:
        if undo is not None:
            undo()
        event.remove(engine, "connect", connected)
        event.remove(engine, "begin", begun)
        event.remove(engine, "commit", ended)
        event.remove(engine, "rollback", ended)
        engine.dispose()


def _watch_pipelines(waited: Any) -> Any:
    """Note each wait for a pipeline's results (psycopg's sync, the end of a pipeline, a
    fetch that flushes one) with ``waited()``; returns what undoes it."""
    from psycopg._pipeline_base import BasePipeline

    sync, end, fetch = BasePipeline._sync_gen, BasePipeline._exit_gen, BasePipeline._fetch_gen

    def synced(self: Any) -> Any:
        waited()
        return (yield from sync(self))

    ending: set[int] = set()

    def ended(self: Any) -> Any:
        waited()
        ending.add(id(self))  # (its own fetch of the results is this wait)
        try:
            return (yield from end(self))
        finally:
            ending.discard(id(self))

    def fetched(self: Any, *, flush: bool) -> Any:
        if flush and self.result_queue and id(self) not in ending:
            waited()
        return (yield from fetch(self, flush=flush))

    BasePipeline._sync_gen = synced  # type: ignore[method-assign]
    BasePipeline._exit_gen = ended  # type: ignore[method-assign]
    BasePipeline._fetch_gen = fetched  # type: ignore[method-assign]

    def undo() -> None:
        BasePipeline._sync_gen = sync  # type: ignore[method-assign]
        BasePipeline._exit_gen = end  # type: ignore[method-assign]
        BasePipeline._fetch_gen = fetch  # type: ignore[method-assign]

    return undo


def _head(text: str) -> str:
    return text.split(" VALUES", 1)[0]


def _counting_cursor(note: Any) -> Any:
    import psycopg

    class Counting(psycopg.Cursor):
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            note(query if isinstance(query, str) else repr(query), self._pipelined())
            return super().execute(query, *args, **kwargs)

        def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            # psycopg pipelines an executemany: its wait is counted as a pipeline's
            note(query if isinstance(query, str) else repr(query), True)
            return super().executemany(query, *args, **kwargs)

        def _pipelined(self) -> bool:
            return self.connection._pipeline is not None

        def copy(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
            note(statement if isinstance(statement, str) else repr(statement))
            return super().copy(statement, *args, **kwargs)

    return Counting
