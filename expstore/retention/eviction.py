"""Retention policies: which rows go when a buffer holds more than its capacity.

Each policy is one SQL DELETE run in the same transaction as the write it follows, so a
committed write never leaves more than ``capacity`` rows.

- ``fifo``: the oldest rows by insertion order go first.
- ``max_reward``: keep the rows with the highest ``reward_t`` (torchgfn's prioritized
  capacity); rows without a reward go first, ties are broken by recency (newer rows stay).
- ``task_fifo``: evict whole tasks (AWorld's FIFO), so no stored trajectory is left half:
  the task written least recently (by its newest row) goes first, so a task still being
  written step by step is never evicted in favour of a finished one. A single task larger
  than the capacity is evicted whole too. (A task whose later steps arrive after it was
  evicted starts again from those steps.)
- ``stale``: rows more than ``k`` policy versions older than the buffer's current version
  go (``set_retention(capacity, "stale", stale_after=k)``; see
  :mod:`expstore.policy_versions`), at every write and when the version moves; rows without
  a version stay. Beyond ``capacity`` (if set), the oldest of the rest go, as ``fifo``.

  A stale row under a live lease (claimed, not acked, its lease not run out) stays until
  the claim is finished: its ack evicts it in the ack's own transaction (see
  :mod:`expstore.claims.lease_retention`), and once its lease runs out or the claim is
  released, the next write or version change does. A learner never loses rows it holds
  to a version bump.

Capacity is exact and evicts leased rows too (a claim does not grow the buffer beyond
it): the ack of a claim whose rows went raises
:class:`~expstore.errors.RowsEvictedError`. Every row that goes leaves a tombstone (see
:mod:`expstore.retention.tombstones`) with the reason (``"capacity"`` or ``"stale"``) it is
removed with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, get_args

from sqlalchemy import Connection, and_, func, select
from sqlalchemy.sql.elements import ColumnElement

from ..db.schema import buffers, consumption, rows

__all__ = [
    "EVERY_WRITE_POLICIES",
    "Eviction",
    "EVICTION_POLICIES",
    "OLDEST_FIRST_POLICIES",
    "Remove",
    "evict",
    "not_leased",
    "stale_rows",
]


class Remove(Protocol):
    """Deletes rows of the buffer, giving the reason (``"capacity"`` or ``"stale"``) their
    tombstones record, and returns how many went (the registry's, which also runs the
    removal hooks of the buffer's features)."""

    def __call__(self, where: Sequence[ColumnElement[bool]], reason: str) -> int:
        """The rows matching some WHERE clauses."""

    def oldest(self, n: int, reason: str) -> int:
        """The buffer's ``n`` oldest rows (by a statement compiled once)."""


def not_leased(now: Any) -> ColumnElement[bool]:
    """The row is under no live lease at ``now`` (the database's clock): never claimed,
    acked, released, or its lease ran out. Looked up by key for each row tested."""
    live = and_(
        consumption.c.key == rows.c.key,
        consumption.c.acked_at.is_(None),
        consumption.c.lease_until >= now,
    )
    return ~select(consumption.c.key).where(live).exists()


def stale_rows(buffer_id: int) -> ColumnElement[bool]:
    """Rows the ``"stale"`` policy drops: more than the buffer's ``stale_after`` versions
    behind its current version (the complement of the freshness rule,
    expstore.policy_versions.fresh: rows without a version are never stale, "< oldest"
    is NULL for them)."""
    this = buffers.c.id == buffer_id
    oldest = select(buffers.c.policy_version - buffers.c.stale_after).where(this)
    return rows.c.policy_version < oldest.scalar_subquery()


def _fifo(
    conn: Connection,
    buffer_id: int,
    capacity: int,
    remove: Remove,
    now: Any,
    count: int | None = None,
) -> int:
    # The buffer's row count (kept in this transaction by every write and delete, ``remove``
    # included, see expstore.lifecycle.registry; or given) says how many of the oldest rows
    # go: that many keys read from the oldest end (Remove.oldest, a statement compiled
    # once), so a write costs the same whatever the capacity.
    if count is None:
        held = select(buffers.c.row_count).where(buffers.c.id == buffer_id)
        count = int(conn.execute(held).scalar_one())
    excess = count - capacity
    if excess <= 0:
        return 0
    return remove.oldest(excess, "capacity")


def _keep_ranked(
    conn: Connection, buffer_id: int, capacity: int, remove: Remove, *order: Any
) -> int:
    keep = select(rows.c.key).where(rows.c.buffer_id == buffer_id).order_by(*order).limit(capacity)
    count = conn.execute(
        select(func.count()).select_from(rows).where(rows.c.buffer_id == buffer_id)
    ).scalar_one()
    if count <= capacity:
        return 0
    return remove([rows.c.key.not_in(keep)], "capacity")


def _max_reward(
    conn: Connection,
    buffer_id: int,
    capacity: int,
    remove: Remove,
    now: Any,
    count: int | None = None,  # (it counts the rows it ranks)
) -> int:
    return _keep_ranked(
        conn, buffer_id, capacity, remove, rows.c.reward_t.desc().nulls_last(), rows.c.key.desc()
    )


def _task_fifo(
    conn: Connection,
    buffer_id: int,
    capacity: int,
    remove: Remove,
    now: Any,
    count: int | None = None,  # (it counts the rows it ranks)
) -> int:
    tasks = (
        select(
            rows.c.task_id,
            func.count().label("n"),
            func.max(rows.c.key).label("last_key"),
        )
        .where(rows.c.buffer_id == buffer_id)
        .group_by(rows.c.task_id)
        .subquery()
    )
    # Rows held by this task and every task written more recently.
    running = (
        select(
            tasks.c.task_id,
            func.sum(tasks.c.n)
            .over(order_by=tasks.c.last_key.desc(), rows=(None, 0))
            .label("held"),
        )
    ).subquery()
    doomed = select(running.c.task_id).where(running.c.held > capacity)
    return remove([rows.c.task_id.in_(doomed)], "capacity")


def _stale(
    conn: Connection,
    buffer_id: int,
    capacity: int,
    remove: Remove,
    now: Any,
    count: int | None = None,
) -> int:
    evicted = remove([stale_rows(buffer_id), not_leased(now)], "stale")
    if not capacity:
        return evicted
    left = None if count is None else count - evicted
    return evicted + _fifo(conn, buffer_id, capacity, remove, now, left)


#: Policies that only ever delete a buffer's oldest rows (every key below some key), which
#: readers' cached key indexes follow from the buffer's smallest key, with no reload.
OLDEST_FIRST_POLICIES = frozenset({"fifo"})

#: Each policy: (conn, buffer_id, capacity, remove, now, count) -> rows removed; ``count``
#: the buffer's rows when the caller knows them (None: the policy reads what it needs).
EVICTION_POLICIES: dict[str, Callable[[Connection, int, int, Remove, Any, int | None], int]] = {
    "fifo": _fifo,
    "max_reward": _max_reward,
    "task_fifo": _task_fifo,
    "stale": _stale,
}
#: The eviction policies, as a type: ``ReplayBuffer(..., eviction="fifo")`` is checked.
Eviction = Literal["fifo", "max_reward", "task_fifo", "stale"]
assert set(get_args(Eviction)) == set(EVICTION_POLICIES)

#: Policies that delete rows at every write even without a capacity.
EVERY_WRITE_POLICIES = frozenset({"stale"})


def evict(
    conn: Connection,
    buffer_id: int,
    capacity: int | None,
    policy: str,
    remove: Remove,
    now: Any,
    count: int | None = None,
) -> int:
    """Delete rows of ``buffer_id`` beyond ``capacity`` (None: unlimited, for policies that
    evict without one) by ``policy``, through ``remove``; ``now`` is the database's clock
    (leases are live until then); ``count``, the buffer's rows when the caller knows
    them (FIFO then reads no count). Returns how many went."""
    if capacity is None and policy not in EVERY_WRITE_POLICIES:
        return 0
    return EVICTION_POLICIES[policy](conn, buffer_id, capacity or 0, remove, now, count)
