"""StratifiedSampler: an equal share of the batch per group of a field's values."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from typing_extensions import Unpack

from ..query import QueryCondition
from ..query.fields import resolve_field
from ..storage.base import KeySpace
from .base import KeySampler, SamplerOptions
from .flat import draw_shares
from .loop import Choice

__all__ = ["StratifiedSampler"]

#: Groups beyond which stratified draws choose over the key index: a group's share of the
#: key range is then too small for rejection to pay.
MAX_FLAT_GROUPS = 64


class StratifiedSampler(KeySampler):
    """Every group of a field gets an equal share of the batch.

    ``StratifiedSampler(by="exp_meta.agent_id", *, seed=None)``

    ``by`` is a metadata column (``exp_meta.task_id``, ``exp_meta.agent_id``,
    ``exp_meta.task_name``, ``exp_meta.step``, ``exp_data.done``, ``exp_data.reward_t`` ...;
    the prefix may be left out) or a path into the payload (``exp_data.state.difficulty``,
    ``exp_data.ext_info.env.0``), read by the same rules as query conditions. Each group
    (a distinct value; NULL, JSON null and a path that reaches nothing are one group) among
    the matching rows gets ``batch_size // groups`` rows, drawn uniformly with replacement
    within the group; the remaining ``batch_size % groups`` rows go to distinct groups
    chosen at random. With fewer rows asked than groups, that many distinct groups give
    one row each. The batch comes back shuffled. Payload values group as JSON compares
    them: ``1`` and ``1.0`` are one group, ``true`` and ``1`` two.

    >>> sampler = StratifiedSampler(by="exp_meta.task_id", seed=0)
    >>> by_level = StratifiedSampler(by="exp_data.state.difficulty", seed=0)
    """

    def __init__(self, by: str = "exp_meta.agent_id", **options: Unpack[SamplerOptions]) -> None:
        super().__init__(**options)
        self.by = by
        path = resolve_field(by)
        #: The key-index column grouped on: a column's name, or the payload path.
        self.column = path.column.name if path.column is not None else path.canonical
        self._payload = path.column is None

    def index_columns(self) -> tuple[str, ...]:
        return (self.column,)

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        return not self._payload

    # The values held are kept from draw to draw as found under the policy version the
    # draw read first (storage.kept): the statements finding them must see that version.
    flat_snapshot = True

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        # The groups are the values the matching rows hold (a value every row of which is
        # stale, spent or filtered out gets no share): over the database, the column's
        # distinct values (too many: the key index serves) and which a matching row holds;
        # a key index held in memory holds the matching rows alone.
        values = space.distinct(self.column)
        if not values:
            return None  # none: the key index says so
        if space.listed is None:
            if len(values) > MAX_FLAT_GROUPS:
                return None
            if space.filtered:
                values = values_held(space, self.column, list(values))
                if not values:
                    return None
        rng = self.rng
        shares = self._shares(len(values), batch_size, rng)
        drawn = draw_shares(
            space,
            self.column,
            values,
            shares.tolist(),
            rng,
            hint=self.kept_hint(query_condition),
            budget=self.probe_budget,
        )
        if drawn is None:
            return None
        return Choice(drawn.keys[rng.permutation(batch_size)])

    @staticmethod
    def _shares(groups: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Rows per group: ``batch_size // groups`` each, one more for ``batch_size %
        groups`` distinct groups chosen at random."""
        shares = np.full(groups, batch_size // groups, dtype=np.int64)
        shares[rng.choice(groups, size=batch_size % groups, replace=False)] += 1
        return shares


# -- the values the matching rows hold -------------------------------------------------------
# Which values of a column the matching rows of a draw hold, kept from draw to draw by
# each handle (see :mod:`expstore.storage.kept`).
#
# A :class:`~expstore.samplers.stratified.StratifiedSampler` narrowed by a condition,
# ``max_staleness`` or ``consume_after`` gives a share of the batch to each value a matching
# row holds. For each value of the column (its distinct values, a loose index scan), the
# first matching row of the value from the first fresh key on is looked for through the
# column's index (:meth:`KeySpace.first_matching
# <expstore.storage.key_space.KeySpace.first_matching>`), as far as it takes: a value whose
# rows match nothing is a pass over its rows once. What was found is then kept, one key per
# value, and brought up to date:
#
# - a value held by a matching row (its witness) still is while that row matches (one
#   probe of all witnesses); otherwise its next matching row is looked for after the
#   witness, since the rows before it did not match and rows only leave the matching ones;
# - a value no matching row held up to the largest key then is looked for among the rows
#   written since alone.
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
