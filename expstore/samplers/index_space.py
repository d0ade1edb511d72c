"""A key index made a key space: the fast path of every key sampler.

A sampler is written once, against :class:`~expstore.storage.base.KeySpace`
(``KeySampler.choose_flat``). Over the database's key space its draws probe candidate keys
(:mod:`expstore.samplers.flat`); when that does not pay (a rare condition, keys mixed with
other buffers') or the storage has no key space, the same method draws over an
:class:`IndexKeySpace`: the matching rows' cached key index in memory, every row of it a
matching one. Its :attr:`~expstore.storage.base.KeySpace.listed` arrays let
:func:`~expstore.samplers.flat.draw_uniform` draw positions directly (weighted draws by a
cumulative sum kept while the arrays are unchanged, :meth:`IndexKeySpace.remember`)
instead of rejecting candidates, and its probes are binary searches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ..errors import InvalidArgumentError
from ..group_summaries import GroupSpec
from ..policy_versions import fresh_mask
from ..query import QueryCondition
from ..storage.base import Arrays, Kept, KeySpace, PriorityBounds
from .state import DerivedArrays, json_key, value_codes

__all__ = ["IndexKeySpace"]

_T = TypeVar("_T")


class IndexKeySpace(KeySpace):
    """The matching rows of a key index (``index["key"]`` ascending, its columns aligned)
    as a key space: the rows of the buffer, as far as its primitives tell, are the matching
    ones. Its probes, ``first_matching``, ``count_by``, ``rows_of`` and ``in_ranges`` are
    binary searches over the arrays and a column's rows grouped by value, ``runs_from`` and
    ``windows`` look up the rows in run order (all kept while the arrays are unchanged,
    :meth:`remember`), so a sampler's ``choose_flat`` runs over it unchanged. What only
    the database holds is not here: ``logged_priorities`` returns None. Made with the
    summaries of every group by a spec (``groups``: the storage's, whose group conditions
    the database evaluated; a group sampler's listed keys are then the groups' first
    rows), it answers ``group_summaries`` and ``group_counts`` from them; otherwise
    ``group_summaries`` returns None."""

    def __init__(
        self,
        index: dict[str, Any],
        derived: DerivedArrays,
        *,
        query_condition: QueryCondition = None,
        max_staleness: int | None = None,
        consume_after: int | None = None,
        groups: tuple[GroupSpec, Arrays] | None = None,
    ) -> None:
        keys = index["key"]
        self.listed = index
        self._keys: np.ndarray = keys
        self._derived = derived
        self.rows = len(keys)
        self.min_key = int(keys[0]) if self.rows else 0
        self.max_key = int(keys[-1]) if self.rows else -1
        self.current_version = index.get("current_version")
        self.query_condition = query_condition
        self.max_staleness = max_staleness
        self.consume_after = consume_after
        self.signature = None
        self.kept = Kept()  # nothing to keep: the index is the whole answer
        self.probed = 0
        self._grouped_here: dict[str, _Grouped] = {}  # this draw's, from the kept ones
        #: The summaries of every group by a spec (:meth:`Storage.groups`), for
        #: :meth:`group_summaries` and :meth:`group_counts`.
        self._groups = groups

    @classmethod
    def of_groups(
        cls,
        spec: GroupSpec,
        summaries: Arrays,
        derived: DerivedArrays,
        *,
        query_condition: QueryCondition = None,
        max_staleness: int | None = None,
    ) -> IndexKeySpace:
        """The groups by ``spec`` as a key space held in memory: its rows are the first
        rows of the groups that have rows (``summaries``: the summaries of every group,
        :meth:`Storage.groups <expstore.storage.base.Storage.groups>`, with the buffer's
        ``current_version``), one per group, so a uniform draw among them is one among the
        groups; it answers :meth:`group_summaries` and :meth:`group_counts` from them."""
        firsts = _group_firsts(derived.get, summaries)[1]
        index = {"key": firsts, "current_version": summaries.get("current_version")}
        return cls(
            index,
            derived,
            query_condition=query_condition,
            max_staleness=max_staleness,
            groups=(spec, summaries),
        )

    def remember(self, name: str, sources: tuple[np.ndarray, ...], compute: Callable[[], _T]) -> _T:
        return self._derived.get(name, sources, compute)

    @property
    def low(self) -> int:
        return self.min_key

    @property
    def every_key_matches(self) -> bool:
        return self.dense

    def late_stale_keys(self, limit: int) -> np.ndarray | None:
        return np.empty(0, dtype=np.int64)  # the index holds the fresh rows alone

    def _positions(self, keys: np.ndarray) -> np.ndarray:
        """The positions in the index of those of ``keys`` it holds, ascending, each once."""
        keys = np.unique(np.asarray(keys, dtype=np.int64))
        self.probed += len(keys)
        if not self.rows:
            return np.empty(0, dtype=np.int64)
        at = np.searchsorted(self._keys, keys).clip(max=self.rows - 1)
        found: np.ndarray = at[self._keys[at] == keys]
        return found

    def probe(self, keys: np.ndarray, columns: Sequence[str] = ()) -> Arrays:
        at = self._positions(keys)
        return {"key": self._keys[at], **{c: self.listed_column(c)[at] for c in columns}}

    def listed_column(self, name: str) -> np.ndarray:
        index = self.listed
        assert index is not None
        return index[name]  # type: ignore[no-any-return]

    def _extremes(self, name: str) -> _Extremes:
        """The smallest and largest value of a numeric column and where the smallest is
        (NULL, NaN, left out), kept while the arrays are unchanged."""
        values = self.listed_column(name)

        def compute() -> _Extremes:
            present = ~np.isnan(values)
            if not present.any():
                return _Extremes(None, None, None)
            at = int(np.nanargmin(values))
            return _Extremes(float(values[at]), float(np.nanmax(values)), int(self._keys[at]))

        return self.remember(f"extremes:{name}", (values, self._keys), compute)

    def largest(self, name: str) -> float | None:
        return self._extremes(name).largest

    def priority_bounds(self) -> PriorityBounds:
        found = self._extremes("priority")
        largest = self.listed.get("max_priority") if self.listed else None
        return PriorityBounds(found.smallest, found.largest if largest is None else largest)

    def lowest_priority(self, walk: int | None) -> tuple[float, int | None] | None:
        found = self._extremes("priority")
        if found.smallest is None:
            return float("inf"), None
        return found.smallest, found.at

    def logged_priorities(self, after: int) -> tuple[np.ndarray, np.ndarray] | None:
        return None

    # -- values of a column, grouped (kept while the arrays are unchanged) ---------------
    def _grouped(self, name: str) -> _Grouped:
        found = self._grouped_here.get(name)
        if found is None:
            found = self._grouped_here[name] = self._group(name)
        return found

    def _group(self, name: str) -> _Grouped:
        column = self.listed_column(name)

        def compute() -> _Grouped:
            if column.dtype == object:
                listed = column.tolist()
                codes = value_codes(list(map(json_key, listed)))
                # codes are numbered by first appearance: each one's first holder, in order
                values = [listed[i] for i in np.unique(codes, return_index=True)[1].tolist()]
            else:  # numbers and bools; NaN (NULL) is one group, None
                unique, codes = np.unique(column, return_inverse=True)
                codes = codes.reshape(-1)
                values = [None if v != v else v for v in unique.tolist()]
            order = np.argsort(codes, kind="stable")  # each group's positions ascending
            counts = np.bincount(codes) if len(codes) else np.zeros(0, dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
            number = {json_key(v): i for i, v in enumerate(values)}
            keys = self._keys[order]
            order.flags.writeable = keys.flags.writeable = False  # views of them are handed out
            return _Grouped(values, number, order, keys, starts, counts)

        return self.remember(f"grouped:{name}", (column, self._keys), compute)

    def _rows_holding(self, name: str, value: Any, *, keys: bool = False) -> np.ndarray:
        """The positions (or ``keys``) of the rows holding ``value`` in ``name``,
        ascending (a view of arrays kept while the index is unchanged)."""
        grouped = self._grouped(name)
        group = grouped.number.get(json_key(value))
        if group is None:
            return np.empty(0, dtype=np.int64)
        start = int(grouped.starts[group])
        held = grouped.keys if keys else grouped.order
        return held[start : start + int(grouped.counts[group])]

    def distinct(self, name: str) -> list[Any] | None:
        """The values the rows hold (NULL one of them, None), each once as JSON compares
        them: the same list while the arrays are unchanged."""
        return self._grouped(name).values

    def first_matching(self, name: str, value: Any, start: int) -> int | None:
        keys = self._rows_holding(name, value, keys=True)
        at = int(np.searchsorted(keys, start))
        return int(keys[at]) if at < len(keys) else None

    def count_by(self, name: str, values: Sequence[Any]) -> dict[Any, int]:
        counts = {value: len(self._rows_holding(name, value)) for value in values}
        return {value: n for value, n in counts.items() if n}

    def rows_of(self, name: str, values: Sequence[Any], order_by: Sequence[str]) -> np.ndarray:
        if not order_by:  # each value's rows by key, as kept
            parts = [self._rows_holding(name, value, keys=True) for value in values]
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        parts = []
        for at in (self._rows_holding(name, value) for value in values):
            by = (self.listed_column(c)[at] for c in reversed(order_by))
            parts.append(self._keys[at[np.lexsort((self._keys[at], *by))]])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def in_ranges(
        self,
        columns: Sequence[str],
        ranged: str,
        spans: Sequence[tuple[tuple[Any, ...], Any, Any]],
    ) -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = []
        along = self.listed_column(ranged)
        for values, low, high in spans:
            at = self._rows_holding(columns[0], values[0])
            for name, value in zip(columns[1:], values[1:], strict=True):
                held = [
                    json_key(v) == json_key(value) for v in self.listed_column(name)[at].tolist()
                ]
                at = at[np.array(held, dtype=bool)]
            at = at[(along[at] >= low) & (along[at] <= high)]
            place = tuple(values)
            found += [
                (*place, v, k)
                for v, k in zip(along[at].tolist(), self._keys[at].tolist(), strict=True)
            ]
        return found

    # -- runs of consecutive steps (kept while the arrays are unchanged) -----------------
    def _runs(self, columns: Sequence[str], ordered: str) -> _Runs:
        steps = self.listed_column(ordered)
        sources = tuple(self.listed_column(name) for name in columns)

        def compute() -> _Runs:
            if not self.rows:
                empty = np.empty(0, dtype=np.int64)
                return _Runs(empty, empty, empty)
            # The sort is stable: rows with equal steps keep insertion (key) order.
            order, groups = _run_order(_trajectory_codes(sources), steps)
            ordered_steps = steps[order]
            # A run starts at the first row and wherever the trajectory changes or the
            # step does not go up by exactly 1. (The difference of two steps >= 0 cannot
            # overflow int64.)
            breaks = np.ones(len(order), dtype=bool)
            breaks[1:] = (groups[1:] != groups[:-1]) | (np.diff(ordered_steps) != 1)
            starts = np.flatnonzero(breaks)
            counts = np.diff(np.append(starts, len(order)))
            # Rows left in its run from each position of the order, itself included.
            rest = np.repeat(starts + counts, counts) - np.arange(len(order))
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            return _Runs(order, rank, rest)

        name = f"runs:{tuple(columns)}:{ordered}"
        return self.remember(name, (*sources, steps, self._keys), compute)

    def _aligned(self, keys: np.ndarray) -> np.ndarray:
        """Each key's position in the index, -1 where it holds none."""
        if keys is self._keys:
            return np.arange(self.rows)
        if not self.rows:
            return np.full(len(keys), -1, dtype=np.int64)
        at = np.searchsorted(self._keys, keys).clip(max=self.rows - 1)
        return np.where(self._keys[at] == keys, at, -1)

    def _rest(
        self, columns: Sequence[str], ordered: str, keys: np.ndarray
    ) -> tuple[_Runs, np.ndarray, np.ndarray]:
        """The runs, how many rows each key's run holds from it on (0: not a row of the
        index), and the key's place in the run order (-1: none)."""
        runs = self._runs(columns, ordered)
        at = self._aligned(keys)
        found = at >= 0
        if found.all():  # (drawn keys: all of them rows of the index)
            place = runs.rank[at]
            return runs, runs.rest[place], place
        place = np.full(len(at), -1, dtype=np.int64)
        place[found] = runs.rank[at[found]]
        rest = np.zeros(len(at), dtype=np.int64)
        rest[found] = runs.rest[place[found]]
        return runs, rest, place

    def runs_from(self, columns: Sequence[str], ordered: str, at: Arrays, limit: int) -> np.ndarray:
        found: np.ndarray = np.minimum(self._rest(columns, ordered, at["key"])[1], limit)
        return found

    def windows(self, columns: Sequence[str], ordered: str, at: Arrays, length: int) -> np.ndarray:
        runs, rest, place = self._rest(columns, ordered, at["key"])
        starts = rest >= length
        if starts.all():  # (the starts of windows drawn)
            table: np.ndarray = self._keys[runs.order[place[:, None] + np.arange(length)]]
            return table
        table = np.full((len(rest), length), -1, dtype=np.int64)
        if starts.any():
            spans = place[starts][:, None] + np.arange(length)
            table[starts] = self._keys[runs.order[spans]]
        return table

    # -- groups (from the summaries of every group the storage keeps) -------------------
    def _summaries(self, spec: GroupSpec) -> tuple[Arrays, np.ndarray] | None:
        """The summaries of every group by ``spec`` (None: this space has none), and the
        summary of each listed key (each a group's first row) in order."""
        if self._groups is None or self._groups[0] != spec:
            return None
        summaries = self._groups[1]
        return summaries, _group_firsts(self.remember, summaries)[0]

    def group_summaries(self, spec: GroupSpec, keys: np.ndarray) -> Arrays | None:
        """The summaries whose group's first row is one of ``keys``, from those of every
        group this space was made with (None: made without them, or by another spec)."""
        found = self._summaries(spec)
        if found is None:
            return None
        summaries, by_first = found
        at = self._positions(keys)
        rows = by_first[at]
        return {name: summaries[name][rows] for name in _SUMMARY_COLUMNS}

    def group_counts(self, spec: GroupSpec) -> tuple[int, int, int, int]:
        """Counted over the summaries of every group this space was made with (kept while
        they and the policy version are unchanged)."""
        found = self._summaries(spec)
        if found is None:
            raise InvalidArgumentError(
                f"this key space holds no group summaries by {spec.group_by}: a group "
                "sampler makes its key space from the storage's (GroupSampler.summaries_space)"
            )
        summaries = found[0]
        current, limit = self.current_version, self.max_staleness

        def compute() -> tuple[int, int, int, int]:
            size, passes = summaries["size"], summaries["passes"]
            complete = size == spec.size
            passing = complete & passes
            keep = None if limit is None else fresh_mask(summaries["version"], current, limit)
            fresh = passing if keep is None else passing & keep
            return (
                int(fresh.sum()),
                int(((size > 0) & ~complete).sum()),
                int((complete & ~passes).sum()),
                int((passing & ~fresh).sum()),
            )

        sources = (summaries["size"], summaries["passes"], summaries["version"])
        return self.remember(f"group counts:{spec.key}:{current}:{limit}", sources, compute)


_SUMMARY_COLUMNS = ("group", "size", "version", "passes", "first", "keys")


def _group_firsts(
    remember: Callable[[str, tuple[np.ndarray, ...], Callable[[], Any]], Any], summaries: Arrays
) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the summaries of the groups that have rows, by first key, and their
    first keys (kept while the summaries are unchanged)."""

    def compute() -> tuple[np.ndarray, np.ndarray]:
        held = np.flatnonzero(summaries["size"] > 0)
        rows = held[np.argsort(summaries["first"][held], kind="stable")]
        return rows, summaries["first"][rows]

    # (on every array a draw over them depends on: its kept chances follow the firsts)
    sources = tuple(summaries[name] for name in ("first", "size", "passes", "version"))
    found: tuple[np.ndarray, np.ndarray] = remember("group firsts", sources, compute)
    return found


class _Runs(NamedTuple):
    """Runs of consecutive steps: the row positions in run order (by trajectory, step,
    then key), each position's place in that order, and the rows left in its run from
    each place on."""

    order: np.ndarray
    rank: np.ndarray
    rest: np.ndarray


def _trajectory_codes(sources: tuple[np.ndarray, ...]) -> np.ndarray:
    """One int64 code per row, equal for rows equal in every source array."""
    codes = value_codes(sources[0].tolist())
    for source in sources[1:]:
        more = value_codes(source.tolist())
        # Both codes are < len(rows), so the pair fits in int64 below 3e9 rows; renumber
        # so the next pair fits too.
        codes = np.unique(codes * (int(more.max()) + 1) + more, return_inverse=True)[1]
    return codes.astype(np.int64, copy=False)


def _run_order(groups: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row positions ordered by trajectory, step, then position; the trajectory code of
    each row in that order)."""
    top_step = int(steps.max())
    if int(groups.max()) * (top_step + 1) + top_step < 2**63 and top_step + 1 < 2**63:
        # One stable sort over a combined key is much faster than lexsort over two.
        order = np.argsort(groups * (top_step + 1) + steps, kind="stable")
    else:
        order = np.lexsort((steps, groups))
    return order, groups[order]


class _Extremes(NamedTuple):
    smallest: float | None
    largest: float | None
    at: int | None  # the key of a row holding the smallest


class _Grouped(NamedTuple):
    """A column's rows by value: the values (as :meth:`IndexKeySpace.distinct` gives
    them), each value's number by its :func:`json_key`, the row positions ordered by
    value (each value's ascending), and each value's start and count in that order."""

    values: list[Any]
    number: dict[Any, int]
    order: np.ndarray
    keys: np.ndarray  # the keys in that order
    starts: np.ndarray
    counts: np.ndarray
