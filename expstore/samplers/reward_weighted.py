"""RewardWeightedSampler: probability proportional to exp(reward / temperature)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import EmptyBufferError
from .base import KeySampler

__all__ = ["RewardWeightedSampler"]


class RewardWeightedSampler(KeySampler):
    """Reward-prioritized sampling, as torchgfn's ``prioritized_sampling``.

    ``RewardWeightedSampler(temperature=1.0, *, seed=None)``

    A matching row is drawn, with replacement, with probability proportional to
    ``exp(reward_t / temperature)`` (a softmax over rewards; torchgfn's softmax over
    log-rewards is this with ``reward_t`` holding the log-reward). A high temperature
    flattens the distribution towards uniform, a low one concentrates it on the best rows.
    Rows without a ``reward_t`` are never drawn; if no matching row has one, sampling
    raises :class:`~expstore.EmptyBufferError`.

    >>> sampler = RewardWeightedSampler(temperature=0.5, seed=0)
    """

    columns = ("reward_t",)

    def __init__(self, temperature: float = 1.0, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        if not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        self.temperature = float(temperature)

    def _cdf(self, reward: np.ndarray) -> np.ndarray:
        def compute() -> np.ndarray:
            scaled = reward / self.temperature
            present = ~np.isnan(scaled)
            if not present.any():
                return np.zeros(0)
            # Subtracting the maximum keeps exp() from overflowing (softmax is shift-free).
            weights = np.where(present, np.exp(scaled - np.nanmax(scaled)), 0.0)
            return np.cumsum(weights)

        return self.derived(f"cdf:{self.temperature!r}", (reward,), compute)

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        cdf = self._cdf(index["reward_t"])
        if not len(cdf):
            raise EmptyBufferError("no matching row has a reward_t")
        positions = np.searchsorted(cdf, rng.random(batch_size) * cdf[-1], side="right")
        return index["key"][np.minimum(positions, len(cdf) - 1)]
