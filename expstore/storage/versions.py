"""Policy versions: the trainer's current version, kept with the buffer, and what is stale.

The trainer publishes the version of the policy it trains (``set_policy_version``); actors
stamp each row with the version that produced it (``ExpMeta.policy_version``). A row's
*staleness* is ``current - row version``; with ``max_staleness=k`` samplers and claims
leave out rows whose staleness exceeds ``k`` (version < current - k), and the eviction
policy ``"stale"`` deletes them at each write.

Rules, the same in SQL (claims, eviction) and in numpy (samplers):

- rows without a version (NULL: demonstrations, rows stored before versions were used)
  are never stale;
- while the buffer has no current version (never set), no row is stale.

The version lives in ``expstore_buffers.policy_version``; every process reads the same
value. It only goes up unless a caller forces it down (a restored older checkpoint).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import func, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from .._args import check_int
from ..errors import PolicyVersionError
from . import task_stats
from .eviction import EVERY_WRITE_POLICIES
from .handle import BufferHandle
from .registry import evict_beyond, lock_buffer
from .schema import buffers, rows

__all__ = [
    "check_staleness",
    "current_version",
    "fresh_clause",
    "fresh_mask",
    "set_version",
]


def check_staleness(max_staleness: Any) -> int | None:
    """``max_staleness`` as None or an int >= 0 (0: only rows of the current version)."""
    return check_int("max_staleness", max_staleness, minimum=0, optional=True)


def current_version(handle: BufferHandle) -> int | None:
    """The buffer's current policy version (None: never set)."""
    stmt = select(buffers.c.policy_version).where(buffers.c.id == handle.buffer_id)
    with handle.errors("read the policy version"), handle.read() as conn:
        value = conn.execute(stmt).scalar_one()
    return None if value is None else int(value)


def set_version(handle: BufferHandle, version: Any, *, force: bool = False) -> int:
    """Make ``version`` the buffer's current policy version for every process; returns how
    many rows the ``"stale"`` eviction policy deleted with it (in the same transaction).

    A version lower than the current one raises PolicyVersionError unless ``force``."""
    version = check_int("version", version, minimum=0)
    if version > 2**63 - 1:
        raise PolicyVersionError(f"version must be below 2**63, got {version}")
    with handle.errors("set the policy version"), handle.write() as conn:
        current, capacity, policy = lock_buffer(
            handle, conn, buffers.c.policy_version, buffers.c.capacity, buffers.c.eviction
        )
        if current is not None and version < current and not force:
            raise PolicyVersionError(
                f"buffer {handle.name!r} is at policy version {current}; {version} would go "
                "backwards, which makes rows of newer versions look like the future. Pass "
                "force=True to set it anyway (e.g. after restoring an older checkpoint). "
                "Nothing was changed"
            )
        conn.execute(
            update(buffers).where(buffers.c.id == handle.buffer_id).values(policy_version=version)
        )
        if policy not in EVERY_WRITE_POLICIES:
            return 0
        return evict_beyond(
            handle, conn, capacity, policy, task_stats.state(conn, handle.buffer_id)
        )


def fresh_clause(buffer_id: int, max_staleness: int) -> ColumnElement[bool]:
    """Rows no more than ``max_staleness`` versions behind the buffer's current version,
    read by the statement itself (no round trip of its own, one snapshot with the rest)."""
    this = buffers.c.id == buffer_id
    oldest = select(buffers.c.policy_version - max_staleness).where(this).scalar_subquery()
    return or_(
        rows.c.policy_version.is_(None),
        rows.c.policy_version >= func.coalesce(oldest, -1),
    )


def fresh_mask(versions: np.ndarray, current: int | None, max_staleness: int) -> np.ndarray | None:
    """Which rows of a key index (``policy_version`` as float64, NaN for none) are fresh,
    by the rules above; None when every row is."""
    if current is None:
        return None
    oldest = current - max_staleness
    with np.errstate(invalid="ignore"):
        stale = versions < oldest  # NaN compares False: rows without a version stay
    if not stale.any():
        return None
    return ~stale
