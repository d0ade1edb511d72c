"""Claim orders: which rows a claim takes first, and in what unit.

``buffer.claim(n, order=...)`` takes rows by one of three strategies, each a
:class:`ClaimOrder`:

- :class:`Oldest` (``"oldest"``, the default): the queue's oldest claimable rows, by key;
- :class:`Drawn` (``"random"``, or any key sampler: ``PrioritizedSampler``,
  ``RecencySampler``...): the rows the sampler draws among the claimable ones, in the
  scope it can draw from (its own condition and staleness with the claim's);
- :class:`WholeGroups` (a ``GroupSampler``): whole groups, oldest ready first or at random,
  from the ready-group index (:mod:`expstore.claims.ready_groups`).

A sampler only draws; what a claim makes of it is decided here, once, by
:func:`claim_order`, and the claim's loop (:func:`expstore.claims.api.claim_rows`) asks the
strategy what it needs: the scope, the candidates or the group taker, how many units are
claimable now, and the unit a rate limit counts in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import EmptyBufferError, InvalidArgumentError, UnsupportedTypeError
from ..query import And, QueryCondition, as_condition
from ..samplers.base import KeySampler
from ..samplers.group import GroupSampler
from ..samplers.uniform import UniformSampler
from ..storage.sql import SqlStorage
from .group_claims import claim_taker, claimable_groups
from .queue import GroupTaker, Scope, queue_of

__all__ = ["ClaimOrder", "Drawn", "Oldest", "WholeGroups", "claim_order"]


class ClaimOrder(ABC):
    """How a claim chooses its rows (see the module). ``scope``: the rows it may take;
    ``candidates(m)``: keys to try first (None: the oldest); ``groups``: the taker of whole
    groups (None: rows); ``unit``: rows per unit a rate limit counts; ``what``: a unit, in
    words, for messages."""

    scope: Scope
    candidates: Callable[[int], np.ndarray] | None = None
    groups: GroupTaker | None = None
    unit: int = 1
    what: str = "row"

    def __init__(self, sql: SqlStorage, scope: Scope) -> None:
        self.sql = sql
        self.scope = scope

    def check(self, batch_size: int, min_batch_size: int | None) -> None:  # noqa: B027
        """Refuse a batch this order cannot take (InvalidArgumentError)."""

    @abstractmethod
    def claimable(self, upto: int) -> int:
        """How many rows (in whole units) a claim could take now, counted up to ``upto``."""


class Oldest(ClaimOrder):
    """The queue's oldest claimable rows first (by key)."""

    def claimable(self, upto: int) -> int:
        return queue_of(self.sql.handle).count(self.scope, upto, claimable=True)


class Drawn(Oldest):
    """The rows ``sampler`` draws, among the claimable ones in the scope it draws from."""

    def __init__(
        self, sql: SqlStorage, scope: Scope, sampler: KeySampler, query_condition: QueryCondition
    ) -> None:
        sampler.on_buffer(sql)
        super().__init__(sql, _sampler_scope(sampler, query_condition, scope))

        def draw(m: int) -> np.ndarray:
            for _ in range(2):  # again if the choice found the database made anew
                try:
                    keys = sampler.choose(sql, m, query_condition).keys
                except EmptyBufferError:
                    keys = np.empty(0, dtype=np.int64)
                if not sampler.on_buffer(sql):
                    break
            return keys

        self.candidates = draw


class WholeGroups(ClaimOrder):
    """Whole groups of ``sampler``, from the ready-group index."""

    def __init__(
        self, sql: SqlStorage, scope: Scope, sampler: GroupSampler, query_condition: QueryCondition
    ) -> None:
        sampler.on_buffer(sql)
        super().__init__(sql, scope)
        self._sampler = sampler
        self._condition = query_condition
        self.unit = sampler.group_size
        self.what = f"whole group of {sampler.group_size} rows"
        self.groups = claim_taker(sampler, sql, query_condition, scope.max_staleness)

    def check(self, batch_size: int, min_batch_size: int | None) -> None:
        size = self.unit
        if batch_size % size or (min_batch_size is not None and min_batch_size % size):
            raise InvalidArgumentError(
                f"a claim of whole groups of {size} rows takes a batch_size (and a "
                f"min_batch_size) that is a multiple of {size}; got batch_size={batch_size}"
                + ("" if min_batch_size is None else f", min_batch_size={min_batch_size}")
            )

    def claimable(self, upto: int) -> int:
        size = self.unit
        ready = claimable_groups(
            self._sampler, self.sql, self._condition, self.scope.max_staleness, -(-upto // size)
        )
        return ready * size


def claim_order(
    order: Any, sql: SqlStorage, query_condition: QueryCondition, scope: Scope
) -> ClaimOrder:
    """The strategy of ``order`` (``"oldest"``, ``"random"``, a key sampler or a group
    sampler) for a claim of ``scope``'s rows."""
    if isinstance(order, GroupSampler):
        return WholeGroups(sql, scope, order, query_condition)
    if isinstance(order, KeySampler):
        return Drawn(sql, scope, order, query_condition)
    if order == "oldest":
        return Oldest(sql, scope)
    if order == "random":
        return Drawn(sql, scope, UniformSampler(), query_condition)
    raise UnsupportedTypeError(
        'order must be "oldest", "random" or a sampler that chooses keys (UniformSampler, '
        f"PrioritizedSampler, ...), got {order!r}"
    )


def _sampler_scope(order: KeySampler, query_condition: QueryCondition, scope: Scope) -> Scope:
    """The scope of a claim ordered by ``order``: the claim's, narrowed to the rows the
    sampler can draw (its :meth:`~expstore.KeySampler.drawable` condition, and the tighter
    of the claim's and the sampler's ``max_staleness``), so that no row it returns, nor
    any it counts as claimable, is one the sampler would not draw."""
    tightest = [k for k in (scope.max_staleness, order.max_staleness) if k is not None]
    own = order.drawable()
    condition: QueryCondition = query_condition
    if own is not None:
        mine = as_condition(query_condition)
        condition = own if mine is None else And((mine, own))
    return Scope(condition, min(tightest) if tightest else None)
