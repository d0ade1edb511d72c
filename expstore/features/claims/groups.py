"""Claiming whole groups: a group's rows are claimed together or not at all.

A group claim (``buffer.claim(n, order=GroupSampler(...))``) draws candidate groups from
the sampler's ready groups, locks the rows no other transaction holds, and takes only the
groups whose every row it could lock and that are still claimable; their entries are
written in the claim's one transaction. A group another claimer took in part between the
read and the write (possible only when row claims and group claims share rows) is given
back in the same transaction, so no claim ever holds part of a group. Groups a claimer
finds taken are remembered by its sampler and not drawn again; when the sampler's
candidates run out, the database is asked for the oldest complete groups that are
claimable now (released, or whose lease ran out), which also brings such groups back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import Connection

from ...query import QueryCondition
from ..groups import GroupIndex, GroupSpec
from .queue import ClaimQueue, GroupTaker, unblocked

__all__ = ["claimable_groups", "group_taker"]

#: Rounds of candidate groups drawn before asking the database for claimable ones.
_ROUNDS = 4


#: A group as a claim handles it: its value and its rows' keys.
Group = tuple[Any, np.ndarray]


def group_taker(
    index: GroupIndex,
    query_condition: QueryCondition,
    spec: GroupSpec,
    candidates: Callable[[int, set[Any]], list[Group]],
    learn: Callable[[list[Any]], None],
    freed: Callable[[list[Any]], list[Any]],
    oldest: Callable[[], int | None],
) -> GroupTaker:
    """A :data:`~expstore.features.claims.queue.GroupTaker` for groups of ``spec``.

    ``candidates(m, skip)``: up to m ready groups the sampler has not seen taken, none of
    ``skip``; ``learn(values)``: these groups are taken now (by this claim or another), told
    once the claim has committed; ``freed(rows)``: the values of
    the (group value, oldest version) rows the database found claimable, which the
    sampler no longer takes for taken; ``oldest()``: the oldest fresh version now (None:
    no limit), which the database applies."""
    size = spec.size

    def take(
        queue: ClaimQueue,
        conn: Connection,
        n: int,
        now: Any,
        entry: dict[str, Any],
        stamps: list[float],
    ) -> tuple[list[int], Callable[[], None]]:
        want = n // size
        taken: list[Group] = []
        # The groups this attempt saw taken (by it or by others), told to the sampler only
        # once the claim has committed: an attempt rolled back (a deadlock, then retried)
        # or whose commit failed took none of them, and draws must not leave them out.
        seen: set[Any] = set()
        for _ in range(_ROUNDS):
            need = want - len(taken)
            if need <= 0:
                break
            drawn = [g for g in candidates(2 * need, seen) if len(g[1]) == size]
            if not drawn:
                break
            complete, gone = _take_whole(queue, conn, drawn, need, entry, stamps)
            taken += complete
            seen.update(gone)
        need = want - len(taken)
        if need > 0:
            since = oldest()
            found = index.claimable(conn, query_condition, spec, unblocked(now), 4 * need, since)
            values = freed(found)[: 2 * need]
            keys = index.keys(query_condition, spec, values, conn=conn)
            groups = [(v, k) for v, k in zip(values, keys, strict=True) if len(k) == size]
            complete, gone = _take_whole(queue, conn, groups, need, entry, stamps)
            taken += complete
            seen.update(gone)
        return _flat(taken), lambda: learn(list(seen))

    return take


def _take_whole(
    queue: ClaimQueue,
    conn: Connection,
    groups: list[Group],
    need: int,
    entry: dict[str, Any],
    stamps: list[float],
) -> tuple[list[Group], list[Any]]:
    """Claim up to ``need`` of ``groups`` whole; returns those taken, and the values of
    the groups now taken, by this claim or another (free groups beyond ``need`` left out:
    they are still there to be drawn)."""
    free = set(queue.lock_free(conn, _flat(groups), entry["claimed_at"]))
    whole = [g for g in groups if free.issuperset(g[1].tolist())][:need]
    entered = set(queue.enter(conn, _flat(whole), entry, stamps))
    complete = [g for g in whole if entered.issuperset(g[1].tolist())]
    done = {id(g) for g in complete}
    partial = [k for g in whole if id(g) not in done for k in g[1].tolist() if k in entered]
    queue.give_back(conn, partial, entry["claim_id"])
    tried = {id(g) for g in whole}
    gone = [g[0] for g in groups if id(g) in tried or not free.issuperset(g[1].tolist())]
    return complete, gone


def _flat(groups: list[Group]) -> list[int]:
    return [int(k) for _, keys in groups for k in keys]


def claimable_groups(
    index: GroupIndex,
    query_condition: QueryCondition,
    spec: GroupSpec,
    freed: Callable[[list[Any]], list[Any]],
    oldest: int | None,
    upto: int,
) -> int:
    """How many complete groups of ``spec`` of version ``oldest`` or newer could be
    claimed whole now, up to ``upto`` (``freed``: told which, see :func:`group_taker`)."""
    handle = index.handle
    with handle.errors("count claimable groups"), handle.read() as conn:
        now = handle.dialect.now()
        found = index.claimable(conn, query_condition, spec, unblocked(now), 4 * upto, oldest)
    return min(len(freed(found)), upto)
