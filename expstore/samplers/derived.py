"""Values derived from a sampler's key-index arrays (cumulative weights, task numbering...),
kept while those arrays are unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

__all__ = ["DerivedArrays", "masked", "whole_index"]

_T = TypeVar("_T")
#: Derived values a sampler keeps (one per condition in use, most recent first).
_DERIVED_ENTRIES = 4


class DerivedArrays:
    """Values computed from key-index arrays, kept while those arrays are unchanged.

    The storage hands back the very same read-only array objects until the buffer changes,
    so identity tells whether a derived value is still valid. A few entries are kept (one
    per condition in use, most recent first). Pickling drops them: they are rebuilt where
    the sampler lands (e.g. in a DataLoader worker).
    """

    def __init__(self) -> None:
        self._entries: list[tuple[str, tuple[np.ndarray, ...], Any]] = []

    def get(self, name: str, sources: tuple[np.ndarray, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, or the value remembered for ``name`` over these very arrays."""
        for i, (entry_name, entry_sources, value) in enumerate(self._entries):
            if entry_name == name and len(entry_sources) == len(sources):
                if all(a is b for a, b in zip(entry_sources, sources, strict=True)):
                    if i:
                        self._entries.insert(0, self._entries.pop(i))
                    return value  # type: ignore[no-any-return]
        value = compute()
        self._entries.insert(0, (name, sources, value))
        del self._entries[_DERIVED_ENTRIES:]
        return value

    def __getstate__(self) -> dict[str, Any]:
        return {"_entries": []}


def whole_index(index: dict[str, Any]) -> tuple[str, tuple[np.ndarray, ...]]:
    """What a value derived from all of ``index`` depends on, for :meth:`DerivedArrays.get`:
    its other values (their text, for the name) and its arrays (the sources). A priority
    update gives a new ``priority`` array and the same keys: a value derived from the keys
    alone would keep the old priorities."""
    others = sorted((name, repr(v)) for name, v in index.items() if not isinstance(v, np.ndarray))
    return repr(others), tuple(v for v in index.values() if isinstance(v, np.ndarray))


def masked(index: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """The rows of ``index`` where ``keep`` is true (read-only arrays; other values as they
    are)."""
    size = len(keep)
    masked = {
        name: value[keep] if isinstance(value, np.ndarray) and len(value) == size else value
        for name, value in index.items()
    }
    for value in masked.values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return masked
