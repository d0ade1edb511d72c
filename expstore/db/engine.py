"""Connections: the SQLAlchemy engines of one storage, set up for expstore, and fork-aware.

SQLite runs in WAL mode with a busy timeout and explicit ``BEGIN`` (``BEGIN IMMEDIATE`` for
writes, so concurrent writers queue for the lock instead of failing with "database is
locked"); Postgres goes through psycopg 3. A process forked from the one that opened the
storage (a DataLoader worker, say) gets fresh connections on first use.
"""

from __future__ import annotations

import os
import select
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from .._optional import require
from .._retry import SQLITE_BUSY
from ..errors import ConnectionLostError, StorageError
from .compiled import driver_error
from .pipeline import Batched, batched, batches

__all__ = ["Connections", "Router", "create_sql_engine", "is_memory", "normalise_url"]


class Router(Protocol):
    """Where :meth:`Connections.read` sends a read: what the replicas' router
    (:class:`expstore.db.replicas.ReadRouter`) does for the connections it is given."""

    #: Whether a read after this process's write waits until the replica has it.
    read_your_writes: bool

    def connect(self) -> tuple[Connection, Any] | None:
        """A connection to the replica reads should use now (and which replica, for
        :meth:`lost`), or None for the primary."""

    def lost(self, replica: Any, exc: BaseException) -> ConnectionLostError:
        """The replica failed in the middle of a read: the error to raise."""

    def wrote(self, conn: Connection) -> None:
        """A write committed on ``conn`` (the primary): the next read waits for it."""

    def read_primary_once(self) -> None:
        """Send the next read to the primary."""

    def forked(self) -> None:
        """The process forked: forget connections made before."""

    def close(self) -> None:
        """Close the replicas' connections."""


_SQLITE_BUSY_MS = 60_000


def normalise_url(url: str | URL) -> URL:
    """``url`` parsed, with ``postgresql://`` meaning psycopg 3; StorageError if it is not
    a database URL."""
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


def is_memory(url: URL) -> bool:
    """Whether ``url`` is a private in-memory SQLite database."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_sql_engine(url: str | URL) -> Engine:
    """An Engine set up for expstore: SQLite in WAL mode with a busy timeout and explicit
    BEGIN (``BEGIN IMMEDIATE`` under ``execution_options(expstore_begin="IMMEDIATE")``);
    Postgres through psycopg 3."""
    parsed = normalise_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.get_driver_name() == "psycopg":
            require("psycopg", "a PostgreSQL URL")
        # No pre-ping (a round trip at every checkout): see _set_up_postgres's checkout.
        # A connection given back is reset by _set_up_postgres's own reset, which keeps
        # the statements expstore prepared.
        kwargs: dict[str, Any] = {"pool_reset_on_return": None}
    elif backend == "sqlite":
        kwargs = {"connect_args": {"check_same_thread": False, "timeout": _SQLITE_BUSY_MS / 1000}}
        if is_memory(parsed):
            kwargs["poolclass"] = StaticPool
        else:
            parsed = read_only_if_unwritable(parsed)
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
        _set_up_sqlite(engine, memory=is_memory(parsed), read_only=_read_only(parsed))
    else:
        _set_up_postgres(engine)
    return engine


#: Session settings for every Postgres connection, each with why.
_PG_SETTINGS = (
    # No JIT: expstore's statements are short, and once the planner's estimates grow (a
    # few hundred thousand rows) compiling each one costs more than running it (measured:
    # a 64-row FIFO write 45 ms -> 590 ms, the DELETE's JIT compile).
    "SET jit = off",
)


#: psycopg's prepare_threshold: executions of a statement before psycopg prepares it
#: unasked (never, in practice); ``prepare=True`` still prepares.
_NEVER_ON_ITS_OWN = 2**62


def _set_up_postgres(engine: Engine) -> None:
    error = engine.dialect.loaded_dbapi.Error
    pq = getattr(engine.dialect.loaded_dbapi, "pq", None)  # psycopg's libpq wrapper

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Nothing prepared on its own: psycopg prepares a statement run five times, after
        # which Postgres may switch to one generic plan for every buffer, whose sizes
        # differ by orders of magnitude (measured: the old FIFO DELETE's generic plan took
        # 0.7-1.8 s against 30 ms from its tenth run on, at 100k rows of 2M). Only the hot
        # statements compiled once (expstore.db.compiled), each a look-up by an index
        # whatever the buffer's size, ask to be prepared (``prepare=True``): planning them
        # cost more than running them (the state read: 0.6-0.7 ms to plan, 0.15 ms to
        # run). (A threshold of None would refuse those too.) Not preparing the rest keeps
        # the server's own cached plans (foreign key checks) as they are, where
        # plan_cache_mode = force_custom_plan re-planned every check (claims: 256 inserts
        # 4 -> 14 ms).
        if hasattr(dbapi_connection, "prepare_threshold"):
            dbapi_connection.prepare_threshold = _NEVER_ON_ITS_OWN
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        for setting in _PG_SETTINGS:
            try:
                cursor.execute(setting)
            except error:  # a server without the setting (an older or compatible one)
                pass
        cursor.close()
        dbapi_connection.autocommit = autocommit

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, record: Any, reset_state: Any) -> None:
        # What the pool's reset would do (a ROLLBACK of whatever the connection was left
        # in), sent past psycopg's rollback(), which also forgets every prepared statement
        # (and deallocates them, a round trip): the hot statements expstore prepares
        # would be planned again at every call. Postgres keeps prepared statements across
        # a rollback; psycopg forgets them in case a rolled-back DDL statement recreates
        # what they name, which expstore's running statements never do.
        if reset_state.terminate_only:
            return
        pgconn = getattr(dbapi_connection, "pgconn", None)
        if pgconn is None or pq is None:
            dbapi_connection.rollback()
            return
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            try:
                ended = pgconn.exec_(b"ROLLBACK").status == pq.ExecStatus.COMMAND_OK
            except Exception:  # noqa: BLE001 - a lost connection: rollback() says so, below
                ended = False
            if not ended:
                dbapi_connection.rollback()  # (raises on a lost connection: the pool drops it)
        if dbapi_connection.autocommit:
            # A read left it in autocommit (see Connections.read): a pooled connection's
            # next holder, a write, must get a transaction.
            dbapi_connection.autocommit = False

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # A connection idle in the pool has nothing to read unless the server ended it
        # (pg_terminate_backend, a restart: its goodbye and the socket's end wait there)
        # or sent something unasked (a notice). Only then is it pinged, a round trip;
        # one that fails is replaced by a new connection (SQLAlchemy's DisconnectionError
        # on checkout), as pool_pre_ping would, without a round trip on every checkout.
        if not _pending(dbapi_connection, error):
            return
        try:
            # In autocommit, as SQLAlchemy's own ping: a statement would otherwise open a
            # transaction that the caller, handed the connection, did not begin.
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            try:
                cursor = dbapi_connection.cursor()
                try:
                    cursor.execute(";")
                finally:
                    cursor.close()
            finally:
                dbapi_connection.autocommit = autocommit
        except error as exc:
            raise DisconnectionError(f"the connection was closed by the server: {exc}") from exc


def _pending(dbapi_connection: Any, error: type[Exception]) -> bool:
    """Whether the idle connection's socket has anything to read, or is gone (``error``:
    the driver's base error class)."""
    if getattr(dbapi_connection, "closed", False):
        return True
    try:
        fd = dbapi_connection.fileno()
        if hasattr(select, "poll"):  # (select.select refuses descriptors from 1024 on)
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(poller.poll(0))
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError, error):
        return True
    return bool(ready)


def read_only_if_unwritable(url: URL) -> URL:
    """A SQLite file URL, opened read-only when this process cannot write the file or its
    folder (a read-only mount, another user's file): reading works, a write says the
    database is read-only. In a read-only folder SQLite cannot make the files WAL mode
    needs, so the file is opened as immutable (nobody can change it there)."""
    path = url.database or ""
    if path.startswith("file:") or url.query.get("mode") or not os.path.exists(path):
        return url
    folder = os.path.dirname(os.path.abspath(path))
    if os.access(path, os.W_OK) and os.access(folder, os.W_OK):
        return url
    mode = "immutable=1" if not os.access(folder, os.W_OK) else "mode=ro"
    return url.set(database=f"file:{os.path.abspath(path)}?{mode}", query={"uri": "true"})


def _read_only(url: URL) -> bool:
    database = url.database or ""
    return database.startswith("file:") and ("mode=ro" in database or "immutable=1" in database)


#: Pages of write-ahead log (4 KiB each) after which a commit checkpoints it.
_SQLITE_CHECKPOINT_PAGES = 8192


def _set_up_sqlite(engine: Engine, *, memory: bool, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event (below) issue BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_MS}")
        if not memory and not read_only:
            _use_wal(cursor)
            cursor.execute("PRAGMA synchronous = NORMAL")
            # A checkpoint every 32 MiB of log, not SQLite's 4 MiB: a trainer's small
            # writes touch the same pages (the newest rows, the oldest evicted, their
            # indexes) over and over, and each checkpoint copies a page once however many
            # commits wrote it, then syncs twice (measured, 8-row capped writes: 0.8 ms a
            # commit on average against 1.2 ms, and a p99 of 1.9 ms against 11.6 ms).
            cursor.execute(f"PRAGMA wal_autocheckpoint = {_SQLITE_CHECKPOINT_PAGES}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return  # single(): each statement commits on its own
        sql = _BEGIN[options.get("expstore_begin", "")]
        # On the driver's connection: a write's BEGIN through exec_driver_sql cost as much
        # Python as the rest of a one-row write's statements together.
        driver = conn.connection.driver_connection
        try:
            driver.execute(sql)  # type: ignore[union-attr]
        except sqlite3.Error as exc:
            raise driver_error(conn, exc, sql, ()) from exc


def _end_autocommit(conn: Connection, driver: Any) -> None:
    """Give a read's Postgres connection its transactions back (see
    :meth:`Connections.read`). Where it cannot now (a statement cut off under it, a lost
    connection), it is dropped from the pool rather than given to a writer in autocommit,
    and whatever ended the read is what the caller sees."""
    try:
        if not driver.closed and driver.info.transaction_status == _IDLE:
            driver.autocommit = False
            return
    except Exception:  # noqa: BLE001, S110 - dropped below
        pass
    conn.invalidate()


#: psycopg's "idle, outside a transaction" (``pq.TransactionStatus.IDLE``).
_IDLE = 0

#: The BEGIN of each ``expstore_begin`` mode.
_BEGIN = {"": "BEGIN", "IMMEDIATE": "BEGIN IMMEDIATE"}


def _use_wal(cursor: Any) -> None:
    """Put a SQLite file in WAL mode (it stays so). Switching needs a moment alone with the
    file, which processes opening a new file together may not get at once: retry then
    (with the pauses of :data:`~expstore._retry.SQLITE_BUSY`) for as long as SQLite's own
    busy timeout."""
    waiting = SQLITE_BUSY.start(_SQLITE_BUSY_MS / 1000)
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or not waiting.sleep():
                raise


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite failed because another connection held the file (busy or locked).
    Python 3.10 does not say: its errors there are taken as busy until the deadline."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


#: SQLSTATEs of a server ending the session: admin_shutdown (pg_terminate_backend),
#: crash_shutdown, cannot_connect_now.
_ENDED = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(exc: DBAPIError) -> bool:
    """Whether a driver error means the connection went away (rather than the statement
    failing): SQLAlchemy saw a disconnect, or the server ended the session."""
    return bool(exc.connection_invalidated) or getattr(exc.orig, "sqlstate", None) in _ENDED


class Connections:
    """The read and write engines of one storage.

    ``read()`` and ``write()`` give a connection (``write()`` inside a transaction that
    takes the write lock first on SQLite). An in-memory database is one connection shared
    by every thread, which take turns on it. In a forked process the pooled connections of
    the parent are dropped (never closed, which would break them for the parent) and
    ``on_fork`` callbacks run, so caches of the parent's state can be forgotten.
    """

    def __init__(self, url: URL) -> None:
        self.url = url
        #: Where reads go when the storage has read replicas (see
        #: :mod:`expstore.db.replicas`); None: every read on the primary.
        self.router: Router | None = None
        self.memory = is_memory(url)
        self._postgres = url.get_backend_name() == "postgresql"
        self._lock: Any = threading.RLock() if self.memory else nullcontext()
        self._pid = os.getpid()
        self.engine = create_sql_engine(url)
        self._write_engine = self.engine.execution_options(expstore_begin="IMMEDIATE")
        self.on_fork: list[Callable[[], None]] = []
        self._held = threading.local()

    @contextmanager
    def _holding(self, conn: Connection) -> Iterator[Connection]:
        """``conn``, known to :meth:`held` in this thread until the block ends."""
        stack = self._held.__dict__.setdefault("stack", [])
        stack.append(conn)
        try:
            yield conn
        finally:
            stack.pop()

    def held(self) -> Connection | None:
        """The connection this thread reads or writes through now (the innermost), if any:
        a small read a statement needs can share it (and its snapshot)."""
        stack = self._held.__dict__.get("stack")
        return stack[-1] if stack else None

    @property
    def write_engine(self) -> Engine:
        """The engine whose transactions take the write lock first (SQLite)."""
        return self._engines()[1]

    def _engines(self) -> tuple[Engine, Engine]:
        if os.getpid() != self._pid:  # forked (e.g. a DataLoader worker): fresh connections
            if self.memory:
                raise StorageError(
                    "an in-memory SQLite buffer (sqlite://) lives in the process that made it "
                    "and cannot be used from a forked process (a DataLoader worker, say); use "
                    "a file (sqlite:///path.db) or Postgres"
                )
            self._pid = os.getpid()
            self.engine.dispose(close=False)
            self._write_engine = self.engine.execution_options(expstore_begin="IMMEDIATE")
            if self.router is not None:
                self.router.forked()
            for forget in self.on_fork:
                forget()
        return self.engine, self._write_engine

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection for reading: to a replica when the router has one up, else to the
        primary."""
        engine = self._engines()[0]  # first: in a forked process, drop inherited connections
        routed = None if self.router is None else self.router.connect()
        if routed is None:
            try:
                with self._lock, engine.connect() as conn:
                    # Postgres: each statement its own transaction, as READ COMMITTED
                    # gives each its own snapshot anyway, with no BEGIN and no ROLLBACK
                    # round trips (a one-statement read: one round trip, not three);
                    # dialect.snapshot() makes it one REPEATABLE READ transaction.
                    driver = conn.connection.driver_connection if self._postgres else None
                    if driver is not None:
                        driver.autocommit = True
                    stack = self._held.__dict__.setdefault("stack", [])
                    stack.append(conn)  # (_holding inlined, as in write)
                    try:
                        yield conn
                    finally:
                        stack.pop()
                        if driver is not None and driver.autocommit:
                            _end_autocommit(conn, driver)
            except DBAPIError as exc:
                if connection_lost(exc):  # cut under the read (e.g. a server restart)
                    raise ConnectionLostError(
                        f"the connection to {self.url.render_as_string(hide_password=True)} "
                        "was lost in the middle of a read; nothing was changed. Retry the call"
                    ) from exc
                raise
            return
        conn, replica = routed
        assert self.router is not None
        try:
            with conn, self._holding(conn):
                yield conn
        except DBAPIError as exc:
            if connection_lost(exc):  # the replica went away
                raise self.router.lost(replica, exc) from exc
            raise

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """A connection whose every statement commits on its own (no BEGIN, no COMMIT
        round trips): for one-statement writes such as a counter."""
        with self._lock, self._engines()[0].connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def write(self) -> Iterator[Connection]:
        router = self.router
        if router is None or not router.read_your_writes:
            # (engine.begin() and _holding inlined: a one-row write's own Python counts)
            with self._lock, self._engines()[1].connect() as conn, conn.begin():
                stack = self._held.__dict__.setdefault("stack", [])
                stack.append(conn)
                try:
                    yield conn
                finally:
                    stack.pop()
            return
        with self._lock, self._engines()[1].connect() as conn:
            with conn.begin(), self._holding(conn):
                yield conn
            try:
                router.wrote(conn)  # committed: the LSN the next replica read waits for
            except DBAPIError:
                # The write committed; its LSN could not be read. The next read goes to
                # the primary instead, which has it.
                router.read_primary_once()

    @property
    def batches_writes(self) -> bool:
        """Whether :meth:`batched_write` may serve a write (Postgres with pipeline mode,
        no replica that must see this process's writes)."""
        found = self.__dict__.get("_batches")
        if found is None:
            found = self._batches = self._postgres and batches(self.engine.dialect)
        return bool(found) and (self.router is None or not self.router.read_your_writes)

    @contextmanager
    def batched_write(self) -> Iterator[Batched]:
        """A write transaction sent a batch at a time (see :mod:`expstore.db.pipeline`):
        its BEGIN goes with its first statements, its last statements with its COMMIT.
        Committed when the block ends, rolled back if it raises; this thread's connection
        (:meth:`held`) meanwhile, as :meth:`write`'s is."""
        with self._lock, self._engines()[1].connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            with self._holding(conn), batched(conn) as tx:
                yield tx

    def close(self) -> None:
        if self.router is not None:
            self.router.close()
        self.engine.dispose()
