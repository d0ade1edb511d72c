"""The least priority among a prioritized draw's matching rows, kept from draw to draw by
each handle (see :mod:`expstore.storage.kept`), for every sampler of the process.

A :class:`~expstore.samplers.prioritized.PrioritizedSampler` narrowed by a condition,
``max_staleness`` or ``consume_after`` draws over the key space with importance weights
normalised by its least likely matching row: the least stored priority among the rows it
draws from (rows without one count as the buffer's largest). Finding it again for every
draw would cost a walk of the priority index, and where the lowest priorities belong to
rows that do not match (old rows trained on, under ``max_staleness``), a pass over the
buffer's priorities (or the fresh rows' ones). So it is found once (:meth:`KeySpace.least_priority
<expstore.storage.key_space.KeySpace.least_priority>`: a short walk of the index, a longer
one, then as far as it takes) and then kept up to date, as a key index is, from what
changed since:

- priority updates, from the priority log: an updated matching row below the least is the
  new least (one probe of the updated keys); when the row that held the least was
  updated, it is found again;
- the row holding it: still stored and matching (one probe of its key), or it is found
  again; rows only ever leave the matching ones (eviction, spent draws, older versions
  going stale), and new rows hold no priority, so while it stays the least stays;
- anything else (deletes, a policy version set back, a log that no longer reaches back)
  finds it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .key_index import Signature
    from .key_space import KeySpace

__all__ = ["LeastPriority", "least_matching_priority"]

#: Entries of the priority index walked for the least matching priority before the walk
#: goes as far as it takes: it finds it early unless matching rows are rare among the
#: lowest priorities.
WALKS: tuple[int | None, ...] = (64, 4096, None)
_WHAT = ("least priority",)


class LeastPriority(NamedTuple):
    """The least stored priority among a draw's matching rows and a row holding it (``inf``
    and None when none holds one)."""

    priority: float
    key: int | None


def least_matching_priority(space: KeySpace) -> float:
    """The least stored priority among ``space``'s matching rows (``inf`` when none holds
    one), kept by ``space.kept``."""
    since = space.kept.get(space, _WHAT)
    least = None if since is None else _brought_up_to_date(space, since.found, since.signature)
    if least is None:
        for walk in WALKS:
            least = space.least_priority(walk)
            if least is not None:
                break
    assert least is not None  # the last walk goes as far as it takes
    space.kept.put(space, _WHAT, least)
    return least.priority


def _brought_up_to_date(
    space: KeySpace, kept: LeastPriority, found_at: Signature
) -> LeastPriority | None:
    """The least ``kept`` as it is now, or None when it must be found again."""
    signature = space.signature
    assert signature is not None
    least = kept
    if signature.priority_version != found_at.priority_version:
        logged = space.logged_priorities(found_at.priority_version)
        if logged is None:
            return None
        keys, values = logged
        if least.key is not None and least.key in keys:
            return None  # its row's priority changed: it may no longer be the least
        lower = keys[values < least.priority]
        if len(lower):
            found = space.probe(lower, ("priority",))
            if len(found["key"]):
                at = int(np.argmin(found["priority"]))
                least = LeastPriority(float(found["priority"][at]), int(found["key"][at]))
    if least.key is not None and least is kept:
        still = space.probe(np.array([least.key], dtype=np.int64))
        if not len(still["key"]):
            return None  # evicted, deleted, stale or spent since
    return least
