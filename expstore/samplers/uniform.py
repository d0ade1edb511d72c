"""UniformSampler: every matching row equally likely."""

from __future__ import annotations

from typing import Any

import numpy as np
from typing_extensions import Unpack

from ..query import QueryCondition
from ..storage.base import KeySpace, Storage
from .base import KeySampler, SamplerOptions
from .epochs import EpochState, KeyPermutation, next_in_epoch, rest_of_epoch
from .loop import Choice

__all__ = ["UniformSampler"]

#: An epoch walks the key range when at least one key in this many is a row of the buffer,
_SPARSE = 8
#: and at least one in this many a matching row (a condition, max_staleness): a batch then
#: probes at most this many candidates per row (see :mod:`expstore.samplers.flat`).
_SPARSE_MATCHING = 64
#: Random candidates probed to measure the matching share when an epoch begins.
_SHARE_PROBES = 1024
#: The most keys of a key-index epoch a batch looks at in one pass.
_EPOCH_CHUNK = 16384


class UniformSampler(KeySampler):
    """Uniform sampling over the matching rows.

    ``UniformSampler(replacement=True, *, seed=None)``

    - ``replacement=True``: each row of the batch is drawn independently; a batch larger
      than the matching rows is filled with repeats.
    - ``replacement=False``: epochs. Each matching row is returned once per epoch across
      successive calls, in a random order; the call that exhausts an epoch returns only
      what is left of it (a short batch), and the next call starts a new epoch. A batch
      larger than the matching rows is one whole epoch. Rows stored during an epoch join
      the next one; rows deleted during it are skipped. Changing the condition starts a
      new epoch. An epoch walks a keyed permutation of the key range
      (:mod:`expstore.samplers.epochs`), holding nothing that grows with the buffer; under
      a condition or ``max_staleness`` it keeps the rows that match when the walk reaches
      them. When few keys of the range are matching rows (under one in 64, measured when
      the epoch begins: a rare condition, a buffer whose keys are mixed with many of other
      buffers') it shuffles a copy of the matching keys instead. A batch chosen again (a
      row deleted before the fetch, a rate limit's wait) loses no row of the epoch.

    >>> sampler = UniformSampler(replacement=False, seed=0)
    """

    def __init__(self, replacement: bool = True, **options: Unpack[SamplerOptions]) -> None:
        super().__init__(**options)
        self.replacement = bool(replacement)
        self._epoch: np.ndarray | None = None
        self._position = 0
        self._epoch_condition: Any = None
        self._flat_epoch: EpochState | None = None
        #: An epoch over the key space to go on over the key index, and the keys its last
        #: call found before it gave up (see :func:`~expstore.samplers.epochs.rest_of_epoch`).
        self._handover: tuple[EpochState, np.ndarray] | None = None

    def reseed(self, seed: Any) -> None:
        super().reseed(seed)
        self._new_epoch()

    def forget_buffer(self) -> None:
        super().forget_buffer()
        self._new_epoch()

    def _new_epoch(self) -> None:
        """Begin a new epoch at the next draw."""
        self._epoch = None
        self._position = 0
        self._flat_epoch = None
        self._handover = None

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        if not self.replacement and not _same_condition(self._epoch_condition, query_condition):
            self._new_epoch()
            self._epoch_condition = query_condition
        return super().choose(storage, batch_size, query_condition)

    def mark(self) -> Any:
        # Epoch states are replaced, never changed in place: holding them is a snapshot.
        if self.replacement:
            return None
        return (
            self._epoch,
            self._position,
            self._flat_epoch,
            self._epoch_condition,
            self._handover,
        )

    def rewind(self, mark: Any) -> None:
        if mark is not None:
            (
                self._epoch,
                self._position,
                self._flat_epoch,
                self._epoch_condition,
                self._handover,
            ) = mark

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        # An epoch stays on the path it began on: a key-index epoch is finished over it.
        return self.replacement or not (
            self._epoch is not None and self._position < len(self._epoch)
        )

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        if not self.replacement:
            if space.listed is not None:  # an epoch over the key index held in memory
                return Choice(self._next_from_epoch(space.listed["key"], batch_size, self.rng))
            return self._epoch_over_key_space(space, batch_size)
        return self.choose_rows(space, batch_size, query_condition)

    def _epoch_over_key_space(self, space: KeySpace, batch_size: int) -> Choice | None:
        """The next keys of an epoch over the key space; None to begin one over the key
        index instead."""
        state = self._flat_epoch
        for _ in range(2):  # an epoch whose remaining rows were all deleted: the next
            if state is None or state.position >= state.span:
                share = self._matching_share(space)
                if share < 1 / _SPARSE_MATCHING:
                    self._flat_epoch = None
                    return None
                low, high = space.candidates
                permutation = KeyPermutation(high - low, self.rng)
                state = EpochState(low, high - low, permutation, 0, share)
                self._epoch = None  # the key index's epoch, if one ran, is over
            budget = max(self.probe_budget, 128 * batch_size)
            keys, state = next_in_epoch(space, state, batch_size, budget)
            self._flat_epoch = state
            if len(keys) < batch_size and state.position < state.span:
                # Few keys of the range match now (rows gone stale, spent or deleted
                # since the epoch began): the rest of it goes on over the key index.
                self._handover = (state, keys)
                return None
            if len(keys):
                return Choice(keys)
        return None

    def _matching_share(self, space: KeySpace) -> float:
        """The share of the key range that is matching rows, for an epoch about to begin
        (0 when an epoch should not walk the range): the rows over the span without a
        condition; under one, the share of :data:`_SHARE_PROBES` random candidates (or of
        the whole range, if smaller) the probe keeps."""
        if not space.rows or space.rows * _SPARSE < space.span:
            return 0.0
        if not space.filtered:
            return space.rows / space.span
        low, high = space.candidates
        if high <= low:
            return 0.0
        if high - low <= _SHARE_PROBES:
            candidates = np.arange(low, high)
        else:
            candidates = self.rng.integers(low, high, _SHARE_PROBES)
        found = space.probe(np.unique(candidates))["key"]
        return float(np.isin(candidates, found).mean())

    def _next_from_epoch(
        self, keys: np.ndarray, batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        while True:
            if self._epoch is None or self._position >= len(self._epoch):
                flat = self._flat_epoch
                if self._handover is not None:  # the rest of an epoch over the key space
                    state, found = self._handover
                    self._epoch = np.concatenate([found, rest_of_epoch(state, keys)])
                    self._handover = None
                elif flat is not None and flat.position < flat.span:
                    # An epoch over the key space left unfinished (the key index chosen
                    # meanwhile, a batch chosen again after its hand-over): its rest.
                    self._epoch = rest_of_epoch(flat, keys)
                else:
                    self._epoch = keys[rng.permutation(len(keys))]
                self._position = 0
                self._flat_epoch = None  # an epoch over the key space, if one ran, is over
            # Keys deleted since the epoch began are skipped (keys is sorted), and their
            # places taken by the epoch's next keys: a batch is short only at its end.
            parts: list[np.ndarray] = []
            wanted, span = batch_size, max(batch_size, 1024)
            while wanted and self._position < len(self._epoch):
                chunk = self._epoch[self._position : self._position + span]
                found = np.searchsorted(keys, chunk).clip(max=len(keys) - 1)
                alive = np.flatnonzero(keys[found] == chunk)
                hits = len(alive)
                alive = alive[:wanted]
                # The epoch goes on just past the last key taken (all of the chunk if
                # it held too few).
                self._position += int(alive[-1]) + 1 if len(alive) == wanted else len(chunk)
                parts.append(chunk[alive])
                wanted -= len(alive)
                # Few keys of the epoch left: look as far as the rest likely needs (in
                # chunks small enough for the CPU's caches).
                span = 2 * span if not hits else 2 * wanted * len(chunk) // hits
                span = min(max(span, 1024), _EPOCH_CHUNK)
            if parts and (batch := np.concatenate(parts)).size:
                return batch


def _same_condition(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable conditions are different ones
        return False
