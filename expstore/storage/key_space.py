"""The key space: a buffer's keys as a sampler sees them without holding them.

A key index (:mod:`expstore.storage.key_index`) holds every matching row's key in memory,
which costs time and memory in proportion to the buffer. A :class:`KeySpace` holds a few
numbers instead, read in one round trip with the buffer's signature: the range its keys lie
in (``min_key`` .. ``max_key``: writers hand keys out in commit order and FIFO eviction
removes the oldest) and how many rows it holds (``rows``, kept by every write, see
:mod:`expstore.lifecycle.registry`). A sampler draws candidate keys in that range and asks
:meth:`KeySpace.probe` which of them are rows of the buffer matching the condition (one
indexed lookup per candidate); the ones that are, drawn uniformly, are a uniform draw among
the matching rows (rejection sampling, :mod:`expstore.samplers.flat`). So the cost of a
draw depends on the batch and the share of the range that matches, not on the buffer's
size.

Everything a space reads is read on one connection, at one moment of the buffer as far as
the database's isolation gives: the range and counts first, then each probe. A row deleted
after its probe is chosen again by the sampling loop, as with a key index.

What draws find about their matching rows (a prioritized draw's least priority, a
stratified draw's values held) is kept by each handle from draw to draw
(:class:`KeySpaces`, in a :class:`~expstore.storage.base.Kept`, which says when it still
holds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import Connection, and_, bindparam, func, or_, select

from ..db.compiled import CompiledSelect
from ..db.handle import BufferHandle
from ..db.schema import loose_scan, priorities, rows
from ..draw_counts import unspent_clause
from ..errors import InvalidArgumentError
from ..group_summaries import GroupSpec, count_groups, groups_first_at
from ..lifecycle.reader_state import Signature, StateReader
from ..model.layout import COLUMNS_BY_NAME, ColumnSpec
from ..policy_versions import FreshBounds, fresh_clause
from ..priorities import logged_priorities
from ..query import QueryCondition
from ..query.conditions import has_changed
from ..query.fields import resolve_field
from .base import Arrays, Kept, KeySpace, PriorityBounds
from .key_index import _column, _to_arrays

#: A plan line of SQLite seeking an index on the condition with each candidate key (not
#: the (buffer_id, key) index, which turns no candidate down).
_INDEX_PROBE = re.compile(
    r"USING (COVERING )?INDEX \S+ \(buffer_id=\? AND (?!key=\? AND rowid).+ AND rowid=\?\)"
)

__all__ = ["DISTINCT_LIMIT", "KeySpaces", "SqlKeySpace"]

_T = TypeVar("_T")

#: Spans of steps per statement (an OR of index ranges; a power of two).
_SPAN_CHUNK = 256
#: :meth:`KeySpace.distinct` gives up beyond this many values.
DISTINCT_LIMIT = 1024
#: The largest step a row can have (BIGINT).
_TOP_STEP = 2**63 - 1


class KeySpaces:
    """What one handle's draws over its key space keep from draw to draw (where fresh
    rows lie, what draws found about their matching rows), and how they read a space."""

    def __init__(
        self,
        handle: BufferHandle,
        state: StateReader,
    ) -> None:
        self.handle = handle
        #: Reads the buffer's state (see :data:`~expstore.lifecycle.reader_state.StateReader`).
        self.state = state
        #: Candidate keys probed by draws over the key space so far, to see what a draw
        #: costs.
        self.keys_probed = 0
        #: Where fresh and stale rows lie, by server and oldest fresh version, kept across
        #: draws (see :class:`expstore.policy_versions.FreshBounds`).
        self.fresh_bounds = FreshBounds()
        #: What draws over the key space found about their matching rows (the least
        #: priority, the values held), kept across draws.
        self.kept = Kept()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "kept": Kept()}

    def clear(self) -> None:
        self.fresh_bounds.clear()
        self.kept.clear()

    def draw(
        self,
        query_condition: QueryCondition,
        use: Callable[[SqlKeySpace], _T],
        *,
        max_staleness: int | None = None,
        consume_after: int | None = None,
        snapshot: bool = False,
    ) -> _T:
        """``use(space)`` over the buffer's :class:`KeySpace` read now (range, row count and
        policy version in the state's one round trip); ``snapshot``: all of its statements
        on one snapshot (a transaction's cost)."""
        with self.handle.errors("draw keys"), self.handle.read() as conn:
            if snapshot:  # e.g. priority bounds and probes: a priority updated meanwhile
                self.handle.dialect.snapshot(conn)  # cannot leave the bounds' envelope
            signature, version, count = self.state(conn)
            space = SqlKeySpace(
                self.handle,
                conn,
                query_condition,
                (signature.min_key, signature.max_key, count, version),
                max_staleness,
                consume_after,
                self.fresh_bounds,
                signature,
                self.kept,
            )
            try:
                return use(space)
            finally:
                self.keys_probed += space.probed


class SqlKeySpace(KeySpace):
    """One buffer's key range, row count and policy version, and probes of it, on one
    connection (see the module's docstring). Made by ``storage.key_space(...)``."""

    def __init__(
        self,
        handle: BufferHandle,
        conn: Connection,
        query_condition: QueryCondition,
        state: tuple[int, int, int, int | None],
        max_staleness: int | None = None,
        consume_after: int | None = None,
        fresh_bounds: FreshBounds | None = None,
        signature: Signature | None = None,
        kept: Kept | None = None,
    ) -> None:
        self.handle = handle
        #: What draws found about their matching rows, kept by the handle from draw to
        #: draw (see :class:`Kept`).
        self.kept = Kept() if kept is None else kept
        #: The buffer's signature as this space's freshness check read it.
        self.signature = signature
        self.conn = conn
        self.query_condition = query_condition
        self.max_staleness = max_staleness
        #: Rows drawn this many times by samplers with ``consume_after`` do not match.
        self.consume_after = consume_after
        self.min_key, self.max_key, self.rows, self.current_version = state
        #: Candidate keys probed through this space, to see what a draw cost.
        self.probed = 0
        #: Where fresh rows lie, as found before (see :attr:`low`).
        self._fresh_bounds = FreshBounds() if fresh_bounds is None else fresh_bounds
        self._low: int | None = None
        self._every_key: bool | None = None
        #: The runs :meth:`runs_from` found, by (columns, ordered, key, limit).
        self._found_runs: dict[tuple[Any, ...], tuple[int, ...]] = {}

    @property
    def low(self) -> int:
        """The smallest key a matching row can have: ``min_key``, raised under
        ``max_staleness`` to the first fresh row's key
        (:func:`~expstore.policy_versions.first_fresh_key`), so that draws in a buffer
        whose older versions went stale look for rows in its fresh part alone. Found once
        per oldest fresh version and kept by the storage (a bound it stays, see there);
        may exceed ``max_key`` when no row can match."""
        if self._low is None:
            self._low = self.min_key
            oldest = self.oldest
            if oldest is not None and self.rows:
                bound = self._fresh_bounds.first(self.handle, self.conn, oldest)
                if bound is not None:
                    self._low = max(self.min_key, bound)
        return self._low

    @property
    def every_key_matches(self) -> bool:
        """Whether every key from :attr:`low` to ``max_key`` is a matching row, so a draw
        needs no probe: a dense buffer without a condition or ``consume_after``, whose
        stale rows (under ``max_staleness``) all lie below its first fresh row (the usual
        buffer of an asynchronous run, its versions growing with its keys; see
        :class:`~expstore.policy_versions.FreshBounds`)."""
        if self._every_key is None:
            oldest = self.oldest
            self._every_key = (
                self.dense
                and self.query_condition is None
                and self.consume_after is None
                and (
                    oldest is None
                    or not self._fresh_bounds.stale_from(
                        self.handle, self.conn, oldest, self.low, self.max_key
                    )
                )
            )
        return self._every_key

    def late_stale_keys(self, limit: int) -> np.ndarray | None:
        """The keys from :attr:`low` on of stale rows (late rollouts of older policies
        among the fresh ones), sorted; None when there are more than ``limit`` (kept by
        the storage, see :meth:`~expstore.policy_versions.FreshBounds.late`). Empty
        without ``max_staleness``."""
        oldest = self.oldest
        if oldest is None or not self.rows:
            return np.empty(0, dtype=np.int64)
        return self._fresh_bounds.late(
            self.handle, self.conn, oldest, self.low, self.max_key, limit
        )

    def matching(self) -> list[Any]:
        """The WHERE clauses of the condition, max_staleness and consume_after (the buffer
        aside)."""
        clauses = self.handle.matching(self.query_condition)
        if self.max_staleness is not None:
            clauses.append(fresh_clause(self.handle.buffer_id, self.max_staleness))
        if self.consume_after is not None:
            clauses.append(unspent_clause(self.consume_after))
        return clauses

    def probe(self, keys: np.ndarray, columns: Sequence[str] = ()) -> Arrays:
        """Of the candidate ``keys``, those that are rows of the buffer matching the
        condition (``"key"``, ascending, each once) and their ``columns``, as the key index
        gives them."""
        handle = self.handle
        names = tuple(columns)
        selected = [_column(n, handle.dialect) for n in names]
        statement, _ = self._probe_statement(names)
        wanted = np.unique(np.asarray(keys, dtype=np.int64)).tolist()
        self.probed += len(wanted)
        buffer_id = handle.buffer_id
        found: list[Any] = []
        # The buffer is checked here: in the WHERE clause it would lead SQLite through the
        # (buffer_id, key) index and then the table instead of the table alone.
        for part in _chunks(wanted, handle.tuning.probe_chunk):
            chunk = handle.dialect.key_set(part)
            found += [r[:-1] for r in statement.run(self.conn, keys=chunk) if r[-1] == buffer_id]
        found.sort(key=lambda r: r[0])
        return _to_arrays(found, selected)

    def compiled_key(self) -> tuple[Any, ...]:
        """:meth:`condition_key` for the statements compiled with the condition: with the
        buffer's version when it holds a ``changed()``, so that they are compiled again when
        the version moves (tracking or untracking a path bumps it, and a path's slot in the
        rows' flags may go to another path) and follow another process's tracking."""
        key = self.condition_key()
        if self.signature is not None and has_changed(self.query_condition):
            key = (*key, self.signature.version)
        return key

    def _probe_statement(self, names: tuple[str, ...]) -> tuple[CompiledSelect, bool]:
        """The statement probing candidate keys (reading ``names`` too), and whether
        SQLite answers it by an index on the condition (see :meth:`_covers`)."""
        handle = self.handle
        selected = [_column(n, handle.dialect) for n in names]

        def build(covering: bool = False) -> Any:  # only when not compiled yet
            clauses = self.matching()
            if covering:
                clauses.insert(0, rows.c.buffer_id == handle.buffer_id)
            chosen = select(rows.c.key, *(c.selected for c in selected), rows.c.buffer_id)
            return chosen.where(handle.dialect.key_in(), *clauses)

        key = ("probe", self.compiled_key(), names)
        if handle.dialect.name == "postgresql":
            # With the buffer in the WHERE clause, the (buffer_id, key) index, or under a
            # condition an index (buffer_id, column, key) on its column, answers the probe
            # alone (an index-only scan; see schema._column_indexes); without it, Postgres
            # reads each candidate's table row (a random page of a large table).
            return handle.statement((*key, "covering"), lambda: build(True)), False
        statement = handle.statement(key, build)
        if self.query_condition is not None:
            covering = handle.statement((*key, "covering"), lambda: build(True))
            if self._covers(key, covering):
                return covering, True
        return statement, False

    def condition_indexed(self) -> bool:
        """Whether SQLite finds the rows of the condition by an index on it (a condition
        on an indexed column or expression; see :meth:`_covers`)."""
        return self._probe_statement(())[1]

    def _covers(self, key: tuple[Any, ...], statement: CompiledSelect) -> bool:
        """Whether SQLite would probe ``statement`` (its condition, the buffer and the
        keys) by seeking an index on the condition with each key: a condition on an
        indexed column or expression, whose index holds the rowid. A candidate that does
        not match is then turned down by small index pages, without reading its table
        row (a tenth of the pages for the benchmarks' rows, which keeps a filtered draw's
        pages in memory at 10M rows); only matching ones may still read the table, for
        what the index lacks. Asked of the planner once per statement."""
        plans = self.handle.plans
        found = plans.get(key)
        if found is None:
            lines = statement.plan(self.conn, keys=self.handle.dialect.key_set([]))
            found = plans[key] = any(_INDEX_PROBE.search(line) for line in lines)
        return found

    def distinct(self, name: str) -> list[Any] | None:
        """The distinct values of column ``name`` among the buffer's rows, by one index probe
        per value (a loose index scan); None when no index leads with it, the column may be
        NULL, or it has more than :data:`DISTINCT_LIMIT` values."""
        spec = _indexed_column(name)
        if spec is None or spec.nullable:
            return None
        column = rows.c[spec.name]
        buffer_id = self.handle.buffer_id
        mine = rows.c.buffer_id == buffer_id

        def build() -> Any:
            return loose_scan(column, mine).limit(DISTINCT_LIMIT + 1)

        values = [
            r[0] for r in self.handle.statement(("distinct", spec.name), build).run(self.conn)
        ]
        return None if len(values) > DISTINCT_LIMIT else values

    def first_matching(self, name: str, value: Any, start: int) -> int | None:
        """The key of the first matching row holding ``value`` in the indexed column
        ``name`` from key ``start`` on, by the column's index in key order, each row
        checked against the condition, ``max_staleness`` and ``consume_after`` (as far as
        it takes); None when there is none."""
        handle = self.handle
        column = rows.c[name]

        def build() -> Any:
            value: Any = bindparam("value")
            if handle.dialect.name != "postgresql":
                held, order = [column == value], [rows.c.key]
            else:
                # The value as a range and the order by the whole index: with "= value"
                # the order is the key's alone, which Postgres takes from the primary key,
                # walking every row of the buffer when the value's rows match nothing.
                held, order = [column >= value, column <= value], [rows.c.buffer_id, column]
                order.append(rows.c.key)
            mine = rows.c.buffer_id == handle.buffer_id
            after = rows.c.key >= bindparam("start")
            found = select(rows.c.key).where(mine, *held, after, *self.matching())
            return found.order_by(*order).limit(1)

        statement = handle.statement(("first matching", name, self.compiled_key()), build)
        found = statement.run(self.conn, value=value, start=start)
        return int(found[0][0]) if found else None

    def group_summaries(self, spec: GroupSpec, keys: np.ndarray) -> Arrays | None:
        """The summaries of the groups (of the matching rows, by ``spec``) whose first row
        is one of the candidate ``keys``, as
        :meth:`~expstore.group_summaries.GroupIndex.get` gives them; None when the group
        column has no index to find a group's rows by (a payload path, a column without
        one), so that each group would be a scan."""
        if _indexed_column(spec.group_by) is None:
            return None
        found, read = groups_first_at(
            self.handle, self.conn, self.query_condition, spec, np.unique(keys).tolist()
        )
        self.probed += read + int(found["size"].sum())
        return found

    def group_counts(self, spec: GroupSpec) -> tuple[int, int, int, int]:
        """How many groups (of the matching rows, by ``spec``) are ready, waiting, filtered
        and stale under this space's ``max_staleness`` (see
        :func:`~expstore.group_summaries.count_groups`)."""
        return count_groups(self.handle, self.conn, self.query_condition, spec, self.oldest)

    def count_by(self, name: str, values: Sequence[Any]) -> dict[Any, int]:
        """Through the column's index (for ``task_id``, ``(buffer_id, task_id, step)``),
        a few hundred values per statement."""
        column = _column_of(name, "count_by")
        clauses = [rows.c.buffer_id == self.handle.buffer_id, *self.matching()]
        found: dict[Any, int] = {}
        # bound parameters per statement stay few
        for chunk in _chunks(values, self.handle.tuning.probe_chunk):
            stmt = select(column, func.count()).where(*clauses, column.in_(chunk)).group_by(column)
            found.update((value, int(count)) for value, count in self.conn.execute(stmt))
        return found

    def rows_of(self, name: str, values: Sequence[Any], order_by: Sequence[str]) -> np.ndarray:
        """Through the column's index, a few hundred values per statement."""
        column = _column_of(name, "rows_of")
        order = [_column_of(n, "rows_of") for n in order_by]
        mine = rows.c.buffer_id == self.handle.buffer_id
        by_value: dict[Any, list[int]] = {value: [] for value in values}
        for chunk in _chunks(values, self.handle.tuning.probe_chunk):
            stmt = (
                select(column, rows.c.key)
                .where(mine, column.in_(chunk))
                .order_by(column, *order, rows.c.key)
            )
            for value, key in self.conn.execute(stmt):
                by_value[value].append(key)
        self.probed += sum(map(len, by_value.values()))
        return np.array([key for keys in by_value.values() for key in keys], dtype=np.int64)

    def in_ranges(
        self,
        columns: Sequence[str],
        ranged: str,
        spans: Sequence[tuple[tuple[Any, ...], Any, Any]],
    ) -> list[tuple[Any, ...]]:
        """One index range per span (through the ``(buffer_id, task_id, step)`` index for
        trajectories of a task and ranges of steps), spans in OR of a statement."""
        picked = [_column_of(name, "in_ranges") for name in columns]
        within = _column_of(ranged, "in_ranges")
        mine = [rows.c.buffer_id == self.handle.buffer_id, *self.matching()]
        found: list[tuple[Any, ...]] = []
        unique = list(dict.fromkeys(spans))
        for start in range(0, len(unique), _SPAN_CHUNK):
            chunk = unique[start : start + _SPAN_CHUNK]
            # Padded to a power of two with its first span (an OR of the same range twice
            # reads it once): a few statement shapes for the compiled cache, not one per size.
            chunk += chunk[:1] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
            each = [
                and_(
                    *(column == value for column, value in zip(picked, trajectory, strict=True)),
                    within >= low,
                    within <= high,
                )
                for trajectory, low, high in chunk
            ]
            stmt = select(*picked, within, rows.c.key).where(*mine, or_(*each))
            found += [tuple(r) for r in self.conn.execute(stmt)]
        self.probed += len(found)
        return found

    def runs_from(self, columns: Sequence[str], ordered: str, at: Arrays, limit: int) -> np.ndarray:
        """By the rows of each one's next ``limit - 1`` steps (:meth:`in_ranges`, one
        index range per row); what they are is kept for :meth:`windows` of this space."""
        runs = self._runs(columns, ordered, at, limit)
        return np.array([len(run) for run in runs], dtype=np.int64)

    def windows(self, columns: Sequence[str], ordered: str, at: Arrays, length: int) -> np.ndarray:
        runs = self._runs(columns, ordered, at, length)
        table = np.full((len(runs), length), -1, dtype=np.int64)
        for i, run in enumerate(runs):
            if len(run) == length:
                table[i] = run
        return table

    def _runs(
        self, columns: Sequence[str], ordered: str, at: Arrays, limit: int
    ) -> list[tuple[int, ...]]:
        """The keys of each row's run from it on, up to ``limit`` rows (found once per
        space: a draw's windows are those its acceptance read)."""
        places = list(zip(*(at[name].tolist() for name in columns), strict=True))
        steps, keys = at[ordered].tolist(), at["key"].tolist()
        known = self._found_runs
        wanted = [
            (tuple(place), step, key)
            for place, step, key in zip(places, steps, keys, strict=True)
            if (tuple(columns), ordered, key, limit) not in known
        ]
        if wanted:
            # (a run's last step never passes the largest step a row can have)
            spans = [(t, step, min(step + limit - 1, _TOP_STEP)) for t, step, _ in wanted]
            rows_at: dict[tuple[Any, ...], list[int]] = {}
            for *where, key in self.in_ranges(columns, ordered, spans):
                rows_at.setdefault(tuple(where), []).append(key)
            for place, step, key in wanted:
                run = _run_from(rows_at, place, step, key, limit)
                known[(tuple(columns), ordered, key, limit)] = run
        return [known[(tuple(columns), ordered, key, limit)] for key in keys]

    def largest(self, name: str) -> float | None:
        """The largest value of the buffer's indexed numeric column ``name`` (None when no
        row has one, or the largest is not a number), by its ``(buffer_id, name)`` index."""
        spec = COLUMNS_BY_NAME[name]
        if not spec.indexed or spec.kind != "number":
            raise InvalidArgumentError(f"largest() needs an indexed number column, got {name!r}")
        mine = rows.c.buffer_id == self.handle.buffer_id

        def build() -> Any:
            return select(func.max(rows.c[name])).where(mine)

        ((found,),) = self.handle.statement(("largest", name), build).run(self.conn)
        if type(found) not in (int, float):  # None, or text SQLite let in (a damaged row,
            return None  # which the key index reports)
        return float(found)

    def priority_bounds(self) -> PriorityBounds:
        """The buffer's smallest and largest stored priority (None when none is stored), by
        the ``(buffer_id, priority)`` index of the priorities table."""
        mine = priorities.c.buffer_id == self.handle.buffer_id

        def build() -> Any:
            priority = priorities.c.priority
            smallest = select(func.min(priority)).where(mine).scalar_subquery()
            largest = select(func.max(priority)).where(mine).scalar_subquery()
            return select(smallest, largest)

        ((smallest, largest),) = self.handle.statement(("priority bounds",), build).run(self.conn)
        return PriorityBounds(
            None if smallest is None else float(smallest),
            None if largest is None else float(largest),
        )

    def lowest_priority(self, walk: int | None) -> tuple[float, int | None] | None:
        """Found by walking the ``(buffer_id, priority)`` index upward and checking each
        entry's row: through at most ``walk`` entries.

        As far as it takes (``walk`` None), it reads instead:

        - under ``max_staleness`` with stale rows below the first fresh one (``self.low``
          above ``min_key``), the priorities of the keys from ``low`` on, by the priorities'
          primary key: those of the fresh part alone, where the walk would go through every
          stale row's priority first (rows trained on and left with low priorities, while
          the fresh ones have none yet);
        - on Postgres, and on SQLite under a condition it finds by an index, the least of
          all matching priorities, by joining the priorities with the matching rows (on
          Postgres a hash join, where the walk read each entry's row from the table: 4.4 s
          for 1M priorities none of which matches, now 0.47 s; on SQLite through the
          condition's index in key order: 1.1 s, now 0.21-0.23 s), then a row holding it, by
          the priority index. (Under a condition SQLite checks row by row, the walk stays:
          it stops at the first match.)"""
        handle = self.handle
        mine = priorities.c.buffer_id == handle.buffer_id
        if walk is not None:
            form = "walk"
        elif self.low > self.min_key:
            form = "fresh keys"
        elif handle.dialect.name == "postgresql" or self.condition_indexed():
            form = "least of all"
        else:
            form = "walk"
        key = ("least priority", self.compiled_key(), walk is None, form)

        def lowest() -> Any:  # the first `walk` entries of the priority index
            entries = select(priorities.c.key, priorities.c.priority).where(mine)
            return entries.order_by(priorities.c.priority).limit(bindparam("walk")).subquery()

        def joined(entries: Any, *columns: Any) -> Any:
            on = and_(rows.c.key == entries.c.key, rows.c.buffer_id == handle.buffer_id)
            return select(*columns).select_from(entries.join(rows, and_(on, *self.matching())))

        def build() -> Any:
            entries = priorities if walk is None else lowest()
            found = joined(entries, entries.c.priority, entries.c.key)
            if form == "fresh keys":
                # By key alone (the joined row is the buffer's): with the buffer or the
                # priority's order ("+ 0" hides it) the planner would go through the
                # priority index, every stale row's entry first.
                found = found.where(entries.c.key >= bindparam("low"))
                return found.order_by(entries.c.priority + 0).limit(1)
            if walk is None:
                found = found.where(mine)
            if form == "least of all":
                found = found.where(entries.c.priority == bindparam("least"))
            return found.order_by(entries.c.priority).limit(1)

        params: dict[str, Any] = {}
        if form == "least of all":
            # SQLite: "+ 0", not through the priority index (it would walk it, reading each
            # entry's row) but from the matching rows, by the condition's index. (Postgres
            # would misjudge the rows "+ 0" leaves and loop over them instead of hashing.)
            hidden = mine
            if handle.dialect.name != "postgresql":
                hidden = (priorities.c.buffer_id + 0) == handle.buffer_id
            least = handle.statement(
                (*key, "value"),
                lambda: joined(priorities, func.min(priorities.c.priority)).where(hidden),
            )
            ((params["least"],),) = least.run(self.conn)
            if params["least"] is None:
                return (math.inf, None)
        elif form == "fresh keys":
            params["low"] = self.low
        elif walk is not None:
            params["walk"] = walk
        first = handle.statement(key, build).run(self.conn, **params)
        if first:
            return (float(first[0][0]), int(first[0][1]))
        if walk is not None:
            counted = handle.statement(
                ("lowest priorities",), lambda: select(func.count()).select_from(lowest())
            )
            ((entries,),) = counted.run(self.conn, walk=walk)
            if entries >= walk:
                return None
        return (math.inf, None)

    def logged_priorities(self, after: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(keys, priorities) set by priority updates since the buffer's priority version
        ``after``, up to this space's; None when the log no longer reaches back that far
        (see :func:`~expstore.priorities.logged_priorities`)."""
        upto = self.signature.priority_version if self.signature is not None else after
        return logged_priorities(self.handle, self.conn, after, upto)


def _indexed_column(name: str) -> ColumnSpec | None:
    """The column at field ``name`` when an index leads with the buffer and it (an indexed
    column, or ``task_id``'s ``(buffer_id, task_id, step)``); None otherwise (a payload
    path, a column without such an index)."""
    path = resolve_field(name)
    spec = None if path.column is None else COLUMNS_BY_NAME.get(path.column.name)
    return spec if spec is not None and (spec.indexed or spec.name == "task_id") else None


def _column_of(name: str, what: str) -> Any:
    """The rows table's column a field names (``task_id``, ``exp_meta.step``...);
    InvalidArgumentError for a payload path, which has no column to find rows by."""
    column = resolve_field(name).column
    if column is None:
        raise InvalidArgumentError(f"{what}() needs a column, got {name!r}")
    return rows.c[column.name]


def _run_from(
    rows_at: dict[tuple[Any, ...], list[int]],
    trajectory: tuple[Any, ...],
    step: int,
    key: int,
    limit: int,
) -> tuple[int, ...]:
    """The keys of the run of row ``key`` (at ``step`` of ``trajectory``) from it on, up to
    ``limit``, from the rows of the trajectory by step (``rows_at``, by (*trajectory,
    step)); empty when ``key`` is not among them. Rows of a trajectory go by step, then
    key, and a run breaks wherever the step does not go up by exactly 1: so the run goes
    on past a row only when it is the last of its step, to the first of the next step."""
    here = rows_at.get((*trajectory, step), [])
    if key not in here:
        return ()
    run = [key]
    previous = here
    while len(run) < limit and max(previous) == run[-1]:
        following = sorted(rows_at.get((*trajectory, step + len(run)), []))
        if not following:
            break
        run.append(following[0])
        previous = following
    return tuple(run)


def _chunks(values: Sequence[Any], size: int) -> list[list[Any]]:
    """``values`` in lists of at most ``size`` (drivers cap bound parameters; the handle's
    :attr:`~expstore.db.tuning.Tuning.probe_chunk`)."""
    values = list(values)
    return [values[i : i + size] for i in range(0, len(values), size)]
