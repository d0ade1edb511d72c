"""Priorities: stored per row (for prioritized replay) in ``expstore_priorities``, a
narrow table beside the rows, updated by id, and logged so that other processes bring
their cached priorities up to date without reading every row again.

An update writes one narrow entry per row (inserted the first time, updated after), never
a new version of the wide row; the entry goes with its row (ON DELETE CASCADE).

Every update bumps the buffer's ``priority_version`` and writes the keys and priorities it
set to ``expstore_priority_log`` under that number; the log keeps the last
:attr:`~expstore.db.tuning.Tuning.priority_log_keep` updates of each buffer (the
updating handle's). A reader whose cached index is at version ``v`` patches it with the
entries ``v + 1 ..`` (see :mod:`expstore.storage.key_index`), or reloads when the log no
longer reaches back that far.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
from sqlalchemy import (
    BigInteger,
    Connection,
    Double,
    Integer,
    Text,
    and_,
    bindparam,
    column,
    delete,
    exists,
    func,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, distinct_on

from ._args import check_priorities
from .db import schema
from .db.dialects import Dialect
from .db.handle import BufferHandle
from .db.row_ids import ids_to_keys
from .db.schema import buffers, priority_log, rows
from .lifecycle.registry import bump_version, lock_buffer

__all__ = ["Update", "logged_priorities", "update_priorities", "update_priorities_in"]

#: (priority version after the update, the keys it set, their priorities), each key once.
Update = tuple[int, np.ndarray, np.ndarray]


def update_priorities(
    handle: BufferHandle, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
) -> Update | None:
    """Set the stored priority of rows by id, logging the update; None when no id is
    stored. Ids no longer in the buffer are skipped; for an id given twice the last
    priority wins."""
    ids, values = check_priorities(ids, priorities)
    if not ids:
        return None
    with handle.errors("update priorities"), handle.write() as conn:
        return update_priorities_in(handle, conn, ids, values)


def update_priorities_in(
    handle: BufferHandle, conn: Connection, ids: Sequence[str], values: np.ndarray
) -> Update | None:
    """:func:`update_priorities` of checked ``ids`` and ``values`` (see
    :func:`~expstore._args.check_priorities`) in the caller's transaction (a learner's
    training step, see :mod:`expstore.claims.steps`)."""
    # The buffer's row first, as store_batch takes it: locking rows and then the
    # buffer would deadlock with a writer evicting those rows.
    lock_buffer(handle, conn, buffers.c.id)
    if handle.dialect.modifying_ctes:
        return _update_at_once(handle, conn, ids, values)
    key_of = ids_to_keys(handle, conn, ids)
    # By key, the last priority given for it winning (as the UPDATEs in order would).
    latest = {key_of[i]: float(p) for i, p in zip(ids, values, strict=True) if i in key_of}
    if not latest:
        return None
    dialect = handle.dialect
    bound = dialect.key_value_params(list(latest), list(latest.values()))
    # One statement each, whatever the number of keys: an entry per key (the first
    # time inserted, after that updated), then the log of this update.
    given = dialect.bound_key_values()
    new = dialect.insert_per_key(
        schema.priorities, {"buffer_id": handle.buffer_id, "priority": given.c.value}, given
    )
    conn.execute(
        new.on_conflict_do_update(index_elements=["key"], set_={"priority": new.excluded.priority}),
        bound,
    )
    seq = bump_version(handle, conn, buffers.c.priority_version)
    entries = {"buffer_id": handle.buffer_id, "seq": seq, "priority": given.c.value}
    conn.execute(dialect.insert_per_key(priority_log, entries, given), bound)
    conn.execute(
        delete(priority_log).where(
            priority_log.c.buffer_id == handle.buffer_id,
            priority_log.c.seq <= seq - handle.tuning.priority_log_keep,
        )
    )
    keys = np.fromiter(latest, dtype=np.int64, count=len(latest))
    priorities_ = np.fromiter(latest.values(), dtype=np.float64, count=len(latest))
    return seq, keys, priorities_


def _update_at_once(
    handle: BufferHandle, conn: Connection, ids: Sequence[str], values: np.ndarray
) -> Update | None:
    """:func:`update_priorities_in` as one statement (Postgres), the buffer's row locked
    already (so no row of it can be deleted until the transaction ends, and the statement's
    snapshot sees every row there is): the ids looked up by the ``(buffer_id, id)`` index,
    the last priority given for an id winning, the entries upserted, the version bumped,
    the update logged and the log trimmed; nothing when no id is stored."""
    statement = handle.statement(
        ("priorities at once",), partial(_at_once_statement, handle.dialect)
    )
    found = statement.run(
        conn,
        buffer_id=handle.buffer_id,
        ids=list(ids),
        values=[float(v) for v in values],
        keep=handle.tuning.priority_log_keep,
    )
    if not found:
        return None
    seq = int(found[0][0])
    keys = np.fromiter((r[1] for r in found), dtype=np.int64, count=len(found))
    priorities_ = np.fromiter((r[2] for r in found), dtype=np.float64, count=len(found))
    return seq, keys, priorities_


def _at_once_statement(dialect: Dialect) -> Any:
    """The statement of :func:`_update_at_once` (see there), compiled once per handle;
    returns ``(seq, key, priority)`` per key set."""
    buffer_id = bindparam("buffer_id", type_=Integer)
    pairs = (
        func.unnest(bindparam("ids", type_=ARRAY(Text)), bindparam("values", type_=ARRAY(Double)))
        .table_valued(column("id", Text), column("value", Double), with_ordinality="ord")
        .render_derived(name="pairs")
    )
    # Each stored id's key and the last priority given for it.
    given = (
        select(rows.c.key.label("key"), pairs.c.value.label("value"))
        .ext(distinct_on(rows.c.key))
        .select_from(pairs.join(rows, and_(rows.c.buffer_id == buffer_id, rows.c.id == pairs.c.id)))
        .order_by(rows.c.key, pairs.c.ord.desc())
        .cte("given")
    )
    bumped = (
        update(buffers)
        .where(buffers.c.id == buffer_id, exists(select(given.c.key)))
        .values(priority_version=buffers.c.priority_version + 1)
        .returning(buffers.c.priority_version.label("seq"))
        .cte("bumped")
    )
    # Read through bumped: the version is bumped before any entry is written.
    through_bumped = given.join(bumped, true())
    setting = select(given.c.key, buffer_id, given.c.value).select_from(through_bumped)
    upsert = dialect.upsert(schema.priorities).from_select(
        ["key", "buffer_id", "priority"], setting
    )
    upserted = upsert.on_conflict_do_update(
        index_elements=["key"], set_={"priority": upsert.excluded.priority}
    ).cte("upserted")
    logging = select(given.c.key, buffer_id, bumped.c.seq, given.c.value).select_from(
        through_bumped
    )
    logged = (
        priority_log.insert()
        .from_select(["key", "buffer_id", "seq", "priority"], logging)
        .cte("logged")
    )
    trimmed = (
        delete(priority_log)
        .where(
            priority_log.c.buffer_id == buffer_id,
            priority_log.c.seq
            <= select(bumped.c.seq).scalar_subquery() - bindparam("keep", type_=BigInteger),
        )
        .cte("trimmed")
    )
    return (
        select(bumped.c.seq, given.c.key, given.c.value)
        .select_from(through_bumped)
        .add_cte(upserted, logged, trimmed)
    )


def logged_priorities(
    handle: BufferHandle, conn: Connection, after: int, upto: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(keys, priorities) set by the buffer's priority updates ``after + 1 .. upto``, each
    key's latest; None if the log no longer reaches back that far."""
    log = priority_log.c
    stmt = (
        select(log.seq, log.key, log.priority)
        .where(log.buffer_id == handle.buffer_id, log.seq > after, log.seq <= upto)
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
