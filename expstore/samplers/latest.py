"""LatestSampler: the newest matching rows."""

from __future__ import annotations

import numpy as np

from .by_rank import ByRank

__all__ = ["LatestSampler"]


class LatestSampler(ByRank):
    """The ``batch_size`` most recently stored matching rows, newest first.

    ``LatestSampler(*, seed=None)`` (no randomness; ``seed`` is accepted for uniformity)

    Recency is insertion order. A batch larger than the matching rows returns all of them.
    Useful for on-policy updates from the latest rollouts.

    >>> sampler = LatestSampler()
    """

    def choose_ranks(self, count: int, batch_size: int, *, every_rank: bool) -> np.ndarray:
        return np.arange(count - 1, max(count - batch_size, 0) - 1, -1)
