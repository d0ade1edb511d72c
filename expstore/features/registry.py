"""The buffer registry: each named buffer's row in ``expstore_buffers``, with its retention
(capacity and eviction policy, the same for every handle and process that writes) and the
counters readers use to tell whether their cached key indexes are still current.

Every change to a buffer takes its row first (:func:`lock_buffer`), so changes take turns
in one order: on Postgres by ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already lets one
writer in at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import BigInteger, Connection, Integer, bindparam, delete, select, update
from sqlalchemy.sql.elements import ColumnElement

from .._args import check_int
from ..db.handle import BufferHandle
from ..db.schema import buffers, oldest_first, rows
from ..errors import InvalidArgumentError, RetentionConflictError
from . import arrays, changes, tombstones  # noqa: F401 (their row features register)
from .eviction import EVERY_WRITE_POLICIES, EVICTION_POLICIES, OLDEST_FIRST_POLICIES, evict
from .lifecycle import BufferState, RemoveContext, Removed, RowFeature, WriteContext, read_state
from .lifecycle import register as register_feature
from .stats import task_stats  # noqa: F401 (its row feature registers)

__all__ = [
    "BufferInfo",
    "list_buffers",
    "bump_version",
    "check_retention",
    "count_inserted",
    "count_removed",
    "evict_beyond",
    "lock_buffer",
    "open_buffer",
    "Removed",
    "Retention",
    "remove",
    "set_retention",
    "settle_retention",
]


def check_retention(capacity: Any, eviction: Any) -> None:
    """ValueError unless ``capacity`` is None or an int >= 1 and ``eviction`` None or a
    known policy."""
    check_int("capacity", capacity, minimum=1, optional=True)
    if eviction is not None and eviction not in EVICTION_POLICIES:
        raise InvalidArgumentError(
            f"eviction must be one of {sorted(EVICTION_POLICIES)}, got {eviction!r}"
        )


def open_buffer(handle: BufferHandle) -> int:
    """The id of the handle's buffer, adding its row if it has none yet (its
    ``created_at`` goes to the handle)."""
    find = select(buffers.c.id, buffers.c.created_at).where(buffers.c.name == handle.name)
    with handle.read() as conn:
        found = conn.execute(find).first()
    if found is None:
        with handle.write() as conn:
            if conn.execute(find).first() is None:
                handle.dialect.create_buffer(conn, handle.name)
            found = conn.execute(find).one()
    handle.created_at = float(found[1])
    return int(found[0])


def settle_retention(
    handle: BufferHandle, capacity: int | None, eviction: str | None
) -> tuple[int | None, str]:
    """The buffer's retention, set first if it has none and this handle asks for one;
    ValueError if the handle asks for another than the buffer keeps."""
    where = buffers.c.id == handle.buffer_id
    kept = select(buffers.c.capacity, buffers.c.eviction).where(where)
    with handle.read() as conn:
        stored = conn.execute(kept).one()
    if eviction == "stale" and stored[1] != "stale":
        raise InvalidArgumentError(
            'eviction="stale" needs its max_staleness; set it for every writer with '
            'buffer.set_retention(capacity, "stale", max_staleness=k), then open handles '
            "without eviction="
        )
    if (capacity, eviction) != (None, None) and tuple(stored) == (None, None):
        with handle.write() as conn:  # only if nobody set it meanwhile
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
        raise RetentionConflictError(
            f"buffer {handle.name!r} keeps capacity={stored_capacity!r} with "
            f"eviction={stored_eviction!r}, which every writer uses; this handle asked for "
            f"{asked}. Open it without capacity=/eviction= to use the buffer's, or change "
            "it for every writer with buffer.set_retention(capacity, eviction)"
        )
    return (None if stored_capacity is None else int(stored_capacity)), stored_eviction


def lock_buffer(handle: BufferHandle, conn: Connection, *columns: Any) -> tuple[Any, ...]:
    """``columns`` of the buffer's row, locked until the transaction ends (StorageError if
    the row no longer is the handle's buffer: see :meth:`BufferHandle.recreated`)."""
    return buffer_row(handle, conn, *columns, locked=True)


def buffer_row(
    handle: BufferHandle,
    conn: Connection,
    *columns: Any,
    locked: bool = False,
    params: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """``columns`` of the buffer's row (``locked``: until the transaction ends; ``params``:
    values of parameters they bind); StorageError if the row no longer is the handle's
    buffer (the database made anew since it opened)."""
    stmt = select(buffers.c.name, buffers.c.created_at, *columns)
    stmt = stmt.where(buffers.c.id == handle.buffer_id)
    found = conn.execute(handle.dialect.locked(stmt) if locked else stmt, params or {}).first()
    if found is None:
        raise handle.recreated(None)
    handle.check_row(found[0], float(found[1]))
    return tuple(found[2:])


def bump_version(handle: BufferHandle, conn: Connection, counter: Any = buffers.c.version) -> int:
    """Mark a change other than an insert (``counter``: ``version``, or
    ``priority_version`` for a priority update); returns its new value (the row is locked
    until the transaction ends, so it is exact)."""
    this = buffers.c.id == handle.buffer_id
    conn.execute(update(buffers).where(this).values({counter: counter + 1}))
    return int(conn.execute(select(counter).where(this)).scalar_one())


def count_inserted(handle: BufferHandle, conn: Connection, n: int, removed: int = 0) -> None:
    """Count ``n`` rows stored into the buffer, and when, and ``removed`` rows deleted
    (the caller holds its row)."""

    def build() -> Any:
        added = bindparam("n", type_=BigInteger)
        gone = bindparam("removed", type_=BigInteger)
        return (
            update(buffers)
            .where(buffers.c.id == bindparam("buffer_id", type_=Integer))
            .values(
                inserted=buffers.c.inserted + added,
                row_count=buffers.c.row_count + added - gone,
                inserted_at=handle.dialect.now(),
            )
        )

    handle.write_statement("count inserted", build).execute(
        conn, buffer_id=handle.buffer_id, n=n, removed=removed
    )


def count_removed(handle: BufferHandle, conn: Connection, n: int) -> None:
    """Count ``n`` rows deleted from the buffer in the caller's transaction (which holds
    the buffer's row)."""
    if n:
        this = buffers.c.id == handle.buffer_id
        conn.execute(update(buffers).where(this).values(row_count=buffers.c.row_count - n))


_DELETE_KEYS: dict[str, Any] = {}


def _delete_keys(dialect: Any) -> Any:
    """``DELETE FROM expstore_rows`` of the bound ``keys``, built once per backend."""
    stmt = _DELETE_KEYS.get(dialect.name)
    if stmt is None:
        stmt = _DELETE_KEYS[dialect.name] = delete(rows).where(dialect.key_in())
    return stmt


def remove(
    handle: BufferHandle,
    conn: Connection,
    where: Sequence[ColumnElement[bool]],
    reason: str = "delete",
    policy: str | None = None,
    removed: Removed | None = None,
    state: BufferState | None = None,
    doomed: list[int] | None = None,
) -> int:
    """Delete the buffer's rows matching ``where`` in the caller's transaction (which holds
    the buffer's row), each leaving a tombstone that says ``reason`` (and the eviction
    ``policy``, for evictions; see :mod:`expstore.features.tombstones`), keeping its row
    count and what the buffer's features keep of its rows (the row lifecycle's removal
    hooks, :mod:`expstore.features.lifecycle`: ``state`` as the transaction read it, or
    read now); returns how many went (and counts them in ``removed``, if given).

    The rows to go are read and locked first, in key order (``doomed``: the caller read
    and locked them, the keys of exactly the rows ``where`` matches), then recorded and
    deleted by their keys: the tombstones are exactly the rows deleted, with their
    consumption record as the last ack before the delete left it."""
    dialect = handle.dialect
    if doomed is None:
        mine = [rows.c.buffer_id == handle.buffer_id, *where]
        doomed_stmt = dialect.locked(select(rows.c.key).where(*mine).order_by(rows.c.key))
        doomed = [int(k) for k in conn.execute(doomed_stmt).scalars()]
    if not doomed:
        return 0
    if state is None:
        state = read_state(handle, conn, locked=False)
    ctx = RemoveContext(handle, conn, state, doomed, where, reason, policy)
    state.run("before_remove", ctx)
    dialect.before_delete(conn, doomed[-1], state.keys)
    deleting = handle.write_statement("delete keys", lambda: _delete_keys(dialect))
    ctx.gone = gone = deleting.execute(conn, keys=dialect.key_set(doomed))
    state.run("after_remove", ctx)
    if removed is not None and removed.deferred:
        removed.uncounted += gone
    else:
        count_removed(handle, conn, gone)
    if removed is not None:
        removed.add(reason, doomed, gone)
    return gone


def evict_beyond(
    handle: BufferHandle,
    conn: Connection,
    capacity: int | None,
    policy: str,
    removed: Removed | None = None,
    state: BufferState | None = None,
    count: int | None = None,
) -> int:
    """Evict rows beyond ``capacity`` (None: unlimited) by ``policy`` inside the caller's
    transaction (``state``: the buffer's, see :func:`remove`; ``removed``: counts what
    went, by reason; ``count``: the buffer's rows now, when the caller knows it);
    readers see FIFO eviction by the buffer's smallest key, any other by a new
    version."""
    limit = None if capacity is None else int(capacity)
    if state is None:
        state = read_state(handle, conn, locked=False)
    by = _Remover(handle, conn, policy, removed, state)
    evicted = evict(conn, handle.buffer_id, limit, policy, by, handle.dialect.now(), count)
    if evicted and policy not in OLDEST_FIRST_POLICIES:
        bump_version(handle, conn)
    return evicted


class _Remover:
    """:class:`~expstore.features.eviction.Remove` for one eviction: :func:`remove` in the
    caller's transaction."""

    def __init__(
        self,
        handle: BufferHandle,
        conn: Connection,
        policy: str,
        removed: Removed | None,
        state: BufferState,
    ) -> None:
        self.handle, self.conn, self.policy = handle, conn, policy
        self.removed, self.state = removed, state

    def __call__(self, where: Sequence[ColumnElement[bool]], reason: str) -> int:
        return remove(self.handle, self.conn, where, reason, self.policy, self.removed, self.state)

    def oldest(self, n: int, reason: str) -> int:
        handle = self.handle
        b = handle.buffer_id

        def build() -> Any:
            # The buffer as a range: the planner walks the (buffer_id, key) index from the
            # buffer's oldest key, not the primary key's range over other buffers' rows.
            first = oldest_first(select(rows.c.key), b).limit(bindparam("n", type_=Integer))
            return handle.dialect.locked(first)

        found = handle.statement(("oldest rows", b), build).run(self.conn, n=n)
        doomed = [int(k) for (k,) in found]
        if not doomed:
            return 0
        # exactly the rows at or below the last of them (a hook may ask which)
        where = [rows.c.buffer_id == b, rows.c.key <= doomed[-1]]
        return remove(
            handle, self.conn, where, reason, self.policy, self.removed, self.state, doomed
        )


class Retention(NamedTuple):
    """The buffer's retention as a write found it, and its row count then."""

    capacity: int | None
    policy: str
    rows: int

    @property
    def evicts(self) -> bool:
        """Whether a write may evict (a capacity, or a policy that looks every write)."""
        return self.capacity is not None or self.policy in EVERY_WRITE_POLICIES


class _RetentionFeature(RowFeature):
    """The buffer's capacity and eviction policy: last in every write, the rows beyond
    them go."""

    name = "retention"
    order = 90

    def columns(self, buffer_id: Any) -> list[Any]:
        return [buffers.c.capacity, buffers.c.eviction, buffers.c.row_count]

    def setting(self, values: Sequence[Any]) -> Any:
        capacity = None if values[0] is None else int(values[0])
        return Retention(capacity, values[1] or "fifo", int(values[2] or 0))

    def after_write(self, ctx: WriteContext, setting: Any) -> None:
        if setting.evicts:
            # the rows now: as the state read them, with this write's in and its removals
            # so far out (the write counts both on the buffer's row at its end)
            removed = ctx.removed
            now = setting.rows + ctx.stored - removed.total
            evict_beyond(
                ctx.handle, ctx.conn, setting.capacity, setting.policy, removed, ctx.state, now
            )


register_feature(_RetentionFeature())


def set_retention(
    handle: BufferHandle,
    capacity: int | None,
    eviction: str | None,
    max_staleness: int | None = None,
    keep_tombstones: int | None = None,
) -> tuple[int, str]:
    """Change the buffer's capacity and policy (None: keep the current one) for every
    writer; rows beyond the new capacity go in the same transaction. ``max_staleness`` is
    the ``"stale"`` policy's k (kept with the buffer; None: keep the one stored);
    ``keep_tombstones`` how many tombstones the buffer keeps (None: keep the setting; the
    oldest beyond a smaller one go now). Returns (how many rows went, the policy now in
    force)."""
    check_retention(capacity, eviction)
    check_int("max_staleness", max_staleness, minimum=0, optional=True)
    check_int("tombstones", keep_tombstones, minimum=0, optional=True)
    with handle.errors("change the retention"), handle.write() as conn:
        current, stale_after = lock_buffer(handle, conn, buffers.c.eviction, buffers.c.stale_after)
        policy = eviction or current or "fifo"
        if max_staleness is not None:
            stale_after = max_staleness
        if policy == "stale" and stale_after is None:
            raise InvalidArgumentError(
                'eviction="stale" drops rows more than max_staleness versions behind the '
                'current policy version; give it: buffer.set_retention(capacity, "stale", '
                "max_staleness=k). Nothing was changed"
            )
        values: dict[str, Any] = {
            "capacity": capacity,
            "eviction": policy,
            "stale_after": stale_after,
        }
        if keep_tombstones is not None:
            values["keep_tombstones"] = keep_tombstones
        conn.execute(update(buffers).where(buffers.c.id == handle.buffer_id).values(values))
        if keep_tombstones is not None:
            keep, last = tombstones.kept_tombstones(conn, handle.buffer_id)
            tombstones.trim(conn, handle.buffer_id, keep, last)
        evicted = evict_beyond(handle, conn, capacity, policy)
    return int(evicted), policy


class BufferInfo(NamedTuple):
    """One buffer of a database, as ``expstore buffers`` lists it."""

    name: str
    #: Its rows (None when not counted).
    rows: int | None
    capacity: int | None
    eviction: str
    policy_version: int | None


def list_buffers(conn: Connection, *, count_rows: bool = True) -> list[BufferInfo]:
    """Every buffer of the database on ``conn``, in order of creation; ``count_rows``:
    with each one's rows (the row count every write, delete and eviction keeps on the
    buffer's row: no pass over the rows)."""
    found: Any = buffers.c.row_count if count_rows else None
    stmt = select(
        buffers.c.name, found, buffers.c.capacity, buffers.c.eviction, buffers.c.policy_version
    )
    return [
        BufferInfo(
            name, None if count is None else int(count), capacity, eviction or "fifo", version
        )
        for name, count, capacity, eviction, version in conn.execute(stmt.order_by(buffers.c.id))
    ]
