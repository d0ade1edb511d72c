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
from typing import Any, TypeVar

import numpy as np

from ..query import QueryCondition
from ..storage.base import Arrays, Kept, KeySpace, PriorityBounds
from .state import DerivedArrays

__all__ = ["IndexKeySpace"]

_T = TypeVar("_T")


class IndexKeySpace(KeySpace):
    """The matching rows of a key index (``index["key"]`` ascending, its columns aligned)
    as a key space. What needs the database beyond the index (other rows, the priority
    log, group summaries) is not there: the methods for it raise NotImplementedError, and
    a sampler that needs them draws over the database's space or its own index."""

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

    def distinct(self, name: str) -> list[Any] | None:
        return None  # a stratified draw over the index groups it itself

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

    def _not_here(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{what} needs the database: a sampler that uses it draws over the database's "
            "key space, or over its own key index"
        )

    def first_matching(self, name: str, value: Any, start: int) -> int | None:
        raise self._not_here("first_matching")

    def count_by(self, name: str, values: Sequence[Any]) -> dict[Any, int]:
        raise self._not_here("count_by")

    def rows_of(self, name: str, values: Sequence[Any], order_by: Sequence[str]) -> np.ndarray:
        raise self._not_here("rows_of")

    def in_ranges(
        self,
        columns: Sequence[str],
        ranged: str,
        spans: Sequence[tuple[tuple[Any, ...], Any, Any]],
    ) -> list[tuple[Any, ...]]:
        raise self._not_here("in_ranges")

    def group_summaries(self, spec: Any, keys: np.ndarray) -> Arrays | None:
        return None

    def group_counts(self, spec: Any) -> tuple[int, int, int, int]:
        raise self._not_here("group_counts")
