"""What a sampler keeps between draws: values derived from a key index (kept while its
arrays are unchanged), and what a key sampler holds of the buffer it draws from
(:class:`KeyState`: the rows known spent, the flat draws' hints)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "NO_KEYS",
    "DerivedArrays",
    "KeyState",
    "json_key",
    "masked",
    "numbering",
    "same_arrays",
    "value_codes",
    "whole_index",
]

_T = TypeVar("_T")

#: No keys (read-only).
NO_KEYS = np.empty(0, dtype=np.int64)
NO_KEYS.flags.writeable = False


def json_key(value: Any) -> Any:
    """A hashable key under which equal JSON values meet: True and 1 stay apart (as JSON
    tells them apart), 1 and 1.0 meet, lists and dicts by their JSON text; NaN (a float
    column's NULL) meets None."""
    if type(value) is bool:
        return (bool, value)
    if isinstance(value, (list, dict)):
        return (list, json.dumps(value, sort_keys=True))
    if isinstance(value, float) and value != value:
        return None
    return value


def numbering(values: Sequence[Any]) -> dict[Any, int]:
    """Each distinct value's number, in order of first appearance. ``dict.fromkeys`` runs
    in C: no Python-level loop per row."""
    first_seen = dict.fromkeys(values)
    return dict(zip(first_seen, range(len(first_seen)), strict=False))


def value_codes(values: Sequence[Any]) -> np.ndarray:
    """An int64 code per value, equal codes for equal values, numbered in order of first
    appearance (see :func:`numbering`)."""
    codes = numbering(values)
    return np.fromiter(map(codes.__getitem__, values), dtype=np.int64, count=len(values))


# -- values derived from a key index, kept while its arrays are unchanged ---------------
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


@dataclass
class KeyState:
    """What a key sampler holds of the buffer it draws from, between draws: forgotten
    whole when it is next used with another buffer (:meth:`Sampler.forget_buffer`)."""

    #: Keys of rows every process together has drawn ``consume_after`` times, learned from
    #: the database's refusals and reads of the draw counts; sorted.
    spent: np.ndarray = field(default_factory=lambda: NO_KEYS)
    #: Whether every spent row was read since the last refusal (see
    #: :meth:`KeySampler.newly_spent`).
    spent_read: bool = False
    #: The last key index without the spent rows: (its other values, the arrays it was
    #: made from, the index), kept while those are the very same arrays.
    unspent: tuple[str, tuple[Any, ...], dict[str, Any]] | None = None
    #: Calls left, per condition, that go straight to the key index after a flat draw
    #: gave up under it.
    flat_skips: dict[str, int] = field(default_factory=dict)
    #: The share of candidate keys the last flat draw under each condition kept.
    kept_hints: dict[str, float] = field(default_factory=dict)


def same_arrays(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
