"""Tombstones: a compact trace of each row that left a buffer, so lineage outlives retention.

Every row that leaves a buffer by eviction (``capacity``, ``stale``) or by ``delete()`` /
``clear()`` leaves a tombstone in ``expstore_tombstones`` (see :mod:`expstore.db.schema`),
written in the transaction that deletes it: its key and id, when it went (database clock)
and why, and its consumption record as it was then (consumer, when claimed, lease, when
acked and with which checkpoint). ``buffer.lineage(ids)`` answers ``evicted`` from it for
a row no longer stored.

Bounded by a retention of its own: a buffer keeps the newest ``keep_tombstones``
(:data:`DEFAULT_KEEP`, 100,000, unless ``set_retention(..., tombstones=n)`` says
otherwise; 0 keeps none). The oldest go in the same transaction that writes new ones, by
one range of the ``(buffer_id, seq)`` primary key, so a write costs the same whatever the
number kept; a removal of more rows than that writes tombstones for its newest rows only.

How a removal stays exact on Postgres, where claims and acks run beside writers: the rows
to go are read and locked first (``FOR UPDATE``, in key order), then their tombstones are
written and they are deleted by those keys. An ack takes a ``FOR KEY SHARE`` lock on its
claim's rows (see :mod:`expstore.claims.lease_retention`), so the two take turns on
each row: a row acked before its eviction is recorded as acked, a row evicted before its
ack makes the ack raise :class:`~expstore.errors.RowsEvictedError`. (SQLite runs one
writer at a time, so the same statements are exact there as they are.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Connection,
    String,
    and_,
    bindparam,
    delete,
    func,
    literal,
    select,
)
from sqlalchemy.sql.elements import ColumnElement

from ..db.handle import BufferHandle
from ..db.schema import buffers, checkpoints, consumption, rows, tombstones
from ..lifecycle.hooks import RemoveContext, RowFeature, register

__all__ = [
    "DEFAULT_KEEP",
    "REASONS",
    "Tombstone",
    "buried",
    "keep_setting",
    "kept_tombstones",
    "reasons_of",
    "record",
    "record_clear",
    "record_where",
    "trim",
]

#: Tombstones a buffer keeps unless ``set_retention(..., tombstones=n)`` says otherwise.
DEFAULT_KEEP = 100_000


def keep_setting(stored: Any) -> int:
    """How many tombstones a buffer keeps, from its ``keep_tombstones`` column (NULL: the
    default)."""
    return DEFAULT_KEEP if stored is None else int(stored)


#: Why a row left: beyond the capacity, stale (the ``"stale"`` policy), ``delete()``,
#: ``clear()``.
REASONS = ("capacity", "stale", "delete", "clear")

_T = tombstones.c
_C = consumption.c


class Tombstone(NamedTuple):
    """What a tombstone holds of a row that left the buffer."""

    key: int
    evicted_at: float
    reason: str
    policy: str | None
    consumer: str | None
    claimed_at: float | None
    lease_until: float | None
    acked_at: float | None
    checkpoint: Any
    checkpoint_seq: int | None
    times_claimed: int


# Statements of every write that removes rows, built once (per backend where the
# database's clock is in them): SQLAlchemy then finds their compiled form by identity.
_KEPT = select(
    buffers.c.keep_tombstones,
    select(func.max(_T.seq)).where(_T.buffer_id == bindparam("buffer_id")).scalar_subquery(),
).where(buffers.c.id == bindparam("buffer_id"))
_TRIM = delete(tombstones).where(
    _T.buffer_id == bindparam("buffer_id"), _T.seq <= bindparam("upto")
)


def kept_tombstones(conn: Connection, buffer_id: int) -> tuple[int, int]:
    """How many tombstones the buffer keeps, and the ``seq`` of its newest (0: none yet):
    one statement, the buffer's row and one probe of the primary key."""
    keep, last = conn.execute(_KEPT, {"buffer_id": buffer_id}).one()
    return keep_setting(keep), int(last or 0)


def _columns(now: Any, reason: Any, policy: Any, seq: Any) -> list[Any]:
    """The tombstone's values, selected from ``expstore_rows`` outer-joined with the row's
    consumption entry, in the order of :data:`_INSERTED`."""
    return [
        rows.c.buffer_id,
        seq,
        rows.c.key,
        rows.c.id,
        reason,
        policy,
        now,
        _C.consumer,
        _C.claimed_at,
        _C.lease_until,
        _C.acked_at,
        _C.checkpoint_seq,
        func.coalesce(_C.times_claimed, 0),
    ]


_INSERTED = [
    "buffer_id",
    "seq",
    "key",
    "id",
    "reason",
    "policy",
    "evicted_at",
    "consumer",
    "claimed_at",
    "lease_until",
    "acked_at",
    "checkpoint_seq",
    "times_claimed",
]
_WITH_ENTRY = rows.outerjoin(consumption, _C.key == rows.c.key)
_RECORD: dict[str, Any] = {}


def _record_statement(handle: BufferHandle) -> Any:
    """``INSERT INTO expstore_tombstones ... SELECT`` of the rows of the bound ``keys``,
    numbered from the bound ``last`` + 1 in key order, with the bound ``reason`` and
    ``policy``; one per backend."""
    dialect = handle.dialect
    stmt = _RECORD.get(dialect.name)
    if stmt is None:
        seq = bindparam("last", type_=BigInteger) + func.row_number().over(order_by=rows.c.key)
        reason = bindparam("reason", type_=String)
        policy = bindparam("policy", type_=String)
        values = _columns(dialect.now(), reason, policy, seq)
        picked = select(*values).select_from(_WITH_ENTRY).where(dialect.key_in())
        stmt = _RECORD[dialect.name] = tombstones.insert().from_select(_INSERTED, picked)
    return stmt


def record(
    handle: BufferHandle,
    conn: Connection,
    keys: Sequence[int],
    reason: str,
    policy: str | None,
    keep: int,
    last: int,
) -> int:
    """Write the tombstones of the rows of ``keys`` (sorted; still present, and locked by
    the caller's transaction), the newest ``keep`` of them, numbered from ``last`` + 1 in
    key order, then trim the buffer's oldest beyond ``keep``; returns the new newest seq."""
    chosen = list(keys)[-keep:] if keep else []
    if not chosen:
        return last
    params = {
        "keys": handle.dialect.key_set(chosen),
        "last": last,
        "reason": reason,
        "policy": policy,
    }
    handle.write_statement("record tombstones", lambda: _record_statement(handle)).execute(
        conn, **params
    )
    newest = last + len(chosen)
    trim(conn, handle.buffer_id, keep, newest)
    return newest


def record_clear(handle: BufferHandle, conn: Connection) -> None:
    """The tombstones of every row of the buffer, which ``clear()`` is about to delete in
    the caller's transaction (which holds the buffer's row): the newest ``keep`` rows'
    (their keys are not read into Python). On Postgres the rows are locked first, so
    acks take turns with the clear as with any removal."""
    keep, last = kept_tombstones(conn, handle.buffer_id)
    if not keep:
        return
    mine = rows.c.buffer_id == handle.buffer_id
    if handle.dialect.locks_rows:
        locking = handle.dialect.locked(select(rows.c.key).where(mine)).subquery()
        conn.execute(select(func.count()).select_from(locking))
    record_where(handle, conn, [mine], "clear", keep, last)


def record_where(
    handle: BufferHandle,
    conn: Connection,
    where: Sequence[ColumnElement[bool]],
    reason: str,
    keep: int,
    last: int,
) -> int:
    """:func:`record` for the rows matching ``where``, whose keys are not read into
    Python (the caller holds them): the newest ``keep`` of them; returns the new newest
    seq."""
    if not keep:
        return last
    newest_rows = (
        select(rows.c.key).where(*where).order_by(rows.c.key.desc()).limit(keep).subquery()
    )
    seq = literal(last) + func.row_number().over(order_by=rows.c.key)
    values = _columns(handle.dialect.now(), literal(reason), literal(None), seq)
    picked = (
        select(*values).select_from(_WITH_ENTRY).where(rows.c.key.in_(select(newest_rows.c.key)))
    )
    conn.execute(tombstones.insert().from_select(_INSERTED, picked))
    # (Read again rather than by the insert's rowcount, which psycopg may not know.)
    newest = kept_tombstones(conn, handle.buffer_id)[1]
    trim(conn, handle.buffer_id, keep, newest)
    return newest


def trim(conn: Connection, buffer_id: int, keep: int, newest: int) -> None:
    """Delete the buffer's tombstones beyond the newest ``keep`` (``newest``: the newest
    one's seq), by one range of the primary key."""
    if newest > keep:
        conn.execute(_TRIM, {"buffer_id": buffer_id, "upto": newest - keep})


def _with_checkpoint() -> Any:
    cp = checkpoints.c
    return tombstones.outerjoin(
        checkpoints,
        and_(cp.buffer_id == _T.buffer_id, cp.consumer == _T.consumer, cp.seq == _T.checkpoint_seq),
    )


_CHUNK = 500


def buried(handle: BufferHandle, conn: Connection, ids: Sequence[str]) -> dict[str, Tombstone]:
    """The newest tombstone of each of ``ids`` the buffer keeps (ids without one left out),
    with the checkpoint its row was acked with."""
    found: dict[str, Tombstone] = {}
    stmt = select(
        _T.id,
        _T.key,
        _T.evicted_at,
        _T.reason,
        _T.policy,
        _T.consumer,
        _T.claimed_at,
        _T.lease_until,
        _T.acked_at,
        checkpoints.c.state,
        _T.checkpoint_seq,
        _T.times_claimed,
    ).select_from(_with_checkpoint())
    unique = list(dict.fromkeys(ids))
    for start in range(0, len(unique), _CHUNK):
        part = unique[start : start + _CHUNK]
        chosen = stmt.where(_T.buffer_id == handle.buffer_id, _T.id.in_(part)).order_by(_T.seq)
        for row_id, *rest in conn.execute(chosen):
            found[row_id] = Tombstone(*rest)  # the newest last
    return found


def reasons_of(
    handle: BufferHandle, conn: Connection, keys: Sequence[int]
) -> dict[tuple[str, str | None], int]:
    """How many of the rows of ``keys`` (rows that left the buffer) went by each reason and
    policy (``("capacity", "fifo")``, ``("stale", "stale")``, ``("delete", None)`` ...), by
    their tombstones; rows whose tombstone is no longer kept count as ``("unknown",
    None)``. A read of the buffer's tombstones (at most ``keep_tombstones``), for an error
    message."""
    if not keys:
        return {}
    dialect = handle.dialect
    stmt = (
        select(_T.reason, _T.policy, func.count(func.distinct(_T.key)))
        .where(_T.buffer_id == handle.buffer_id, dialect.key_in(_T.key))
        .group_by(_T.reason, _T.policy)
    )
    bound = {"keys": dialect.key_set(list(keys))}
    counts = {(str(r), p): int(n) for r, p, n in conn.execute(stmt, bound)}
    unknown = len(set(keys)) - sum(counts.values())
    if unknown > 0:
        counts["unknown", None] = unknown
    return counts


class _TombstonesFeature(RowFeature):
    """Every removal leaves the tombstones of the newest ``keep`` rows it takes (none when
    the buffer keeps none)."""

    name = "tombstones"
    order = 20

    def columns(self, buffer_id: Any) -> list[Any]:
        newest = select(func.max(_T.seq)).where(_T.buffer_id == buffer_id).scalar_subquery()
        return [buffers.c.keep_tombstones, newest]

    def setting(self, values: Sequence[Any]) -> Any:
        keep = keep_setting(values[0])
        return (keep, int(values[1] or 0)) if keep else None

    reads_unlocked = True  # (no hook in a write before removals)

    def settings_columns(self, columns: Sequence[Any]) -> Sequence[Any]:
        return columns[:1]  # not the newest tombstone's number

    def before_remove(self, ctx: RemoveContext, setting: Any) -> None:
        keep, last = setting
        newest = record(ctx.handle, ctx.conn, ctx.keys, ctx.reason, ctx.policy, keep, last)
        # the next removal of this transaction numbers its tombstones on from these
        ctx.state.settings[self.name] = (keep, newest)

    joins_removal = True

    def removal_statements(self, dialect: Any) -> list[Any]:
        # The tombstones of the rows going from key tomb_from on (the newest keep),
        # numbered from tomb_last + 1; then the trim of those beyond the newest keep (the
        # statement's snapshot does not see the new ones: the trim reaches older ones only).
        seq = bindparam("tomb_last", type_=BigInteger) + func.row_number().over(order_by=rows.c.key)
        reason = bindparam("tomb_reason", type_=String)
        policy = bindparam("tomb_policy", type_=String)
        values = _columns(dialect.now(), reason, policy, seq)
        newest = rows.c.key >= bindparam("tomb_from", type_=BigInteger)
        picked = select(*values).select_from(_WITH_ENTRY).where(dialect.key_in(), newest)
        upto = bindparam("tomb_upto", type_=BigInteger)
        # (upto > 0: a condition on the parameter alone, so the statement skips the trim
        # when it has nothing to do, whatever plan it has, instead of reading the
        # buffer's tombstones for none)
        trim = delete(tombstones).where(
            upto > 0, _T.buffer_id == bindparam("tomb_buffer", type_=BigInteger), _T.seq <= upto
        )
        return [tombstones.insert().from_select(_INSERTED, picked), trim]

    def removal_params(self, ctx: RemoveContext, setting: Any) -> dict[str, Any]:
        keep, last = setting
        chosen = list(ctx.keys)[-keep:]
        newest = last + len(chosen)
        # the next removal of this transaction numbers its tombstones on from these
        ctx.state.settings[self.name] = (keep, newest)
        return {
            "tomb_from": chosen[0],
            "tomb_last": last,
            "tomb_reason": ctx.reason,
            "tomb_policy": ctx.policy,
            "tomb_buffer": ctx.handle.buffer_id,
            "tomb_upto": newest - keep,
        }


register(_TombstonesFeature())
