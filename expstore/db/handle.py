"""What every role of a SQL storage shares: which buffer, its connections, its dialect, the
statements compiled for it, and the one place where driver errors become StorageError."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from itertools import islice
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar, cast

from sqlalchemy import BigInteger, Connection, Select, Table, bindparam, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from .._retry import CONFLICT
from ..errors import StorageError
from ..query import QueryCondition, to_sql
from ..query.conditions import Changed, as_condition, has_changed
from .compiled import CompiledSelect, CompiledWrite
from .dialects import Dialect, dialect_for
from .engine import Connections
from .schema import rows, tracked_paths
from .tuning import Tuning

__all__ = ["BufferHandle", "TrackedPath", "flag_bit", "read_tracked", "retried"]

_T = TypeVar("_T")
PartT = TypeVar("PartT")


class TrackedPath(NamedTuple):
    """A path a buffer tracks (see :mod:`expstore.tracking.changes`): its id in
    ``expstore_changes`` and its slot in the rows' ``change_flags``."""

    id: int
    slot: int


def flag_bit(slot: int, towards_next: bool) -> int:
    """The bit of ``change_flags`` that says a row's value at the path of ``slot`` equals
    the previous step's (or with ``towards_next``, the next step's)."""
    return 1 << (2 * slot + towards_next)


def read_tracked(conn: Connection, buffer_id: int) -> dict[str, TrackedPath]:
    """The buffer's tracked paths (canonical spelling), their ids and slots, read on
    ``conn``."""
    stmt = select(tracked_paths.c.path, tracked_paths.c.id, tracked_paths.c.slot).where(
        tracked_paths.c.buffer_id == buffer_id
    )
    return {str(path): TrackedPath(int(i), int(slot)) for path, i, slot in conn.execute(stmt)}


#: SQLSTATEs of a transaction the server rolled back for a conflict with another.
_CONFLICTS = frozenset({"40001", "40P01"})


def retried(write: Callable[[], _T], also: frozenset[str] = frozenset()) -> _T:
    """``write()``, called again (with the pauses of :data:`~expstore._retry.CONFLICT`)
    when the server rolled its transaction back for a serialisation failure or a deadlock,
    or with one of the SQLSTATEs in ``also``; any other failure is raised."""
    waiting = CONFLICT.start()
    while True:
        try:
            return write()
        except StorageError as exc:
            state = getattr(getattr(exc.__cause__, "orig", None), "sqlstate", None)
            if not (state in _CONFLICTS or state in also) or not waiting.sleep():
                raise


#: Statements a handle keeps compiled before it starts afresh.
_STATEMENTS = 64


class BufferHandle:
    """One named buffer of one database, as the storage's parts see it.

    ``buffer_id`` is set when the storage opens (see :mod:`expstore.lifecycle.registry`);
    ``tuning`` holds the storage's knobs (see :class:`~expstore.db.tuning.Tuning`).
    """

    def __init__(self, url: URL, name: str, tuning: Tuning | None = None) -> None:
        self.url = url
        self.name = name
        self.tuning = Tuning() if tuning is None else tuning
        self.connections = Connections(url)
        self.dialect: Dialect = dialect_for(self.connections.engine.dialect.name)
        self.buffer_id = 0
        #: The buffer's ``created_at`` as last read (at open, then at each draw's state
        #: read): another value when its database was made anew under this handle.
        self.created_at: float | None = None
        self._statements: dict[tuple[Any, ...], CompiledSelect] = {}
        self._writes: dict[str, CompiledWrite] = {}
        #: Choices made once per statement from the database's plan (see key_space).
        self.plans: dict[tuple[Any, ...], bool] = {}
        #: The keys of rows read lately, by id (see remember_keys).
        self.recent_keys: dict[str, int] = {}
        self._recent_lock = threading.Lock()
        #: How to forget what the storage's parts cache of the buffer: run in a forked
        #: child, and when the database turns out to have been made anew.
        self.caches: list[Callable[[], None]] = []
        #: The buffer's tracked paths, their ids and slots, as last read (see
        #: tracked_paths); the statements compiled are dropped whenever they change.
        self.tracked: dict[str, TrackedPath] = {}
        #: What concepts above the storage keep per handle (see :meth:`part`).
        self._parts: dict[Callable[[BufferHandle], Any], Any] = {}
        self._parts_lock = threading.Lock()

    def part(self, kind: Callable[[BufferHandle], PartT]) -> PartT:
        """The one ``kind(self)`` this handle keeps, made on first use: what a concept above
        the storage keeps per buffer handle (the claim queue, the ready-group indexes of
        :mod:`expstore.claims`), so the storage need not know it. A part that caches
        what it reads adds its ``clear`` to :attr:`caches` when made."""
        part = self._parts.get(kind)
        if part is None:
            with self._parts_lock:  # threads share a handle: one part each
                part = self._parts.get(kind)
                if part is None:
                    part = self._parts[kind] = kind(self)
        return cast(PartT, part)

    def forget_caches(self) -> None:
        """Forget everything cached of the buffer (see :attr:`caches`)."""
        for forget in self.caches:
            forget()

    def check_row(self, name: str | None, created_at: float | None) -> None:
        """Take the ``name`` and ``created_at`` just read from the buffer's row (None: no
        row): StorageError if it no longer is this handle's buffer (:meth:`recreated`);
        another ``created_at`` than the handle knows means the database was made anew
        under it (dropped and created again, restored), where keys and counters may
        repeat, so nothing cached of the buffer holds."""
        if name != self.name:
            raise self.recreated(name)
        if created_at != self.created_at:
            self.forget_caches()
            self.created_at = created_at

    def remember_keys(self, fetched: Sequence[Sequence[Any]], at_id: int) -> None:
        """Keep the keys (first) and ids (at ``at_id``) of rows just fetched, so that a
        call by id soon after finds them by key (see :mod:`expstore.db.row_ids`); the
        last ``tuning.recent_keys``."""
        keep = self.tuning.recent_keys
        with self._recent_lock:  # threads share a storage
            recent = self.recent_keys
            for r in fetched[-keep:]:  # a row read again moves to the newest end
                recent.pop(r[at_id], None)
                recent[r[at_id]] = r[0]
            self._trim_recent(keep)

    def remember_pairs(self, pairs: Sequence[tuple[int, str]]) -> None:
        """:meth:`remember_keys` of ``(key, id)`` pairs served without a read (from a row
        cache): kept without moving ids already kept to the newest end (one C-speed
        update instead of a pop and a set per row)."""
        keep = self.tuning.recent_keys
        with self._recent_lock:
            recent = self.recent_keys
            tail = pairs[-keep:]
            recent.update(zip(map(itemgetter(1), tail), map(itemgetter(0), tail), strict=True))
            self._trim_recent(keep)

    def _trim_recent(self, keep: int) -> None:
        """Past ``keep`` keys remembered, forget the oldest down to half of it (the caller
        holds the lock)."""
        recent = self.recent_keys
        if len(recent) > keep:
            for stale in list(islice(recent, len(recent) - keep // 2)):
                del recent[stale]

    def remembered_keys(self, ids: Sequence[str]) -> dict[str, int]:
        """The keys remembered for those of ``ids`` read lately."""
        with self._recent_lock:
            recent = self.recent_keys
            return {i: recent[i] for i in ids if i in recent}

    def read(self) -> AbstractContextManager[Connection]:
        return self.connections.read()

    def write(self) -> AbstractContextManager[Connection]:
        return self.connections.write()

    def single(self) -> AbstractContextManager[Connection]:
        return self.connections.single()

    def recreated(self, found: str | None) -> StorageError:
        """The error for a buffer row that no longer is this handle's buffer (``found``:
        the name the row holds now, None when it is gone)."""
        now = "is gone" if found is None else f"now holds buffer {found!r}"
        return StorageError(
            f"buffer {self.name!r} of {self.url.render_as_string()} is not where this handle "
            f"found it when it opened (its row {now}): the database was made anew or "
            "restored since; open the buffer again (a new ReplayBuffer or storage) to use "
            "it as it is now"
        )

    def errors(self, action: str) -> AbstractContextManager[None]:
        """Turns driver errors raised inside into StorageError saying what to do."""
        return _TranslateErrors(self, action)

    def where(self, query_condition: QueryCondition) -> list[ColumnElement[bool]]:
        """The WHERE clauses for this buffer's rows matching ``query_condition``."""
        return [rows.c.buffer_id == self.buffer_id, *self.matching(query_condition)]

    def matching(self, query_condition: QueryCondition) -> list[ColumnElement[bool]]:
        """The WHERE clauses of ``query_condition`` alone (none for None), for rows already
        known to be the buffer's. ``changed()`` on a path the buffer tracks tests the path's
        bit of the rows' ``change_flags`` (the tracked paths are read again for each
        condition that has one)."""
        condition = as_condition(query_condition)
        flags = None
        if has_changed(condition):
            self.tracked_paths()
            flags = self.change_flags
        compiled = to_sql(condition, rows, self.dialect.name, flags)
        return [] if compiled is None else [compiled]

    def tracked_paths(self) -> dict[str, TrackedPath]:
        """The buffer's tracked paths (see :mod:`expstore.tracking.changes`), their ids and
        slots, read now: on the connection the thread is using, if any (the statement's own
        snapshot), else on one of its own. An in-memory database has no other handle:
        what this one tracked."""
        if not self.connections.memory:
            held = self.connections.held()
            with self.errors("read the tracked paths"):
                if held is not None:
                    found = read_tracked(held, self.buffer_id)
                else:
                    with self.read() as conn:
                        found = read_tracked(conn, self.buffer_id)
            self.note_tracked(found)
        return self.tracked

    def note_tracked(self, found: dict[str, TrackedPath]) -> None:
        """Take the tracked paths just read: statements compiled with others are dropped."""
        if found != self.tracked:
            self.tracked = found
            self._statements.clear()
            self.plans.clear()

    def change_flags(self, c: Changed, table: Table) -> ColumnElement[bool] | None:
        """``changed()`` on a tracked path: the test of the path's bit of the rows'
        ``change_flags`` (set: the same as the neighbour), which the ``(buffer_id,
        change_flags)`` index answers; None for a path not tracked (see
        :data:`~expstore.query.compiler.ChangeFlags`)."""
        found = self.tracked.get(c.target.canonical)
        if found is None:
            return None
        bit = flag_bit(found.slot, c.towards == "next")
        masked = table.c.change_flags.op("&")(bindparam(None, bit, type_=BigInteger()))
        zero = bindparam(None, 0, type_=BigInteger())
        return masked == zero if c.changed else masked != zero

    def statement(self, key: tuple[Any, ...], build: Callable[[], Select[Any]]) -> CompiledSelect:
        """The statement ``build()`` makes, compiled once for this database and kept."""
        compiled = self._statements.get(key)
        if compiled is None:
            if len(self._statements) >= _STATEMENTS:
                self._statements.clear()
            compiled = CompiledSelect(build(), self.connections.engine.dialect)
            self._statements[key] = compiled
        return compiled

    def write_statement(self, key: str, build: Callable[[], Any]) -> CompiledWrite:
        """The UPDATE/INSERT/DELETE ``build()`` makes, compiled once for this database
        and kept for the handle's life (bound parameters only: nothing per buffer)."""
        compiled = self._writes.get(key)
        if compiled is None:
            compiled = self._writes[key] = CompiledWrite(build(), self.connections.engine.dialect)
        return compiled

    def shown_url(self) -> str:
        return self.url.render_as_string(hide_password=True)


class _TranslateErrors:
    """Turns driver errors into StorageError with what to do; lets expstore errors through."""

    def __init__(self, handle: BufferHandle, action: str) -> None:
        self.handle = handle
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, DBAPIError):
            return
        reason = str(exc.orig).strip() or str(exc)
        advice = advice_for(exc, reason)
        raise StorageError(
            f"could not {self.action} in {self.handle.shown_url()} (buffer "
            f"{self.handle.name!r}): {reason}. Nothing was changed; {advice}"
        ) from exc


class _Cause(NamedTuple):
    """A kind of database failure: its SQLSTATE codes or classes (Postgres), the words the
    database uses for it (SQLite, drivers), and what to do about it."""

    states: tuple[str, ...]
    words: tuple[str, ...]
    advice: str


#: Causes in order; the first that matches gives the advice.
_CAUSES = (
    _Cause(
        ("55P03",),
        ("database is locked", "database table is locked", "lock timeout"),
        "another process held the database's lock longer than the wait allows; retry, and "
        "keep other processes' transactions short",
    ),
    _Cause(
        ("25006", "42501"),
        ("readonly database", "read-only", "permission denied"),
        "the database (or its file or folder) is read-only here: write to a writable path "
        "or server (a primary, not a standby), or only read",
    ),
    _Cause(("53100",), ("disk is full", "no space left"), "the disk is full: free space and retry"),
    _Cause(
        ("54",),
        ("too large", "too many sql variables", "too many terms"),
        "the statement is larger than the database accepts: split the condition or the "
        "batch into smaller ones",
    ),
    _Cause(
        ("40001", "40P01"),
        ("could not serialize", "deadlock detected"),
        "the database aborted the transaction to settle a conflict with another one; retry",
    ),
    _Cause(
        ("57014",),
        ("canceling statement",),
        "the statement ran past the server's statement timeout; raise it or narrow the query",
    ),
    _Cause(
        ("08", "57P01", "57P02", "57P03"),
        (
            "server closed the connection",
            "connection refused",
            "could not connect",
            "connection is closed",
            "terminating connection",
        ),
        "the connection to the database was lost or refused: check that the server is up "
        "and reachable, then retry",
    ),
)


def advice_for(exc: DBAPIError, reason: str) -> str:
    """What to do about a driver error, by its cause (SQLSTATE first, then its words)."""
    state = str(getattr(exc.orig, "sqlstate", None) or "")
    said = reason.lower()
    for cause in _CAUSES:
        if any(state.startswith(s) for s in cause.states if state) or any(
            w in said for w in cause.words
        ):
            return cause.advice
    if isinstance(exc, DataError | IntegrityError):
        return "the database refused the data; fix the value it names"
    return "check that the database is reachable and writable"
