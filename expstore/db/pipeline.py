"""A transaction whose statements go to the server a batch at a time (psycopg's pipeline
mode, Postgres): the statements of a batch and their results travel in one round trip.

psycopg sends a transaction's ``BEGIN`` as a round trip of its own, and ``COMMIT`` as
another, even in pipeline mode. A :class:`Batched` transaction runs instead on a
connection in autocommit mode and sends ``BEGIN`` and ``COMMIT`` itself, as statements of
its batches: ``BEGIN`` with the first batch (:meth:`Batched.batch`), ``COMMIT`` with the
statements left for the commit (:meth:`Batched.at_commit`), whose results nobody reads
before it. What runs between batches runs as in any transaction, one round trip per
statement.

Within the documented limits of pipeline mode: statements of one batch do not read each
other's results (each one still sees what the statements before it wrote: one snapshot
per statement, READ COMMITTED), and a COPY is never sent in a batch. A statement that
fails aborts the rest of its batch; the error is raised (as SQLAlchemy raises the
driver's errors) when the batch ends, and the transaction is rolled back.

Only where the driver has pipeline mode (:func:`batches`); elsewhere callers run the
transaction as they always did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect

from .compiled import Pending, driver_error

__all__ = ["Batched", "batches", "batched"]


def batches(dialect: Dialect) -> bool:
    """Whether transactions on a database of SQLAlchemy's ``dialect`` may be
    :func:`batched` (psycopg 3 with a libpq that has pipeline mode)."""
    if dialect.driver != "psycopg":
        return False
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


class Batched:
    """One transaction sent a batch at a time (see the module)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        driver = conn.connection.driver_connection
        assert driver is not None
        self._driver: Any = driver
        self._begun = False
        self._done = False
        self._later: list[Callable[[], None]] = []

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Statements sent inside (on the driver's cursor: :meth:`CompiledSelect.send
        <expstore.db.compiled.CompiledSelect.send>`) go to the server together when the
        block ends, the transaction's BEGIN before the first batch's; read their results
        after the block."""
        with self._pipeline():
            if not self._begun:
                self._begun = True
                self._send("BEGIN")
            yield

    def at_commit(self, send: Callable[[], Any]) -> None:
        """Send what ``send()`` sends (statements whose results nobody reads) with the
        COMMIT, in its round trip (what it returns: a :class:`~expstore.db.compiled.Pending`,
        a list of them, or anything else; their rows are read after the commit, closing
        their cursors)."""
        self._later.append(send)

    def commit(self) -> None:
        """The statements left for the commit, then COMMIT: one round trip."""
        with self._pipeline():
            if not self._begun:
                self._begun = True
                self._send("BEGIN")
            later, self._later = self._later, []
            sent = [send() for send in later]
            self._send("COMMIT")
        self._done = True
        for got in sent:
            for pending in got if isinstance(got, list) else [got]:
                if isinstance(pending, Pending):
                    pending.rows()  # (arrived with the commit: no round trip)

    @contextmanager
    def _pipeline(self) -> Iterator[None]:
        driver = self._driver
        try:
            with driver.pipeline():
                yield
        except self.conn.dialect.loaded_dbapi.Error as exc:  # as SQLAlchemy raises them
            raise driver_error(self.conn, exc, "(a batch of statements)", None) from exc

    def _send(self, sql: str) -> None:
        with self._driver.cursor() as cursor:
            cursor.execute(sql)


@contextmanager
def batched(conn: Connection) -> Iterator[Batched]:
    """A :class:`Batched` transaction on ``conn`` (a connection in autocommit mode whose
    database :func:`batches`): committed when the block ends, rolled back if it raises."""
    tx = Batched(conn)
    try:
        yield tx
        if not tx._done:
            tx.commit()
    except BaseException:
        if tx._begun:
            _roll_back(tx)
        raise


def _roll_back(tx: Batched) -> None:
    """ROLLBACK after a failure (a COMMIT that failed included; on a connection that is
    gone, nothing: it is dropped)."""
    try:
        if not tx.conn.invalidated:
            tx._send("ROLLBACK")
    except Exception:  # noqa: BLE001 - the failure raised already says what went wrong
        try:
            tx.conn.invalidate()
        except Exception:  # noqa: BLE001
            pass
