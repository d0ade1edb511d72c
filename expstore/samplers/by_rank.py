"""ByRank: the samplers that choose matching rows by rank (insertion order)."""

from __future__ import annotations

import numpy as np

from ..query import QueryCondition
from ..storage.base import KeySpace
from .base import KeySampler
from .flat import ranked
from .loop import Choice

__all__ = ["ByRank"]


class ByRank(KeySampler):
    """A sampler that chooses matching rows by rank (insertion order, the oldest rank 0):
    :meth:`choose_ranks` says which; the ranks are made keys without a probe (see
    :func:`~expstore.samplers.flat.ranked`: positions in a key index, or distances in a
    dense range), once over either space."""

    #: Stale rows among the fresh ones (under ``max_staleness``) a draw by rank leaves out,
    #: at most; beyond, it draws over the key index. A knob for tests and measurements
    #: (``sampler.late_keys = 3``).
    late_keys: int = 4096

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        return query_condition is None and self.consume_after is None

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        rows = ranked(space, self.late_keys)
        if rows is None or not rows.rows:
            return None
        ranks = self.choose_ranks(rows.rows, batch_size, every_rank=space.listed is not None)
        return None if ranks is None else Choice(rows.keys(ranks))

    def choose_ranks(self, count: int, batch_size: int, *, every_rank: bool) -> np.ndarray | None:
        """The ranks of a batch among ``count`` matching rows, in batch order; None when
        that does not pay without holding every rank (``every_rank`` False: the key index
        serves then)."""
        raise NotImplementedError
