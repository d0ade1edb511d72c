"""RecencySampler: newer rows more likely, as WebGym's ``recency_bias_power``."""

from __future__ import annotations

import numpy as np
from typing_extensions import Unpack

from .._args import check_number
from ..query import QueryCondition
from ..storage.base import KeySpace
from .base import KeySampler, SamplerOptions
from .flat import draw_ranks
from .loop import Choice

__all__ = ["RecencySampler"]


class RecencySampler(KeySampler):
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

    #: Stale rows among the fresh ones (under ``max_staleness``) a draw by rank leaves out,
    #: at most; beyond, it draws over the key index. A knob for tests and measurements
    #: (``sampler.late_keys = 3``).
    late_keys: int = 4096

    def __init__(self, power: float = 1.0, **options: Unpack[SamplerOptions]) -> None:
        super().__init__(**options)
        self.power = check_number("power", power)

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        return query_condition is None and self.consume_after is None

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        # Ranks are keys' distances from the smallest matching one when every key of the
        # range is a matching row (a dense buffer; under max_staleness, one whose stale rows
        # are all older than its fresh ones: see KeySpace.every_key_matches); with a few
        # late stale rows among the fresh ones, less the late keys before them.
        if space.every_key_matches:
            late = np.empty(0, dtype=np.int64)
        elif space.dense and self.max_staleness is not None:
            found = space.late_stale_keys(self.late_keys)  # those from low to max_key
            if found is None:
                return None
            late = found
        else:
            return None
        count = space.max_key - space.low + 1 - len(late)
        ranks = draw_ranks(count, batch_size, self.power, self.rng)
        if ranks is None:
            return None
        # The r-th matching key is low + r + the late keys before it: those whose key, less
        # low and the late keys before them, is at most r.
        before = late - space.low - np.arange(len(late))
        return Choice(space.low + ranks + np.searchsorted(before, ranks, side="right"))

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        keys = index["key"]
        n = len(keys)
        if batch_size >= n:
            return keys[rng.permutation(n)]
        if self.power == 0.0:
            return keys[rng.choice(n, size=batch_size, replace=False)]
        # Gumbel top-k: the k largest log-weight + Gumbel noise are a draw of k items
        # without replacement, successively proportional to weight. Logs keep large
        # powers from overflowing.
        log_weights = self.power * np.log(np.arange(1, n + 1, dtype=np.float64))
        scores = log_weights + rng.gumbel(size=n)
        top = np.argpartition(scores, n - batch_size)[n - batch_size :]
        top = top[np.argsort(-scores[top], kind="stable")]
        return keys[top]
