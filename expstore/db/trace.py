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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["driver_statements"]


@contextmanager
def driver_statements(engine: Engine) -> Iterator[list[str]]:
    """The statements sent on ``engine``'s connections inside the block, in order, each
    with its white space folded."""
    seen: list[str] = []
    sqlite = engine.dialect.name == "sqlite"

    def note(sql: Any) -> None:
        text = " ".join(str(sql).split())
        if sqlite and seen and _head(text) == _head(seen[-1]):
            # sqlite3 traces each row of an executemany (its values written in), and a
            # DELETE again for each foreign key it cascades to
            return
        seen.append(text)

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
    try:
        yield seen
    finally:
        event.remove(engine, "connect", connected)
        event.remove(engine, "begin", begun)
        event.remove(engine, "commit", ended)
        event.remove(engine, "rollback", ended)
        engine.dispose()


def _head(text: str) -> str:
    return text.split(" VALUES", 1)[0]


def _counting_cursor(note: Any) -> Any:
    import psycopg

    class Counting(psycopg.Cursor):
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            note(query if isinstance(query, str) else repr(query))
            return super().execute(query, *args, **kwargs)

        def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            note(query if isinstance(query, str) else repr(query))
            return super().executemany(query, *args, **kwargs)

        def copy(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
            note(statement if isinstance(statement, str) else repr(statement))
            return super().copy(statement, *args, **kwargs)

    return Counting
