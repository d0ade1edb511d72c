"""RecencySampler: newer rows more likely, as WebGym's ``recency_bias_power``."""

from __future__ import annotations

import numpy as np
from typing_extensions import Unpack

from .._args import check_number
from ..query import QueryCondition
from ..storage.base import KeySpace
from .base import KeySampler, SamplerOptions
from .flat import draw_ranks, ranked, top_ranks
from .loop import Choice

__all__ = ["ByRank", "RecencySampler"]


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


class RecencySampler(ByRank):
    """Weight ``(rank + 1) ** power`` by insertion order among the matching rows, without
    replacement (WebGym's recency-biased sampling).

    ``RecencySampler(power=1.0, *, seed=None)``

    The oldest matching row has rank 0, the newest rank ``n - 1``. ``power=0`` is uniform;
    a larger power favours recent rows more; a negative one favours old rows. The rows of a
    batch are distinct, drawn one after another with probability proportional to their
    weight among those not yet drawn (so the first row of a batch follows the weights
    exactly). A batch larger than the matching rows returns all of them.

    >>> sampler = RecencySampler(power=2.0, seed=0)
    """

    def __init__(self, power: float = 1.0, **options: Unpack[SamplerOptions]) -> None:
        super().__init__(**options)
        self.power = check_number("power", power)

    def choose_ranks(self, count: int, batch_size: int, *, every_rank: bool) -> np.ndarray | None:
        # Successive draws by rejection; over every rank (a key index) where that does not
        # pay, Gumbel top-k: the same distribution.
        ranks = draw_ranks(count, batch_size, self.power, self.rng)
        if ranks is None and every_rank:
            ranks = top_ranks(count, batch_size, self.power, self.rng)
        return ranks
