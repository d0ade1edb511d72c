"""The least priority among a prioritized draw's matching rows, kept from draw to draw by
each handle (see :mod:`expstore.storage.kept`), for every sampler of the process.

A :class:`~expstore.samplers.prioritized.PrioritizedSampler` narrowed by a condition,
``max_staleness`` or ``consume_after`` draws over the key space with importance weights
normalised by its least likely matching row: the least stored priority among the rows it
draws from (rows without one count as the buffer's largest). Finding it again for every
draw would cost a walk of the priority index, and where the lowest priorities belong to
rows that do not match (old rows trained on, under ``max_staleness``), a pass over the
buffer's priorities (or the fresh rows' ones). So it is found once
(:func:`lowest_matching`: a short walk of the index, a longer one, then as far as it
takes) and then kept up to date, as a key index is, from what changed since:

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

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from sqlalchemy import and_, bindparam, func, select

from .schema import priorities, rows

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
            least = lowest_matching(space, walk)
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


def lowest_matching(space: KeySpace, walk: int | None) -> LeastPriority | None:
    """The smallest stored priority among ``space``'s matching rows and a row that holds
    it, found by walking the ``(buffer_id, priority)`` index upward and checking each
    entry's row: through at most ``walk`` entries. ``(inf, None)`` when no matching row
    holds a priority; None when the first ``walk`` entries hold no matching row and there
    are more (the least lies beyond).

    As far as it takes (``walk`` None), it reads instead:

    - under ``max_staleness`` with stale rows below the first fresh one (``space.low``
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
    handle = space.handle
    mine = priorities.c.buffer_id == handle.buffer_id
    if walk is not None:
        form = "walk"
    elif space.low > space.min_key:
        form = "fresh keys"
    elif handle.dialect.name == "postgresql" or space.condition_indexed():
        form = "least of all"
    else:
        form = "walk"
    key = ("least priority", space.condition_key(), walk is None, form)

    def lowest() -> Any:  # the first `walk` entries of the priority index
        entries = select(priorities.c.key, priorities.c.priority).where(mine)
        return entries.order_by(priorities.c.priority).limit(bindparam("walk")).subquery()

    def joined(entries: Any, *columns: Any) -> Any:
        on = and_(rows.c.key == entries.c.key, rows.c.buffer_id == handle.buffer_id)
        return select(*columns).select_from(entries.join(rows, and_(on, *space.matching())))

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
        ((params["least"],),) = least.run(space.conn)
        if params["least"] is None:
            return LeastPriority(math.inf, None)
    elif form == "fresh keys":
        params["low"] = space.low
    elif walk is not None:
        params["walk"] = walk
    first = handle.statement(key, build).run(space.conn, **params)
    if first:
        return LeastPriority(float(first[0][0]), int(first[0][1]))
    if walk is not None:
        counted = handle.statement(
            ("lowest priorities",), lambda: select(func.count()).select_from(lowest())
        )
        ((entries,),) = counted.run(space.conn, walk=walk)
        if entries >= walk:
            return None
    return LeastPriority(math.inf, None)
