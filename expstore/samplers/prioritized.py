"""PrioritizedSampler: prioritized experience replay over priorities stored in the database."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from typing_extensions import Unpack

from .._args import check_number
from ..errors import EmptyBufferError
from ..lifecycle.reader_state import Signature
from ..query import QueryCondition
from ..storage.base import KeySpace, Storage
from .base import KeySampler, SamplerOptions
from .loop import Choice

__all__ = ["PrioritizedSampler"]

#: Least likely rows of a key index checked against the draw counts before a draw (see
#: :meth:`PrioritizedSampler.newly_spent`).
_LEAST_CHECKED = 64


class PrioritizedSampler(KeySampler):
    """Prioritized experience replay (Schaul et al. 2016), proportional variant.

    ``PrioritizedSampler(alpha=0.6, beta=0.4, eps=1e-6, *, seed=None)``

    A matching row with stored priority ``p`` is drawn, with replacement, with probability
    ``P = (p + eps) ** alpha / sum_j (p_j + eps) ** alpha``. Priorities live in the
    database (``buffer.update_priorities(ids, priorities)``), so they survive restarts and
    every process sees them. A row whose priority was never set counts as the current
    maximum stored priority in the buffer (1.0 when none is set), whatever the condition,
    so new rows are likely to be seen soon.

    Each batch carries importance-sampling weights ``w = (N * P) ** -beta``, normalised by
    the largest weight any matching row could get (that of the least likely row), so
    ``0 < w <= 1``. They are reachable three ways:

    - ``buffer.sample(sampler=PrioritizedSampler(), converter=TensorConverter(...))``: the
      batch dict gains ``"weights"`` (a tensor) and ``"ids"``, whatever the converter that
      builds a dict;
    - after any batch: ``sampler.last_info`` (a :class:`~expstore.samplers.loop.SampleInfo` with
      ``keys``, ``ids`` and ``weights``), or ``sampler.last_weights`` and
      ``sampler.last_ids``;
    - ``rows, extras = sampler.sample_with_info(storage, n)``: ``extras["weights"]``
      (float32 array) and ``extras["ids"]``, aligned with ``rows``.

    A training step then feeds back new priorities (e.g. absolute TD errors)::

        batch = buffer.sample(sampler=per, converter=conv, batch_size=256)
        loss = (batch["weights"] * td_error**2).mean()
        buffer.update_priorities(batch["ids"], td_error.abs().detach().numpy())

    Choosing keys is vectorised numpy over the cached priority array (cumulative sum, once
    per change of the buffer, then ``searchsorted``); there is no loop over rows. ``beta``
    may be changed between calls (annealing).
    """

    columns = ("priority",)
    weighs_rows = True
    #: Entries of the priority index walked for the least matching priority before the
    #: walk goes as far as it takes (None): it finds it early unless matching rows are
    #: rare among the lowest priorities. A knob for tests and measurements
    #: (``sampler.walks = (2, 4, None)``); the last must be None.
    walks: tuple[int | None, ...] = (64, 4096, None)

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        **options: Unpack[SamplerOptions],
    ) -> None:
        super().__init__(**options)
        self.alpha = check_number("alpha", alpha, minimum=0)
        self.beta = check_number("beta", beta, minimum=0)
        self.eps = check_number("eps", eps, minimum=0)

    @property
    def last_weights(self) -> np.ndarray:
        """The importance weights of the last batch (float32, aligned with its rows)."""
        info = self.last_info
        if info is None or info.weights is None:
            return np.empty(0, dtype=np.float32)
        return info.weights

    def read_index(self, storage: Storage, query_condition: QueryCondition) -> dict[str, Any]:
        """The matching rows' priorities and, under a condition, ``max_staleness`` or
        ``consume_after``, the buffer's largest stored priority (``"max_priority"``), which
        rows without one count as."""
        if query_condition is None:
            index = super().read_index(storage, query_condition)
            if not self.narrowed(None):
                return index
            # max_staleness / consume_after leave rows out of the index after this read:
            # the largest is the whole buffer's, taken before.
            whole = index["priority"]
        else:
            index, everything = storage.key_indexes(
                [(query_condition, self.columns_read()), (None, ("priority",))]
            )
            whole = everything["priority"]
        largest = self.derived("max", (whole,), lambda: _largest(whole))
        return {**index, "max_priority": largest}

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        return True

    # The envelope comes from the priority bounds; the probes must see the same priorities.
    flat_snapshot = True

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        # Rejection under the envelope of the buffer's largest priority (an upper bound of
        # the matching rows' too). The weights' normaliser is the least likely matching
        # row's: under a condition, max_staleness or consume_after, the least priority
        # among the matching rows, found at the low end of the priority index and kept up
        # to date from draw to draw by the handle (see least_matching_priority below).
        bounds = space.priority_bounds()
        largest = 1.0 if bounds.largest is None else bounds.largest
        smallest = largest if bounds.smallest is None else bounds.smallest
        if space.filtered and bounds.smallest is not None:
            least = least_matching_priority(space, self.walks)
            smallest = min(least, largest)  # inf: no matching row holds a priority
        top = (largest + self.eps) ** self.alpha
        low = (smallest + self.eps) ** self.alpha
        if not math.isfinite(top):
            return None
        if not low > 0:  # priorities 0 with eps 0: such rows are never drawn
            low = self._least_drawable(space, largest)
            if low is None:
                return None  # the key index finds the least drawable row

        drawn = self.draw_rows(
            space,
            batch_size,
            query_condition,
            columns=("priority",),
            accept=lambda columns: self._weights(columns["priority"], largest) / top,
            name=f"priority:{self.alpha!r}:{self.eps!r}:{largest!r}",
        )
        if drawn is None:
            return None
        # (N P_i)^-beta / max_j (N P_j)^-beta == (w_i / min_j w_j)^-beta
        weights = self._weights(drawn.columns["priority"], largest) / low
        weights = np.power(weights, -self.beta).astype(np.float32)
        return Choice(drawn.keys, {"key": drawn.keys, "drawn_weights": weights})

    def _weights(self, priority: np.ndarray, largest: float) -> np.ndarray:
        """``(p + eps) ** alpha`` of each priority, rows without one counting as
        ``largest``."""
        filled = np.where(np.isnan(priority), largest, priority)
        weights: np.ndarray = np.power(filled + self.eps, self.alpha)
        return weights

    def _least_drawable(self, space: KeySpace, largest: float) -> float | None:
        """The least positive weight among the matching rows held in memory (None over
        the database, which does not find it); EmptyBufferError when none is positive."""
        if space.listed is None:
            return None
        priority = space.listed["priority"]

        def compute() -> float:
            weights = self._weights(priority, largest)
            positive = weights[weights > 0]
            return float(positive.min()) if len(positive) else 0.0

        name = f"least:{self.alpha!r}:{self.eps!r}:{largest!r}"
        least = space.remember(name, (priority,), compute)
        if not least > 0:
            raise EmptyBufferError(
                "every matching row has priority 0 and eps is 0, so none can be drawn"
            )
        return least

    def newly_spent(self, storage: Storage, index: dict[str, Any]) -> bool:
        """With ``consume_after``, the weights' normaliser must be an unspent row's: the
        :data:`_LEAST_CHECKED` least likely rows of ``index`` are checked against the draw
        counts (by key). When some were spent by others since, every spent row is read
        again and left out (rows spent by the least likely first, as learners that lower
        the priorities of what they drew spend them, would otherwise take a round each)."""
        limit = self.consume_after
        if limit is None:
            return False
        priority, largest = index["priority"], index.get("max_priority")
        top = _largest(priority) if largest is None else largest
        weights = self.derived(
            f"weights:{self.alpha!r}:{self.eps!r}:{top!r}",
            (priority,),
            lambda: self._weights(priority, top),
        )
        drawable = np.flatnonzero(weights > 0)
        if len(drawable) > _LEAST_CHECKED:
            lowest = np.argpartition(weights[drawable], _LEAST_CHECKED)[:_LEAST_CHECKED]
            drawable = drawable[lowest]
        if not len(storage.spent_keys(limit, among=index["key"][drawable])):
            return False
        self._read_spent(storage, limit)
        return True


def _largest(priority: np.ndarray) -> float:
    """The largest stored priority, 1.0 when none is stored."""
    stored = priority[~np.isnan(priority)]
    return float(stored.max()) if len(stored) else 1.0


# -- the least matching priority -------------------------------------------------------------
# The least priority among a prioritized draw's matching rows, kept from draw to draw by
# the storage (``space.kept``, see :class:`~expstore.storage.base.Kept`), for every
# sampler of the process.
#
# A :class:`PrioritizedSampler` narrowed by a condition,
# ``max_staleness`` or ``consume_after`` draws over the key space with importance weights
# normalised by its least likely matching row: the least stored priority among the rows it
# draws from (rows without one count as the buffer's largest). Finding it again for every
# draw would cost a walk of the priority index, and where the lowest priorities belong to
# rows that do not match (old rows trained on, under ``max_staleness``), a pass over the
# buffer's priorities (or the fresh rows' ones). So it is found once
# (:meth:`KeySpace.lowest_priority <expstore.storage.base.KeySpace.lowest_priority>`: a
# short walk of the index, a longer one, then as far as it takes) and then kept up to
# date, as a key index is, from what changed since:
#
# - priority updates, from the priority log: an updated matching row below the least is the
#   new least (one probe of the updated keys); when the row that held the least was
#   updated, it is found again;
# - the row holding it: still stored and matching (one probe of its key), or it is found
#   again; rows only ever leave the matching ones (eviction, spent draws, older versions
#   going stale), and new rows hold no priority, so while it stays the least stays;
# - anything else (deletes, a policy version set back, a log that no longer reaches back)
#   finds it again.

_WHAT = ("least priority",)


class LeastPriority(NamedTuple):
    """The least stored priority among a draw's matching rows and a row holding it (``inf``
    and None when none holds one)."""

    priority: float
    key: int | None


def least_matching_priority(space: KeySpace, walks: tuple[int | None, ...]) -> float:
    """The least stored priority among ``space``'s matching rows (``inf`` when none holds
    one), kept by ``space.kept``; found by walks of the priority index of ``walks``
    entries, the last (None) as far as it takes."""
    since = space.kept.get(space, _WHAT)
    least = None if since is None else _brought_up_to_date(space, since.found, since.signature)
    if least is None:
        for walk in walks:
            found = space.lowest_priority(walk)
            if found is not None:
                least = LeastPriority(*found)
                break
    assert least is not None  # the last walk goes as far as it takes
    space.kept.put(space, _WHAT, least)
    return least.priority


def _brought_up_to_date(
    space: KeySpace, kept: LeastPriority, found_at: Signature
) -> LeastPriority | None:
    """The least ``kept`` as it is now, or None when it must be found again."""
    signature = space.signature
    assert signature is not None
    least = kept
    if signature.priority_version != found_at.priority_version:
        logged = space.logged_priorities(found_at.priority_version)
        if logged is None:
            return None
        keys, values = logged
        if least.key is not None and least.key in keys:
            return None  # its row's priority changed: it may no longer be the least
        lower = keys[values < least.priority]
        if len(lower):
            found = space.probe(lower, ("priority",))
            if len(found["key"]):
                at = int(np.argmin(found["priority"]))
                least = LeastPriority(float(found["priority"][at]), int(found["key"][at]))
    if least.key is not None and least is kept:
        still = space.probe(np.array([least.key], dtype=np.int64))
        if not len(still["key"]):
            return None  # evicted, deleted, stale or spent since
    return least
