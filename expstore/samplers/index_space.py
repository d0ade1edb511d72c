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

from ..query import QueryCondition
from ..storage.base import Arrays, Kept, KeySpace, PriorityBounds
from .state import DerivedArrays, json_key, value_codes

__all__ = ["IndexKeySpace"]

_T = TypeVar("_T")


class IndexKeySpace(KeySpace):
    """The matching rows of a key index (``index["key"]`` ascending, its columns aligned)
    as a key space: the rows of the buffer, as far as its primitives tell, are the matching
    ones. Its probes, ``first_matching``, ``count_by``, ``rows_of`` and ``in_ranges`` are
    binary searches over the arrays and a column's rows grouped by value (kept while the
    arrays are unchanged, :meth:`remember`), so a sampler's ``choose_flat`` runs over it
    unchanged. What only the database holds is not here: ``logged_priorities`` and
    ``group_summaries`` return None, ``group_counts`` (group conditions are evaluated in
    SQL) raises NotImplementedError."""

    def __init__(
        self,
        index: dict[str, Any],
        derived: DerivedArrays,
        *,
        query_condition: QueryCondition = None,
        max_staleness: int | None = None,
        consume_after: int | None = None,
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

    def group_summaries(self, spec: Any, keys: np.ndarray) -> Arrays | None:
        return None

    def group_counts(self, spec: Any) -> tuple[int, int, int, int]:
        # A group's filter (having) is evaluated by the database: GroupSampler counts its
        # groups over the summaries the storage keeps (GroupSampler.ready_groups).
        raise NotImplementedError(
            "group_counts needs the database (a group condition is evaluated in SQL): "
            "GroupSampler counts over the storage's group summaries"
        )


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
