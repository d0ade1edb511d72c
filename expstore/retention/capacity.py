"""A buffer's retention: its capacity and eviction policy, the same for every handle and
process that writes, kept on the buffer's row; the row feature that evicts the rows
beyond them last in every write, and :func:`set_retention`, which changes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, Integer, bindparam, select, update
from sqlalchemy.sql.elements import ColumnElement

from .._args import check_int
from ..db.handle import BufferHandle
from ..db.schema import buffers, oldest_first, rows
from ..errors import InvalidArgumentError, RetentionConflictError
from ..lifecycle.hooks import (
    BufferState,
    LazyWhere,
    Removed,
    RowFeature,
    WriteContext,
    read_state,
)
from ..lifecycle.hooks import register as register_feature
from ..lifecycle.registry import bump_version, lock_buffer, remove
from . import tombstones
from .eviction import EVERY_WRITE_POLICIES, EVICTION_POLICIES, OLDEST_FIRST_POLICIES, evict

__all__ = [
    "Retention",
    "RetentionSetting",
    "check_retention",
    "read_retention",
    "evict_beyond",
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
            'eviction="stale" needs its stale_after; set it for every writer with '
            'buffer.set_retention(capacity, "stale", stale_after=k), then open handles '
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


class _Remover:
    """:class:`~expstore.retention.eviction.Remove` for one eviction: :func:`remove` in
    the caller's transaction."""

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
        last = doomed[-1]
        where = LazyWhere(lambda: [rows.c.buffer_id == b, rows.c.key <= last])
        return remove(
            handle, self.conn, where, reason, self.policy, self.removed, self.state, doomed
        )


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


class RetentionSetting(NamedTuple):
    """A buffer's retention as every writer reads it (``buffer.retention()``), what
    ``buffer.set_retention`` sets."""

    #: At most this many rows stay after every write (None: unlimited).
    capacity: int | None
    #: Which rows go beyond it: ``"fifo"``, ``"max_reward"``, ``"task_fifo"``, ``"stale"``.
    eviction: str
    #: The ``"stale"`` policy's k: rows more than k policy versions behind go (None: unset).
    stale_after: int | None
    #: How many tombstones of rows gone the buffer keeps, the newest.
    tombstones: int


def read_retention(handle: BufferHandle) -> RetentionSetting:
    """The buffer's retention, as stored with it."""
    kept = select(
        buffers.c.capacity, buffers.c.eviction, buffers.c.stale_after, buffers.c.keep_tombstones
    ).where(buffers.c.id == handle.buffer_id)
    with handle.errors("read the retention"), handle.read() as conn:
        capacity, eviction, stale_after, keep = conn.execute(kept).one()
    return RetentionSetting(
        None if capacity is None else int(capacity),
        eviction or "fifo",
        None if stale_after is None else int(stale_after),
        tombstones.keep_setting(keep),
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

    reads_unlocked = True  # (no hook before the insert)

    def settings_columns(self, columns: Sequence[Any]) -> Sequence[Any]:
        return columns[:2]  # not the row count

    def quiet_after(self, ctx: WriteContext, setting: Any) -> bool:
        return not setting.evicts

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
    stale_after: int | None = None,
    keep_tombstones: int | None = None,
) -> tuple[int, str]:
    """Change the buffer's capacity and policy (None: keep the current one) for every
    writer; rows beyond the new capacity go in the same transaction. ``stale_after`` is
    the ``"stale"`` policy's k (kept with the buffer; None: keep the one stored);
    ``keep_tombstones`` how many tombstones the buffer keeps (None: keep the setting; the
    oldest beyond a smaller one go now). Returns (how many rows went, the policy now in
    force)."""
    check_retention(capacity, eviction)
    check_int("stale_after", stale_after, minimum=0, optional=True)
    check_int("tombstones", keep_tombstones, minimum=0, optional=True)
    with handle.errors("change the retention"), handle.write() as conn:
        current, stored_k = lock_buffer(handle, conn, buffers.c.eviction, buffers.c.stale_after)
        policy = eviction or current or "fifo"
        if stale_after is not None:
            stored_k = stale_after
        if policy == "stale" and stored_k is None:
            raise InvalidArgumentError(
                'eviction="stale" drops rows more than stale_after versions behind the '
                'current policy version; give it: buffer.set_retention(capacity, "stale", '
                "stale_after=k). Nothing was changed"
            )
        values: dict[str, Any] = {
            "capacity": capacity,
            "eviction": policy,
            "stale_after": stored_k,
        }
        if keep_tombstones is not None:
            values["keep_tombstones"] = keep_tombstones
        conn.execute(update(buffers).where(buffers.c.id == handle.buffer_id).values(values))
        if keep_tombstones is not None:
            keep, last = tombstones.kept_tombstones(conn, handle.buffer_id)
            tombstones.trim(conn, handle.buffer_id, keep, last)
        evicted = evict_beyond(handle, conn, capacity, policy)
    return int(evicted), policy
