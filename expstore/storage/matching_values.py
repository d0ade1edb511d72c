"""Which values of a column the matching rows of a draw hold, kept from draw to draw by
each handle (see :mod:`expstore.storage.kept`).

A :class:`~expstore.samplers.stratified.StratifiedSampler` narrowed by a condition,
``max_staleness`` or ``consume_after`` gives a share of the batch to each value a matching
row holds. For each value of the column (its distinct values, a loose index scan), the
first matching row of the value from the first fresh key on is looked for through the
column's index (:meth:`KeySpace.first_matching
<expstore.storage.key_space.KeySpace.first_matching>`), as far as it takes: a value whose
rows match nothing is a pass over its rows once. What was found is then kept, one key per
value, and brought up to date:

- a value held by a matching row (its witness) still is while that row matches (one
  probe of all witnesses); otherwise its next matching row is looked for after the
  witness, since the rows before it did not match and rows only leave the matching ones;
- a value no matching row held up to the largest key then is looked for among the rows
  written since alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .key_space import KeySpace

__all__ = ["values_held"]


class _Witnesses(NamedTuple):
    """For each value, the key of a matching row holding it (None: none up to
    ``max_key``)."""

    keys: dict[Any, int | None]
    max_key: int


def values_held(space: KeySpace, name: str, values: list[Any]) -> list[Any]:
    """Those of ``values`` (of the indexed column ``name``) that a matching row of
    ``space`` holds, in the order given."""
    what = ("matching values", name)
    since = space.kept.get(space, what)
    known: dict[Any, int | None] = {} if since is None else since.found.keys
    checked_to = space.low - 1 if since is None else since.found.max_key
    witnesses = [known.get(v, -1) for v in values]  # -1: not looked for yet
    kept = np.array([w for w in witnesses if w is not None and w >= 0], dtype=np.int64)
    still = set(space.probe(kept)["key"].tolist()) if len(kept) else set()
    low = space.low
    for i, (value, witness) in enumerate(zip(values, witnesses, strict=True)):
        if witness is None:  # none then: among the rows written since
            witnesses[i] = space.first_matching(name, value, max(low, checked_to + 1))
        elif witness < 0:
            witnesses[i] = space.first_matching(name, value, low)
        elif witness not in still:  # gone, stale or spent: the next one after it
            witnesses[i] = space.first_matching(name, value, max(low, witness + 1))
    found = _Witnesses(dict(zip(values, witnesses, strict=True)), space.max_key)
    space.kept.put(space, what, found)
    return [v for v, w in zip(values, witnesses, strict=True) if w is not None]
