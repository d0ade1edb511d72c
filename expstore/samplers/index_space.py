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

    def largest(self, name: str) -> float | None:
        values = self.listed_column(name)
        present = values[~np.isnan(values)]
        return float(present.max()) if len(present) else None

    def priority_bounds(self) -> PriorityBounds:
        priority = self.listed_column("priority")
        stored = priority[~np.isnan(priority)]
        largest = self.listed.get("max_priority") if self.listed else None
        if largest is None and len(stored):
            largest = float(stored.max())
        return PriorityBounds(float(stored.min()) if len(stored) else None, largest)

    def lowest_priority(self, walk: int | None) -> tuple[float, int | None] | None:
        priority = self.listed_column("priority")
        if not len(priority) or np.isnan(priority).all():
            return float("inf"), None
        at = int(np.nanargmin(priority))
        return float(priority[at]), int(self._keys[at])

    def logged_priorities(self, after: int) -> tuple[np.ndarray, np.ndarray] | None:
        return None

    # -- values of a column, grouped (kept while the arrays are unchanged) ---------------
    def _grouped(self, name: str) -> _Grouped:
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
            return _Grouped(values, number, order, starts, counts)

        return self.remember(f"grouped:{name}", (column,), compute)

    def _rows_holding(self, name: str, value: Any) -> np.ndarray:
        """The positions of the rows holding ``value`` in ``name``, ascending."""
        grouped = self._grouped(name)
        group = grouped.number.get(json_key(value))
        if group is None:
            return np.empty(0, dtype=np.int64)
        start = int(grouped.starts[group])
        return grouped.order[start : start + int(grouped.counts[group])]

    def distinct(self, name: str) -> list[Any] | None:
        """The values the rows hold (NULL one of them, None), each once as JSON compares
        them: the same list while the arrays are unchanged."""
        return self._grouped(name).values

    def first_matching(self, name: str, value: Any, start: int) -> int | None:
        keys = self._keys[self._rows_holding(name, value)]
        at = int(np.searchsorted(keys, start))
        return int(keys[at]) if at < len(keys) else None

    def count_by(self, name: str, values: Sequence[Any]) -> dict[Any, int]:
        counts = {value: len(self._rows_holding(name, value)) for value in values}
        return {value: n for value, n in counts.items() if n}

    def rows_of(self, name: str, values: Sequence[Any], order_by: Sequence[str]) -> np.ndarray:
        parts = [self._rows_holding(name, value) for value in values]
        if order_by:
            parts = [
                at[
                    np.lexsort(
                        (self._keys[at], *(self.listed_column(c)[at] for c in reversed(order_by)))
                    )
                ]
                for at in parts
            ]
        at = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return self._keys[at]

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


class _Grouped(NamedTuple):
    """A column's rows by value: the values (as :meth:`IndexKeySpace.distinct` gives
    them), each value's number by its :func:`json_key`, the row positions ordered by
    value (each value's ascending), and each value's start and count in that order."""

    values: list[Any]
    number: dict[Any, int]
    order: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
