"""LatestSampler: the newest matching rows."""

from __future__ import annotations

import numpy as np

from .base import KeySampler

__all__ = ["LatestSampler"]


class LatestSampler(KeySampler):
    """The ``batch_size`` most recently stored matching rows, newest first.

    ``LatestSampler(*, seed=None)`` (no randomness; ``seed`` is accepted for uniformity)

    Recency is insertion order. A batch larger than the matching rows returns all of them.
    Useful for on-policy updates from the latest rollouts.

    >>> sampler = LatestSampler()
    """

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        return index["key"][::-1][:batch_size]
