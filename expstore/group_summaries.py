"""Groups of rows (GRPO: all rollouts of one prompt), summarised in SQL and cached.

:class:`GroupIndex` keeps, per (condition, group spec), one entry per group of the matching
rows: its key value, how many rows it has (counting its first ``size`` rows by insertion,
the rows a group sampler returns), its version (the oldest ``policy_version`` among them),
whether the spec's group condition holds over them, and its first key. The statistics are
computed by the database (``GROUP BY`` over ``row_number() OVER (PARTITION BY ...)``), never
by loading the groups' rows into Python, and brought up to date like the key index
(:mod:`expstore.storage.key_index`): at the same signature as they are; after inserts, only
the groups the new rows belong to are summarised again; after FIFO eviction, the groups
that lost rows too; after any other change, all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import Connection, and_, bindparam, case, func, literal, not_, or_, select
from sqlalchemy.sql.elements import ColumnElement

from .db.handle import BufferHandle
from .db.schema import rows
from .lifecycle.reader_state import Signature, StateReader
from .policy_versions import fresh
from .query import QueryCondition, condition_key
from .query.fields import resolve_field
from .query.groups import GroupCondition

__all__ = [
    "GroupIndex",
    "GroupSpec",
    "count_groups",
    "group_column",
    "groups_first_at",
    "summarise",
]

Arrays = dict[str, Any]


class GroupSpec(NamedTuple):
    """How rows form groups: by the value at ``group_by`` (a column or a payload path),
    ``size`` rows each, kept when ``having`` (if any) holds over them."""

    group_by: str
    size: int
    having: GroupCondition | None = None

    @property
    def key(self) -> str:
        return f"{self.group_by}|{self.size}|{self.having}"


class _Entry(NamedTuple):
    signature: Signature
    arrays: Arrays
    positions: dict[Any, int]


class GroupIndex:
    """The cached group summaries of one buffer."""

    CAPACITY = 8

    def __init__(
        self,
        handle: BufferHandle,
        state: StateReader,
    ) -> None:
        self.handle = handle
        #: Reads the buffer's state (see :data:`~expstore.lifecycle.reader_state.StateReader`).
        self.state = state
        self.entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        #: Groups summarised so far, to see what refreshing costs.
        self.groups_read = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "entries": OrderedDict()}

    def clear(self) -> None:
        self.entries.clear()

    # -- statements ----------------------------------------------------------------------
    def _summaries(
        self, conn: Connection, query_condition: QueryCondition, spec: GroupSpec, *where: Any
    ) -> list[Any]:
        found = summarise(self.handle, conn, query_condition, spec, *where)
        self.groups_read += len(found)
        return found

    # -- reading -------------------------------------------------------------------------
    def get(self, query_condition: QueryCondition, spec: GroupSpec) -> Arrays:
        """Arrays over the groups: ``group`` (values), ``size`` (rows, up to spec.size),
        ``version`` (oldest policy_version, NaN for none), ``passes`` (the group condition
        holds), ``first`` (first key), ``keys`` (a row of spec.size keys per group, in
        insertion order, -1 past its size); and ``current_version``, the buffer's policy
        version."""
        cache_key = (condition_key(query_condition), spec.key)
        with self.handle.errors("summarise groups"), self.handle.read() as conn:
            signature, current, _ = self.state(conn)
            cached = self.entries.get(cache_key)
            if cached is not None:
                self.entries.move_to_end(cache_key)
            if cached is None or cached.signature.version != signature.version:
                entry = self._full(conn, query_condition, spec, signature)
            elif cached.signature[:3] != signature[:3]:
                entry = self._refresh(conn, query_condition, spec, signature, cached)
            else:
                entry = cached
        self.entries[cache_key] = entry
        while len(self.entries) > self.CAPACITY:
            self.entries.popitem(last=False)
        return {**entry.arrays, "current_version": current}

    def _full(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        signature: Signature,
    ) -> _Entry:
        found = self._summaries(conn, query_condition, spec, rows.c.key <= signature.max_key)
        arrays = _arrays(found, spec.size)
        positions = {g: i for i, g in enumerate(arrays["group"].tolist())}
        return _Entry(signature, arrays, positions)

    def _refresh(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        signature: Signature,
        cached: _Entry,
    ) -> _Entry:
        """Summarise again the groups with new rows, and those FIFO eviction took rows of."""
        arrays = cached.arrays
        group = group_column(self.handle, spec)
        new_rows = select(group).where(
            *self.handle.where(query_condition),
            rows.c.key > cached.signature.max_key,
            rows.c.key <= signature.max_key,
        )
        lost = arrays["group"][(arrays["first"] < signature.min_key) & (arrays["size"] > 0)]
        touched: Any = group.in_(new_rows.scalar_subquery())
        if len(lost):
            lost_values: Any = bindparam("lost", lost.tolist(), expanding=True)
            touched = or_(touched, group.in_(lost_values))
        # Without the signature's key bound, which would lead SQLite to walk the whole
        # buffer by key: a group may count a row committed since, which is harmless (it is
        # summarised again when the index next moves past it).
        found = self._summaries(conn, query_condition, spec, touched)
        if not found and not len(lost):
            return _Entry(signature, arrays, cached.positions)
        update = _arrays(found, spec.size)
        positions = dict(cached.positions)
        columns = {name: value.copy() for name, value in arrays.items()}
        for g in lost.tolist():  # a group evicted whole is not found again: empty it
            columns["size"][positions[g]] = 0
            columns["keys"][positions[g]] = -1
        appended: list[int] = []
        for i, g in enumerate(update["group"].tolist()):
            at = positions.get(g)
            if at is None:
                positions[g] = len(positions)
                appended.append(i)
            else:
                for name in columns:
                    columns[name][at] = update[name][i]
        if appended:
            columns = {
                name: np.concatenate([columns[name], update[name][appended]]) for name in columns
            }
        for value in columns.values():
            value.flags.writeable = False
        return _Entry(signature, columns, positions)

    def claimable(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        free: ColumnElement[bool],
        limit: int,
        oldest: int | None = None,
    ) -> list[Any]:
        """Up to ``limit`` complete groups, oldest first, whose rows all satisfy ``free``
        (claimable now), that pass the spec's condition and, with ``oldest``, whose oldest
        version is that or newer (or none): (group value, oldest version)."""
        ranked = _ranked(self.handle, query_condition, spec, extra_columns=[free.label("free")])
        held: Any = ranked.c.free
        conditions = [func.count() == spec.size, func.min(case((held, 1), else_=0)) == 1]
        if oldest is not None:  # stale groups must not crowd out the fresh ones in limit
            conditions.append(fresh(func.min(ranked.c.policy_version), oldest))
        if spec.having is not None:
            conditions.append(spec.having.to_sql({c.name: c for c in ranked.c}))
        stmt = (
            select(ranked.c.g, func.min(ranked.c.policy_version))
            .where(ranked.c.rn <= spec.size)
            .group_by(ranked.c.g)
            .having(*conditions)
            .order_by(func.min(ranked.c.key))
            .limit(limit)
        )
        return list(conn.execute(stmt).all())

    def keys(
        self,
        query_condition: QueryCondition,
        spec: GroupSpec,
        groups: Sequence[Any],
        *,
        conn: Connection | None = None,
    ) -> list[np.ndarray]:
        """The keys of the first ``spec.size`` matching rows of each group (in insertion
        order), group by group as given; a group's array is shorter if rows went."""
        if not len(groups):
            return []
        group = group_column(self.handle, spec)
        ranked = _ranked(
            self.handle,
            query_condition,
            spec,
            group.in_(bindparam("groups", list(groups), expanding=True)),
        )
        stmt = (
            select(ranked.c.g, ranked.c.key)
            .where(ranked.c.rn <= spec.size)
            .order_by(ranked.c.g, ranked.c.key)
        )
        if conn is not None:
            found = conn.execute(stmt).all()
        else:
            with self.handle.errors("read group rows"), self.handle.read() as read:
                found = read.execute(stmt).all()
        per: dict[Any, list[int]] = {}
        for g, key in found:
            per.setdefault(g, []).append(int(key))
        return [np.asarray(per.get(g, ()), dtype=np.int64) for g in groups]


def group_column(handle: BufferHandle, spec: GroupSpec) -> ColumnElement[Any]:
    """The value rows are grouped by: a column, or a payload path as text."""
    path = resolve_field(spec.group_by)
    if path.column is not None:
        return rows.c[path.column.name]
    return handle.dialect.json_text(path)


def _ranked(
    handle: BufferHandle,
    query_condition: QueryCondition,
    spec: GroupSpec,
    *where: Any,
    extra_columns: Sequence[Any] = (),
    by_group: bool = False,
) -> Any:
    """The matching rows with their group value and rank within the group. ``by_group``:
    the rows are found through the group column's index (``where`` names a few groups);
    the rank's order is then written so that SQLite does not walk the buffer's key index
    instead to serve it (it did: 220 ms for one group of a buffer of 1M rows)."""
    group = group_column(handle, spec)
    read = sorted(spec.having.columns) if spec.having is not None else []
    order = rows.c.key + 0 if by_group else rows.c.key
    rank = func.row_number().over(partition_by=group, order_by=order)
    return (
        select(
            group.label("g"),
            rows.c.key,
            rows.c.policy_version,
            *(rows.c[name] for name in read if name != "policy_version"),
            rank.label("rn"),
            *extra_columns,
        )
        .where(*handle.where(query_condition), group.is_not(None), *where)
        .subquery("ranked")
    )


def summarise(
    handle: BufferHandle,
    conn: Connection,
    query_condition: QueryCondition,
    spec: GroupSpec,
    *where: Any,
    by_group: bool = False,
) -> list[Any]:
    """The summaries of the groups of the matching rows that ``where`` selects: (group
    value, rows up to ``spec.size``, oldest version, whether ``having`` holds, first key,
    keys as text), a row per group, by the database (``by_group``: see :func:`_ranked`)."""
    stmt = _summaries_of(handle, query_condition, spec, *where, by_group=by_group)
    return list(conn.execute(stmt).all())


def _summaries_of(
    handle: BufferHandle,
    query_condition: QueryCondition,
    spec: GroupSpec,
    *where: Any,
    keys: bool = True,
    by_group: bool = False,
) -> Any:
    """The statement of :func:`summarise` (without the keys' text when ``keys`` is False)."""
    ranked = _ranked(handle, query_condition, spec, *where, by_group=by_group)
    passes: Any = literal(True)
    if spec.having is not None:
        held = spec.having.to_sql({c.name: c for c in ranked.c})
        passes = case((held, literal(True)), else_=literal(False))
    listed = [handle.dialect.keys_text(ranked.c.key).label("keys")] if keys else []
    return (
        select(
            ranked.c.g,
            func.count().label("n"),
            func.min(ranked.c.policy_version).label("version"),
            passes.label("passes"),
            func.min(ranked.c.key).label("first"),
            *listed,
        )
        .where(ranked.c.rn <= spec.size)
        .group_by(ranked.c.g)
    )


def count_groups(
    handle: BufferHandle,
    conn: Connection,
    query_condition: QueryCondition,
    spec: GroupSpec,
    oldest: int | None,
) -> tuple[int, int, int, int]:
    """How many groups of the matching rows are ready (complete, passing, fresh when
    ``oldest`` is the oldest fresh version), waiting for rows, filtered out by ``having``
    and stale: one aggregate over the summaries in the database, which holds nothing per
    group on the caller's side (it still reads every matching row)."""
    summary = _summaries_of(handle, query_condition, spec, keys=False).subquery("summary")
    complete = summary.c.n == spec.size
    passing = and_(complete, summary.c.passes)
    ready = passing if oldest is None else and_(passing, fresh(summary.c.version, oldest))

    def total(condition: Any) -> Any:
        return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)

    stmt = select(
        total(ready),
        total(summary.c.n < spec.size),
        total(and_(complete, not_(summary.c.passes))),
        total(and_(passing, not_(ready))),
    )
    ready_n, waiting, filtered, stale = conn.execute(stmt).one()
    return int(ready_n), int(waiting), int(filtered), int(stale)


def groups_first_at(
    handle: BufferHandle,
    conn: Connection,
    query_condition: QueryCondition,
    spec: GroupSpec,
    keys: Sequence[int],
) -> tuple[Arrays, int]:
    """:func:`summarise` of the groups whose first matching row is one of ``keys`` (any
    candidate keys), as arrays (see :meth:`GroupIndex.get`). Two statements through the group
    column's index: each group's first key, then the summaries of the groups that begin at
    one of ``keys``; and how many rows the first statement counted."""
    group = group_column(handle, spec)

    def of(chosen: Sequence[int]) -> Any:
        # The group values of these rows, by primary key alone: with the buffer named
        # here, SQLite without statistics walked the buffer's whole group index instead.
        # Another buffer's rows among the keys only add values the buffer clause outside
        # finds no group of, or a group whose first key is not among the candidates.
        return select(group).where(
            rows.c.key.in_(bindparam("of_keys", list(chosen), expanding=True))
        )

    firsts = (
        select(func.min(rows.c.key), func.count())
        .where(*handle.where(query_condition), group.is_not(None), group.in_(of(keys)))
        .group_by(group)
    )
    read = list(conn.execute(firsts))
    starting = sorted({first for first, _ in read} & set(keys))
    found = summarise(handle, conn, query_condition, spec, group.in_(of(starting)))
    return _arrays(found, spec.size), sum(n for _, n in read)


def _arrays(found: Sequence[Any], size: int) -> Arrays:
    columns = list(zip(*found, strict=True)) if found else [()] * 6
    group, counts, version, passes, first, keys = columns
    sizes = np.array(counts, dtype=np.int64)
    out = {
        "group": np.array(group, dtype=object),
        "size": sizes,
        "version": np.array(version, dtype=np.float64),
        "passes": np.array([bool(p) for p in passes], dtype=bool),
        "first": np.array(first, dtype=np.int64),
        "keys": _key_table(keys, sizes, size),
    }
    for value in out.values():
        value.flags.writeable = False
    return out


def _key_table(texts: Sequence[str], counts: np.ndarray, size: int) -> np.ndarray:
    """Each group's keys (comma-separated texts) as a row of a (groups, size) table, in
    insertion order, -1 where a group has fewer than ``size``."""
    table = np.full((len(texts), size), np.iinfo(np.int64).max, dtype=np.int64)
    if len(texts):
        flat = np.array(",".join(texts).split(","), dtype=np.int64)
        rows_ = np.repeat(np.arange(len(texts)), counts)
        starts = np.cumsum(counts) - counts
        cols = np.arange(len(flat)) - np.repeat(starts, counts)
        table[rows_, cols] = flat
        table.sort(axis=1)
    table[table == np.iinfo(np.int64).max] = -1
    return table
