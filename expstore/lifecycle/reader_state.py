"""The buffer's state as a reader sees it, read in one round trip with every draw: its
:class:`Signature` (what tells a reader whether what it cached is still current), its
policy version, its row count and whether it has a rate limit.

Writers hand keys out in commit order (see :mod:`expstore.storage.writer`), so rows added
raise the largest key; FIFO eviction (which deletes only the oldest rows) raises the
smallest; a priority update bumps the priority version; any other change (a delete,
another eviction policy, a clear) bumps the version; a database made anew under a running
process shows another ``created_at``. Every cache of a buffer's rows (key indexes, group
summaries, what draws keep) is keyed by a signature and brought up to date from what
:func:`moved_on` says changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import Connection, func, select

from ..db.handle import BufferHandle
from ..db.schema import buffers, newest_first, oldest_first, rate_limits, rows

__all__ = ["Signature", "State", "StateReader", "limited_flag", "moved_on", "read_state"]


class Signature(NamedTuple):
    """What a buffer looks like to a reader, read in one round trip."""

    max_key: int  # raised by inserts
    version: int  # bumped by any change other than inserts, FIFO eviction and priorities
    min_key: int  # raised by FIFO eviction
    priority_version: int  # bumped by every priority update
    created_at: float  # the buffer's creation: another when its database was made anew


#: The buffer's signature, its current policy version (None: never set) and its row count.
State = tuple[Signature, int | None, int]
#: How a cache reads :data:`State` on a connection (the storage's key index's read, which
#: also tells the rate limit whether the buffer has one).
StateReader = Callable[[Connection], State]


def limited_flag(buffer_id: Any) -> Any:
    """A scalar subquery: whether the buffer ``buffer_id`` (a value or a bound parameter)
    has a rate limit (for one-round-trip reads)."""
    return (
        select(func.count()).select_from(rate_limits).where(rate_limits.c.buffer_id == buffer_id)
    ).scalar_subquery()


def moved_on(cached: Signature, now: Signature) -> bool:
    """Whether ``now`` is ``cached``'s buffer later on by inserts, FIFO eviction and
    priority updates only (what an index can follow). A read that sees an older state
    (a replica further behind than the last one read) is not: the index is read again."""
    return (
        cached.version == now.version
        and cached.created_at == now.created_at
        and now.max_key >= cached.max_key
        and now.min_key >= cached.min_key
        and now.priority_version >= cached.priority_version
    )


def read_state(
    handle: BufferHandle, conn: Connection, on_limit: Callable[[bool], None] | None = None
) -> State:
    """The buffer's signature, its current policy version and its row count, in one
    round trip; ``on_limit`` is told whether the buffer has a rate limit (read in the same
    round trip; see :mod:`expstore.limits.counters`). A buffer row that no longer
    holds the handle's buffer raises StorageError (:meth:`BufferHandle.check_row`)."""
    buffer_id = handle.buffer_id

    def build() -> Any:
        key = select(rows.c.key)
        max_key = newest_first(key, buffer_id).limit(1).scalar_subquery()
        min_key = oldest_first(key, buffer_id).limit(1).scalar_subquery()
        this = buffers.c.id == buffer_id
        version = select(buffers.c.version).where(this).scalar_subquery()
        priority_version = select(buffers.c.priority_version).where(this).scalar_subquery()
        policy_version = select(buffers.c.policy_version).where(this).scalar_subquery()
        limited = limited_flag(buffer_id)
        count = select(buffers.c.row_count).where(this).scalar_subquery()
        name = select(buffers.c.name).where(this).scalar_subquery()
        created = select(buffers.c.created_at).where(this).scalar_subquery()
        return select(
            max_key,
            version,
            min_key,
            priority_version,
            policy_version,
            limited,
            count,
            name,
            created,
        )

    ((key, version, smallest, priority_version, policy_version, limited, count, name, at),) = (
        handle.statement(("signature",), build).run(conn)
    )
    handle.check_row(name, None if at is None else float(at))
    if on_limit is not None:
        on_limit(bool(limited))
    signature = Signature(
        int(key or 0),
        int(version or 0),
        int(smallest or 0),
        int(priority_version or 0),
        float(at),
    )
    current = None if policy_version is None else int(policy_version)
    return signature, current, int(count or 0)
