"""Claiming whole groups: a group's rows are claimed together or not at all.

A group claim (``buffer.claim(n, order=GroupSampler(...))``) brings its ready-group index
up to date (see :mod:`expstore.claims.ready_groups`) and takes ready groups from
it, oldest first by default, in the claim's one transaction: it locks the rows no other
transaction holds, and takes only the groups whose every row it could lock and that are
still claimable. A group another claimer took in part between the read and the write
(possible only when row claims and group claims share rows) is given back in the same
transaction, so no claim ever holds part of a group. A group a claim finds held is passed
over; it stays in the index and comes back by itself when its claim is released or its
lease runs out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import Connection

from ..group_summaries import GroupSpec
from ..query import QueryCondition
from ..samplers.group import GroupCounts, GroupOrder, GroupSampler
from ..storage.sql import SqlStorage
from .queue import ClaimQueue, GroupTaker
from .ready_groups import GroupTally, ReadyGroups, Synced, ready_groups_of

__all__ = ["claim_counts", "claim_taker", "claimable_groups", "group_taker", "tally_groups"]

#: Rounds of candidate groups read from the index before the claim takes what it has
#: (each reads twice the groups still wanted, none read before).
_ROUNDS = 16

#: A group as a claim handles it: its first key and its rows' keys.
Group = tuple[int, np.ndarray]
#: Told, once a claim has committed, how the index's groups stood after it.
OnTally = Callable[[GroupTally], None]
#: Told, in the transaction of each update of the index, the keys of the rows it left out
#: for good (the rate limit counts them as discarded, each once): (connection, keys).
OnDiscard = Callable[[Connection, list[int]], None]


def group_taker(
    index: ReadyGroups,
    query_condition: QueryCondition,
    spec: GroupSpec,
    staleness: int | None,
    order: GroupOrder,
    on_tally: OnTally,
    on_discard: OnDiscard,
) -> GroupTaker:
    """A :data:`~expstore.claims.queue.GroupTaker` for groups of ``spec`` among
    the rows matching ``query_condition`` no more than ``staleness`` versions old."""
    size = spec.size

    def take(
        queue: ClaimQueue,
        conn: Connection,
        n: int,
        now: Any,
        entry: dict[str, Any],
        stamps: list[float],
    ) -> tuple[list[int], Callable[[], None]]:
        synced = _sync(index, conn, query_condition, spec, staleness, on_discard)
        want = n // size
        taken: list[Group] = []
        tried: set[int] = set()
        for _ in range(_ROUNDS):
            need = want - len(taken)
            if need <= 0:
                break
            drawn = [
                g
                for g in index.candidates(conn, synced, now, 2 * need, tried, order)
                if len(g[1]) == size
            ]
            if not drawn:
                break
            tried.update(first for first, _ in drawn)
            taken += _take_whole(queue, conn, index, synced, drawn, need, entry, stamps)
        tally = index.tally(conn, synced, now)
        return _flat(taken), lambda: on_tally(tally)

    return take


def _sync(
    index: ReadyGroups,
    conn: Connection,
    query_condition: QueryCondition,
    spec: GroupSpec,
    staleness: int | None,
    on_discard: OnDiscard,
) -> Synced:
    """Bring the index up to date in ``conn``'s transaction, telling ``on_discard`` the
    rows it left out for good."""
    synced = index.sync(conn, query_condition, spec, staleness)
    if synced.discarded:
        on_discard(conn, synced.discarded)
    return synced


def _take_whole(
    queue: ClaimQueue,
    conn: Connection,
    index: ReadyGroups,
    synced: Synced,
    groups: list[Group],
    need: int,
    entry: dict[str, Any],
    stamps: list[float],
) -> list[Group]:
    """Claim up to ``need`` of ``groups`` whole; returns those taken. Groups a row of
    which was consumed (by a row claim, or a claim of another index) leave the index."""
    free = set(queue.lock_free(conn, _flat(groups)))
    held = [g for g in groups if not free.issuperset(g[1].tolist())]
    if held:
        index.forget_spent(conn, synced, [int(k) for _, keys in held for k in keys])
    whole = [g for g in groups if free.issuperset(g[1].tolist())][:need]
    entered = set(queue.enter(conn, _flat(whole), entry, stamps))
    complete = [g for g in whole if entered.issuperset(g[1].tolist())]
    done = {id(g) for g in complete}
    partial = [k for g in whole if id(g) not in done for k in g[1].tolist() if k in entered]
    queue.give_back(conn, partial, entry["claim_id"])
    return complete


def _flat(groups: list[Group]) -> list[int]:
    return [int(k) for _, keys in groups for k in keys]


def tally_groups(
    index: ReadyGroups,
    query_condition: QueryCondition,
    spec: GroupSpec,
    staleness: int | None,
    upto: int | None,
    on_discard: OnDiscard,
) -> GroupTally:
    """How the groups of ``spec`` stand now, counting ready ones (whole groups claimable
    now) no further than ``upto``. A read when the index is up to date; otherwise the
    index is brought up to date first, in a write transaction of its own."""
    handle = index.handle
    with handle.errors("count claimable groups"):
        with handle.read() as conn:
            synced: Synced | None = index.in_sync(conn, query_condition, spec, staleness)
            if synced is not None:
                return index.tally(conn, synced, handle.dialect.now(), upto)
        with handle.write() as conn:
            synced = _sync(index, conn, query_condition, spec, staleness, on_discard)
            return index.tally(conn, synced, handle.dialect.now(), upto)


# -- a GroupSampler as a claim order -------------------------------------------------------
def claim_taker(
    sampler: GroupSampler,
    sql: SqlStorage,
    query_condition: QueryCondition,
    max_staleness: int | None = None,
) -> GroupTaker:
    """What ``buffer.claim(n, order=sampler)`` takes whole groups with; ``max_staleness``:
    the claim's, which holds with the sampler's (the tighter one counts)."""

    def tallied(tally: GroupTally) -> None:
        _record(sampler, tally)

    return group_taker(
        ready_groups_of(sql.handle),
        query_condition,
        sampler.spec,
        sampler.claim_staleness(max_staleness),
        sampler.claim_order,
        tallied,
        sql.discard_rows,
    )


def claimable_groups(
    sampler: GroupSampler,
    sql: SqlStorage,
    query_condition: QueryCondition,
    max_staleness: int | None,
    upto: int | None,
) -> int:
    """How many whole groups a claim with ``sampler``'s order could take now (up to
    ``upto``): what ``claim(..., wait_s=s)`` waits for, and counts against a rate limit; sets
    the sampler's ``last_counts``."""
    return claim_counts(sampler, sql, query_condition, max_staleness, upto).ready


def claim_counts(
    sampler: GroupSampler,
    sql: SqlStorage,
    query_condition: QueryCondition,
    max_staleness: int | None,
    upto: int | None = None,
) -> GroupTally:
    """How the groups a claim with ``sampler``'s order takes from stand now (see
    ``buffer.ready_groups``; ``upto``: count ready groups no further); sets the sampler's
    ``last_counts``."""
    tally = tally_groups(
        ready_groups_of(sql.handle),
        query_condition,
        sampler.spec,
        sampler.claim_staleness(max_staleness),
        upto,
        sql.discard_rows,
    )
    _record(sampler, tally)
    return tally


def _record(sampler: GroupSampler, tally: GroupTally) -> None:
    sampler.record_counts(
        GroupCounts(
            ready=tally.ready, waiting=tally.waiting, filtered=tally.filtered, stale=tally.stale
        )
    )
