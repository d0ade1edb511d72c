"""RewardWeightedSampler: probability proportional to exp(reward / temperature)."""

from __future__ import annotations

import math

import numpy as np
from typing_extensions import Unpack

from .._args import check_number
from ..errors import EmptyBufferError
from ..query import Comparison, Condition, QueryCondition
from ..storage.base import KeySpace
from .base import KeySampler, SamplerOptions
from .loop import Choice

__all__ = ["RewardWeightedSampler"]


class RewardWeightedSampler(KeySampler):
    """Reward-prioritized sampling, as torchgfn's ``prioritized_sampling``.

    ``RewardWeightedSampler(temperature=1.0, *, seed=None)``

    A matching row is drawn, with replacement, with probability proportional to
    ``exp(reward_t / temperature)`` (a softmax over rewards; torchgfn's softmax over
    log-rewards is this with ``reward_t`` holding the log-reward). A high temperature
    flattens the distribution towards uniform, a low one concentrates it on the best rows.
    Weights are computed as ``exp((reward_t - max reward_t) / temperature)``, so no reward
    and no temperature overflows: rows whose weight underflows to 0 are simply never drawn,
    and the rows holding the maximum always keep their share.
    Rows without a ``reward_t`` are never drawn; if no matching row has one, sampling
    raises :class:`~expstore.EmptyBufferError`.

    >>> sampler = RewardWeightedSampler(temperature=0.5, seed=0)
    """

    columns = ("reward_t",)

    def __init__(self, temperature: float = 1.0, **options: Unpack[SamplerOptions]) -> None:
        super().__init__(**options)
        self.temperature = check_number("temperature", temperature, positive=True)

    def drawable(self) -> Condition | None:
        """Rows without a ``reward_t`` are never drawn."""
        return Comparison("reward_t", "is_not_null")

    # The envelope comes from the largest reward; the probes must see the same rows.
    flat_snapshot = True

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        return True

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        # Rejection with the envelope exp((r - r_max) / T) <= 1, r_max the buffer's largest
        # reward (by its index; under a condition still an upper bound, which keeps the
        # draw exact): a candidate is kept with its weight, so rows come in proportion to
        # exp(r / T). Rewards that make it steep fall back to the key index (see flat).
        top = space.largest("reward_t")
        if space.listed is None and (top is None or not math.isfinite(top)):
            return None  # no reward (the key index explains), or an infinite one
        if top is None:
            raise EmptyBufferError("no matching row has a reward_t")
        temperature = self.temperature

        def accept(columns: dict[str, np.ndarray]) -> np.ndarray:
            reward = columns["reward_t"]
            with np.errstate(over="ignore", invalid="ignore"):
                weight = np.exp((reward - top) / temperature)
            # rows holding the maximum get exactly 1 (also when it is +-inf, where the
            # difference would be NaN); rows without a reward never come
            weight = np.where(reward == top, 1.0, weight)
            return np.where(np.isnan(reward), 0.0, np.minimum(weight, 1.0))

        name = f"reward:{temperature!r}:{top!r}"
        return self.choose_rows(
            space, batch_size, query_condition, columns=("reward_t",), accept=accept, name=name
        )
