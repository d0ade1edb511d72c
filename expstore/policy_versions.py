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

from typing import Any, NamedTuple, TypeVar

import numpy as np
from sqlalchemy import Connection, bindparam, func, or_, select, true, update
from sqlalchemy.sql.elements import ColumnElement

from ._args import check_int
from .db.handle import BufferHandle
from .db.schema import buffers, loose_scan, rows
from .errors import PolicyVersionError
from .lifecycle.registry import lock_buffer
from .retention.capacity import evict_beyond
from .retention.eviction import EVERY_WRITE_POLICIES

_T = TypeVar("_T")

__all__ = [
    "fresh",
    "FreshBounds",
    "current_version",
    "first_fresh_key",
    "last_stale_key",
    "fresh_clause",
    "fresh_mask",
    "oldest_fresh",
    "check_version",
    "set_version",
    "set_version_in",
]


def current_version(handle: BufferHandle) -> int | None:
    """The buffer's current policy version (None: never set)."""
    stmt = select(buffers.c.policy_version).where(buffers.c.id == handle.buffer_id)
    with handle.errors("read the policy version"), handle.read() as conn:
        value = conn.execute(stmt).scalar_one()
    return None if value is None else int(value)


def check_version(version: Any) -> int:
    """``version`` as a policy version (an int from 0 to 2**63 - 1), or the typed error."""
    checked = check_int("version", version, minimum=0)
    if checked > 2**63 - 1:
        raise PolicyVersionError(f"version must be below 2**63, got {checked}")
    return checked


def set_version(handle: BufferHandle, version: Any, *, force: bool = False) -> int:
    """Make ``version`` the buffer's current policy version for every process; returns how
    many rows the ``"stale"`` eviction policy deleted with it (in the same transaction).

    A version lower than the current one raises PolicyVersionError unless ``force``."""
    version = check_version(version)
    with handle.errors("set the policy version"), handle.write() as conn:
        return set_version_in(handle, conn, version, force=force)


def set_version_in(handle: BufferHandle, conn: Connection, version: int, *, force: bool) -> int:
    """:func:`set_version` of a checked ``version`` in the caller's transaction (a
    learner's training step, see :mod:`expstore.claims.steps`)."""
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
    return evict_beyond(handle, conn, capacity, policy)


def fresh(version: Any, oldest: Any) -> ColumnElement[bool]:
    """The freshness rule in SQL: a row whose ``version`` (a group: its oldest row's) is
    ``oldest`` or newer, or that has none, is fresh. (:func:`fresh_mask` states it over
    a key index's arrays; the ``"stale"`` eviction policy deletes its complement, see
    :mod:`expstore.retention.eviction`.)"""
    return or_(version.is_(None), version >= oldest)


def fresh_clause(buffer_id: int, max_staleness: int) -> ColumnElement[bool]:
    """Rows no more than ``max_staleness`` versions behind the buffer's current version,
    read by the statement itself (no round trip of its own, one snapshot with the rest)."""
    this = buffers.c.id == buffer_id
    oldest = select(buffers.c.policy_version - max_staleness).where(this).scalar_subquery()
    return fresh(rows.c.policy_version, func.coalesce(oldest, -1))


def oldest_fresh(current: int | None, max_staleness: int | None) -> int | None:
    """The oldest version a fresh row may have, ``current - max_staleness``; None when
    every row is fresh (no limit, or no current version)."""
    if max_staleness is None or current is None:
        return None
    return current - max_staleness


def first_fresh_key(handle: BufferHandle, conn: Connection, oldest: int) -> int | None:
    """The smallest key of a row of the buffer that is fresh when ``oldest`` is the oldest
    fresh version (a version of ``oldest`` or newer, or none), by one index probe per
    fresh version (a loose scan of the ``(buffer_id, policy_version)`` index) and one for
    the rows without a version; None when no row is fresh, or when more than the handle's
    ``tuning.fresh_versions`` versions are (the caller then does without the bound)."""
    mine = rows.c.buffer_id == handle.buffer_id
    version = rows.c.policy_version
    limit = handle.tuning.fresh_versions

    def build() -> Any:  # compiled per handle, with its limit
        fresh = loose_scan(version, mine, start=bindparam("oldest"))
        versions = fresh.limit(limit + 1).subquery()
        first = select(rows.c.key).where(mine, version == versions.c.v)
        first_of = first.order_by(rows.c.key).limit(1).scalar_subquery()
        unversioned = select(rows.c.key).where(mine, version.is_(None))
        unversioned_first = unversioned.order_by(rows.c.key).limit(1).scalar_subquery()
        return select(func.count(), func.min(first_of), unversioned_first).select_from(versions)

    ((count, versioned, unversioned),) = handle.statement(("first fresh key",), build).run(
        conn, oldest=int(oldest)
    )
    if count > limit:
        return None
    found = [int(k) for k in (versioned, unversioned) if k is not None]
    return min(found) if found else None


def last_stale_key(
    handle: BufferHandle, conn: Connection, oldest: int, after: int | None = None
) -> tuple[bool, int | None]:
    """Whether it is known, and the largest key of a row of the buffer that is stale when
    ``oldest`` is the oldest fresh version (None: no stale row). Over the whole buffer by
    one index probe per stale version, newest first (unknown beyond the handle's
    ``tuning.fresh_versions`` of them); with ``after``, among the rows with larger keys
    only, by their key range (the rows stored since)."""
    mine = rows.c.buffer_id == handle.buffer_id
    version = rows.c.policy_version
    limit = handle.tuning.fresh_versions
    if after is not None:

        def since() -> Any:
            newer = rows.c.key > bindparam("after")
            return select(func.max(rows.c.key)).where(mine, newer, _stale_row_by_row())

        ((found,),) = handle.statement(("last stale key since",), since).run(
            conn, oldest=int(oldest), after=int(after)
        )
        return True, None if found is None else int(found)

    def build() -> Any:
        versions = _stale_versions(mine, limit)
        last = select(rows.c.key).where(mine, version == versions.c.v)
        last_of = last.order_by(rows.c.key.desc()).limit(1).scalar_subquery()
        return select(func.count(), func.max(last_of)).select_from(versions)

    ((count, last),) = handle.statement(("last stale key",), build).run(conn, oldest=int(oldest))
    if count > limit:
        return False, None
    return True, None if last is None else int(last)


def stale_keys(
    handle: BufferHandle, conn: Connection, oldest: int, start: int, stop: int, limit: int
) -> np.ndarray | None:
    """The keys from ``start`` to ``stop`` of the buffer's rows stale when ``oldest`` is
    the oldest fresh version (late rollouts of older policies among the fresh rows),
    sorted; None when there are more than ``limit``. On SQLite with at most the handle's
    ``tuning.fresh_versions`` stale versions, one index range per stale version; otherwise
    (and on Postgres, which would hash the fresh rows against the versions anyway) a read
    of the key range."""
    mine = rows.c.buffer_id == handle.buffer_id
    version = rows.c.policy_version
    within = rows.c.key.between(bindparam("start"), bindparam("stop"))
    params = {"oldest": int(oldest), "start": int(start), "stop": int(stop), "limit": limit + 1}
    most = handle.tuning.fresh_versions

    def by_version() -> Any:
        versions = _stale_versions(mine, most)
        counted = select(func.count().label("n")).select_from(versions).subquery()
        late = (
            select(rows.c.key)
            .where(mine, version.in_(select(versions.c.v)), within)
            .limit(bindparam("limit"))
            .subquery()
        )
        # (one row at least: the count, with no key when no stale row lies there)
        return select(counted.c.n, late.c.key).select_from(counted.outerjoin(late, true()))

    def by_range() -> Any:
        stale = _stale_row_by_row()
        return select(rows.c.key).where(mine, within, stale).limit(bindparam("limit"))

    keys = None
    if handle.dialect.name != "postgresql":
        found = handle.statement(("stale keys by version",), by_version).run(conn, **params)
        if found[0][0] <= most:
            keys = [k for _, k in found if k is not None]
    if keys is None:
        ranged = handle.statement(("stale keys by range",), by_range).run(conn, **params)
        keys = [k for (k,) in ranged]
    return None if len(keys) > limit else np.sort(np.array(keys, dtype=np.int64))


def _stale_versions(mine: ColumnElement[bool], limit: int) -> Any:
    """The buffer's versions older than the bound ``oldest``, newest first, one index
    probe each (a loose scan), at most ``limit`` + 1 of them."""
    stale = loose_scan(rows.c.policy_version, mine, below=bindparam("oldest"))
    return stale.limit(limit + 1).subquery()


def _stale_row_by_row() -> ColumnElement[bool]:
    """A row older than the bound ``oldest``, for a statement reading a key range: "+ 0"
    keeps the planner on that range, where the version's index would read every stale
    row."""
    return (rows.c.policy_version + 0) < bindparam("oldest")


class _Late(NamedTuple):
    keys: np.ndarray | None  # None: more than the limit
    low: int  # read from this key on
    seen: int  # up to this one


class _Stale(NamedTuple):
    known: bool  # False: too many stale versions to tell
    last: int | None  # the largest stale key among keys up to ``seen``
    seen: int


class FreshBounds:
    """Where a buffer's fresh rows lie, found once per oldest fresh version and database
    server and kept by a storage across draws (see
    :attr:`~expstore.storage.key_space.KeySpace.low`).

    Keys are handed out in commit order and rows are never changed, so what is found stays
    true while the oldest fresh version does not move: rows stored later have larger keys
    (the first fresh key stays a lower bound of the fresh rows' keys; the last stale key
    is brought up to date by reading the stale ones among the rows stored since), and
    rows deleted only make either bound looser. That holds along one server's history;
    a replica behind another server could still hold stale rows that server has deleted,
    so what is found is kept per server (the connection's URL)."""

    #: (server, oldest fresh version) pairs remembered (a few samplers' staleness).
    KEEP = 8

    def __init__(self) -> None:
        self._first: dict[tuple[str, int], int] = {}
        self._stale: dict[tuple[str, int], _Stale] = {}
        self._late: dict[tuple[str, int], _Late] = {}

    def clear(self) -> None:
        self._first.clear()
        self._stale.clear()
        self._late.clear()

    def first(self, handle: BufferHandle, conn: Connection, oldest: int) -> int | None:
        """A lower bound of the keys of the rows fresh at ``oldest`` (None: none known)."""
        at = (_server(conn), oldest)
        found = self._first.get(at)
        if found is None:
            found = first_fresh_key(handle, conn, oldest)
            if found is not None:
                _remember(self._first, at, found, self.KEEP)
        return found

    def stale_from(
        self, handle: BufferHandle, conn: Connection, oldest: int, low: int, max_key: int
    ) -> bool:
        """Whether a row stale at ``oldest`` may have a key of ``low`` or more (the rows up
        to ``max_key`` read)."""
        at = (_server(conn), oldest)
        known = self._stale.get(at)
        if known is None:
            found, last = last_stale_key(handle, conn, oldest)
            known = _Stale(found, last, max_key)
        elif known.known and max_key > known.seen:
            _, newer = last_stale_key(handle, conn, oldest, after=known.seen)
            last = known.last if newer is None else newer
            known = _Stale(True, last, max_key)
        _remember(self._stale, at, known, self.KEEP)
        return not known.known or (known.last is not None and known.last >= low)

    def late(
        self,
        handle: BufferHandle,
        conn: Connection,
        oldest: int,
        low: int,
        max_key: int,
        limit: int,
    ) -> np.ndarray | None:
        """The keys from ``low`` to ``max_key`` of rows stale at ``oldest`` (see
        :func:`stale_keys`), sorted; None when more than ``limit``. Read once per oldest
        fresh version and server, then among the rows stored since alone."""
        at = (_server(conn), oldest)
        known = self._late.get(at)
        if known is None or low < known.low or max_key < known.seen:
            keys = stale_keys(handle, conn, oldest, low, max_key, limit)
        elif max_key > known.seen and known.keys is not None:
            newer = stale_keys(handle, conn, oldest, known.seen + 1, max_key, limit)
            keys = None if newer is None else np.union1d(known.keys, newer)
        else:
            keys = known.keys
        if keys is not None:
            keys = keys[keys >= low]
            if len(keys) > limit:
                keys = None
        _remember(self._late, at, _Late(keys, low, max_key), self.KEEP)
        return keys


def _server(conn: Connection) -> str:
    """Which database server ``conn`` reads (the primary or a replica): its engine's URL."""
    return str(conn.engine.url)


def _remember(cache: dict[tuple[str, int], _T], at: tuple[str, int], value: _T, keep: int) -> None:
    if at not in cache and len(cache) >= keep:
        cache.clear()
    cache[at] = value


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
