"""RecencySampler: newer rows more likely, as WebGym's ``recency_bias_power``."""

from __future__ import annotations

import numpy as np
from typing_extensions import Unpack

from .._args import check_number
from .base import SamplerOptions
from .by_rank import ByRank
from .flat import draw_ranks, top_ranks

__all__ = ["RecencySampler"]


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
