"""``consume_after``: what a key sampler knows of the rows every process together has
spent (drawn ``consume_after`` times), so that it leaves them out of its key index rather
than have the database refuse them one by one (the counting itself is
:func:`expstore.samplers.base.draw`'s, see :mod:`expstore.features.draw_counts`)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ..storage.base import Storage
from .derived import masked, whole_index

__all__ = ["SpentKeys"]


class SpentKeys:
    """The spent keys a key sampler has learned, and its key index without them."""

    consume_after: int | None
    _spent: np.ndarray
    _unspent: tuple[str, tuple[Any, ...], dict[str, Any]] | None
    _spent_read: bool

    def forget_spent(self) -> None:
        """Forget the spent keys learned (of a buffer this sampler no longer draws from)."""
        self._spent = np.empty(0, dtype=np.int64)
        self._unspent = None
        self._spent_read = False

    def spend(self, keys: np.ndarray) -> None:
        """Leave out ``keys``: the database refused them another draw (consume_after)."""
        self._spent = np.union1d(self.__dict__.get("_spent", self._spent), keys)
        if len(keys):  # others spent rows too, maybe: read them before the next choice
            self._spent_read = False

    def _learn_spent(self, storage: Storage, index: dict[str, Any]) -> dict[str, Any]:
        """``index``, after learning which rows every process together has spent
        (consume_after), at the first choice over a key index and after each refusal:
        rows spent elsewhere are then left out rather than refused one by one. (A read
        of the buffer's draw counts.)"""
        limit = self.__dict__.get("consume_after")
        if limit is not None and not self.__dict__.get("_spent_read"):
            self._read_spent(storage, limit)
        return index

    def _read_spent(self, storage: Storage, limit: int) -> None:
        """Leave out every row the buffer's draw counts say is spent (a read of them)."""
        self.spend(storage.spent_keys(limit))
        self._spent_read = True

    def _without_spent(self, index: dict[str, Any]) -> dict[str, Any]:
        spent = self.__dict__.get("_spent")
        if spent is None or not len(spent):
            return index
        # Kept while the spent keys and the index's arrays are these very arrays.
        others, arrays = whole_index(index)
        sources = (spent, *arrays)
        cached = self.__dict__.get("_unspent")
        if cached is not None and cached[0] == others and _same(cached[1], sources):
            return cast("dict[str, Any]", cached[2])
        unspent = masked(index, ~np.isin(index["key"], spent, assume_unique=True))
        self._unspent = (others, sources, unspent)
        return unspent

    def newly_spent(self, storage: Storage, index: dict[str, Any]) -> bool:
        """Whether rows of ``index`` that matter to this sampler's draw have been spent by
        other processes since it last read the spent rows; if so, they are left out (and
        the index is made again). Rows drawn from it are counted (and spent ones
        refused) anyway; a sampler whose draw depends on more than the rows drawn (the
        normaliser of prioritized weights) checks those here."""
        return False


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
