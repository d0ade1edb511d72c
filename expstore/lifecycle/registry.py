"""The buffer registry: each named buffer's row in ``expstore_buffers``, and the counters
readers use to tell whether their cached key indexes are still current; the removal of a
buffer's rows, through the row lifecycle's removal hooks. Its retention (capacity and
eviction policy, the same for every handle and process that writes) is
:mod:`expstore.retention.capacity`.

Every change to a buffer takes its row first (:func:`lock_buffer`), so changes take turns
in one order: on Postgres by ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already lets one
writer in at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from ..db.handle import BufferHandle
from ..db.schema import buffers, rows
from .hooks import BufferState, LazyWhere, RemoveContext, Removed, read_state

__all__ = [
    "BufferInfo",
    "list_buffers",
    "bump_version",
    "count_inserted",
    "count_removed",
    "lock_buffer",
    "open_buffer",
    "Removed",
    "remove",
    "remove_ids",
]


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


def count_inserted(
    handle: BufferHandle, conn: Connection, n: int, removed: int = 0, changed: bool = False
) -> None:
    """Count ``n`` rows stored into the buffer, and when, and ``removed`` rows deleted
    (the caller holds its row); ``changed``: with a new version, as :func:`bump_version`
    marks it, in the same statement (rows removed by a delete in this transaction)."""

    def build() -> Any:
        gone = bindparam("removed", type_=BigInteger)
        new = literal(1) if changed else None
        return _counting(handle, bindparam("n", type_=BigInteger), gone, new)

    key = "count inserted, new version" if changed else "count inserted"
    handle.write_statement(key, build).execute(
        conn, buffer_id=handle.buffer_id, n=n, removed=removed
    )


def _counting(handle: BufferHandle, added: Any, gone: Any, new_version: Any) -> Any:
    """The UPDATE of the buffer's row (its id bound as ``buffer_id``) that counts
    ``added`` rows stored now and ``gone`` deleted, adding ``new_version`` (None: nothing)
    to its version."""
    values = {
        "inserted": buffers.c.inserted + added,
        "row_count": buffers.c.row_count + added - gone,
        "inserted_at": handle.dialect.now(),
    }
    if new_version is not None:
        values["version"] = buffers.c.version + new_version
    where = buffers.c.id == bindparam("buffer_id", type_=Integer)
    return update(buffers).where(where).values(values)


def count_removed(handle: BufferHandle, conn: Connection, n: int) -> None:
    """Count ``n`` rows deleted from the buffer in the caller's transaction (which holds
    the buffer's row)."""
    if n:

        def build() -> Any:
            this = buffers.c.id == bindparam("buffer_id", type_=Integer)
            gone = bindparam("n", type_=BigInteger)
            return update(buffers).where(this).values(row_count=buffers.c.row_count - gone)

        handle.write_statement("count removed", build).execute(
            conn, buffer_id=handle.buffer_id, n=n
        )


_DELETE_KEYS: dict[tuple[str, ...], Any] = {}


def _delete_keys(dialect: Any, joined: Sequence[Any] = ()) -> Any:
    """``DELETE FROM expstore_rows`` of the bound ``keys``, with the ``joined`` features'
    removal statements in its WITH clause; built once per backend and features."""
    key = (dialect.name, *(f.name for f in joined))
    stmt = _DELETE_KEYS.get(key)
    if stmt is None:
        stmt = delete(rows).where(dialect.key_in())
        for feature in joined:
            for i, part in enumerate(feature.removal_statements(dialect)):
                stmt = stmt.add_cte(part.cte(f"{feature.name}_{i}"))
        _DELETE_KEYS[key] = stmt
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
    ``policy``, for evictions; see :mod:`expstore.retention.tombstones`), keeping its row
    count and what the buffer's features keep of its rows (the row lifecycle's removal
    hooks, :mod:`expstore.lifecycle.hooks`: ``state`` as the transaction read it, or
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
    # Features whose records of the rows join the delete's statement (Postgres), and
    # the rest, whose before_remove runs first.
    joined: list[Any] = []
    params: dict[str, Any] = {}
    for feature, setting in list(state.hooked("before_remove")):
        if dialect.modifying_ctes and feature.joins_removal:
            joined.append(feature)
        else:
            feature.before_remove(ctx, setting)
    for feature in joined:
        params.update(feature.removal_params(ctx, state.setting(feature.name)))
    # (the key state as the delete leaves it, for an insert later in the transaction)
    state.keys = dialect.before_delete(conn, doomed[-1], state.keys)
    name = " ".join(["delete keys", *(f.name for f in joined)])
    deleting = handle.write_statement(name, lambda: _delete_keys(dialect, joined))
    ctx.gone = gone = deleting.execute(conn, keys=dialect.key_set(doomed), **params)
    state.run("after_remove", ctx)
    if removed is not None and removed.deferred:
        removed.uncounted += gone
    else:
        count_removed(handle, conn, gone)
    if removed is not None:
        removed.add(reason, doomed, gone)
    return gone


def remove_ids(
    handle: BufferHandle,
    conn: Connection,
    ids: Sequence[str],
    state: BufferState,
    removed: Removed,
    inserting: int = 0,
) -> int:
    """Delete the buffer's rows whose id is one of ``ids`` as :func:`remove` deletes them
    (``state``: as the caller's transaction read it, with the buffer's row taken;
    ``removed``: deferred, the caller's write counts them), before a write of
    ``inserting`` rows in the same transaction; returns how many went. Readers see them
    gone by a new version (``removed.changed``). Where statements may modify in their WITH
    clause (Postgres), the statement that locks the rows also counts them gone, the
    write's rows stored and the new version (``removed.counted_inserts``: the write counts
    nothing more), saving the write its own update of the buffer's row."""
    dialect = handle.dialect
    counting = bool(inserting) and dialect.modifying_ctes

    def build() -> Any:
        mine = rows.c.buffer_id == bindparam("buffer_id", type_=Integer)
        chosen = select(rows.c.key).where(mine, dialect.text_in(rows.c.id, "ids"))
        locked = dialect.locked(chosen.order_by(dialect.in_key_order_found()))
        if not counting:
            return locked
        doomed = locked.cte("doomed")
        gone = select(func.count()).select_from(doomed).scalar_subquery()
        new = case((gone > 0, 1), else_=0)
        counted = _counting(handle, bindparam("n", type_=BigInteger), gone, new).cte("counted")
        return select(doomed.c.key).order_by(doomed.c.key).add_cte(counted)

    params = {"buffer_id": handle.buffer_id, "ids": dialect.text_set(ids)}
    if counting:
        params["n"] = inserting
    found = handle.statement(("rows of ids", counting), build).run(conn, **params)
    if counting:
        removed.counted_inserts = inserting
    if not found:
        return 0
    doomed = [int(k) for (k,) in found]
    # exactly the rows going, by the keys just locked (a hook may ask which; built
    # without the query compiler, which cost a replace of one row 0.4 ms)
    where = LazyWhere(lambda: [rows.c.buffer_id == handle.buffer_id, rows.c.key.in_(doomed)])
    gone = remove(handle, conn, where, "delete", None, removed, state, doomed)
    if counting:
        removed.uncounted -= gone  # counted by the statement that locked them
    else:
        removed.changed = True
    return gone


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
