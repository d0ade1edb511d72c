"""Epochs over the key space: every row once per epoch, in a random order, holding nothing
that grows with the buffer.

An epoch covers the buffer's key range as it was when the epoch began, ``lo .. hi``: the
rows stored during it have larger keys and join the next one, the rows deleted during it
are not found and are skipped, as with the key-index epochs of
:class:`~expstore.UniformSampler`. Its order is a :class:`KeyPermutation` of the range's
positions, a keyed bijection computed on demand: a process keeps the range, the
permutation's round keys and how far the epoch has gone, not a shuffled list of N keys.
Each call walks the permutation from there, probes the candidate keys
(:meth:`~expstore.storage.key_space.KeySpace.probe`) and keeps those that are rows, in
permutation order, until the batch is full or the epoch ends (a short last batch). Under a
condition (or ``max_staleness``) the probe keeps the rows that match when the walk reaches
them; the cost of a batch is then its size over the share of the range that matches,
which the sampler measures before it begins an epoch (it shuffles a copy of the matching
keys instead when that share is small). When the share falls during an epoch (rows gone
stale, spent by other processes, deleted) so far that a call probes its budget without
filling the batch, the epoch goes on over the key index: the matching keys the walk has
not reached yet (:func:`rest_of_epoch`, by the permutation's inverse), so no row comes
twice or is left out. Under ``max_staleness`` the range begins at the first fresh row
(:attr:`~expstore.storage.key_space.KeySpace.low`); a row of the range that becomes
fresh again during the epoch (the version forced back) comes in it if the walk has not
passed it yet, else in the next epoch (over the key index: in the next epoch); no row
comes twice in an epoch either way.

The permutation is a balanced Feistel network over the smallest even power of two that
holds the range, with cycle-walking back into it: a bijection for any round function, so
each key comes exactly once; its order is pseudo-random (a keyed mix per round), not a
uniformly random permutation in the cryptographic sense, which no epoch sampler needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..errors import InvalidArgumentError
from ..storage.base import KeySpace

__all__ = ["EpochState", "KeyPermutation", "next_in_epoch", "rest_of_epoch"]

#: Feistel rounds (four give a pseudo-random permutation from pseudo-random round functions).
ROUNDS = 6
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class KeyPermutation:
    """A keyed bijection of ``0 .. size - 1``, computed for any positions at once."""

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        if size < 1:
            raise InvalidArgumentError(f"a permutation needs at least one position, got {size}")
        bits = max(2, (size - 1).bit_length())
        bits += bits % 2
        self.size = size
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        self.keys = rng.integers(0, 1 << 63, size=ROUNDS, dtype=np.uint64)

    def _round(self, right: np.ndarray, key: np.uint64) -> np.ndarray:
        x = (right + key) * _GOLDEN
        x ^= x >> np.uint64(30)
        x *= _MIX_1
        x ^= x >> np.uint64(27)
        x *= _MIX_2
        x ^= x >> np.uint64(31)
        return x & self.mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self.half) | right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.keys[::-1]:
            left, right = right ^ self._round(left, key), left
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The images of ``positions`` (each in ``0 .. size - 1``), as int64."""
        return self._walk(self._encrypt, positions)

    def inverse(self, images: np.ndarray) -> np.ndarray:
        """The positions whose images are ``images`` (each in ``0 .. size - 1``), as int64."""
        return self._walk(self._decrypt, images)

    def _walk(self, step: Callable[[np.ndarray], np.ndarray], values: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            out = step(np.asarray(values, dtype=np.uint64))
            outside = out >= self.size
            while outside.any():  # cycle-walking: at most a few steps, 4x the size at most
                out[outside] = step(out[outside])
                outside = out >= self.size
        return out.astype(np.int64)


class EpochState(NamedTuple):
    """Where an epoch over the key space stands."""

    low: int  # the key range when the epoch began
    span: int
    permutation: KeyPermutation
    position: int  # how many of the range's positions the epoch has walked
    share: float  # the share of positions last found to be (matching) rows


def next_in_epoch(
    space: KeySpace, state: EpochState, batch_size: int, budget: int
) -> tuple[np.ndarray, EpochState]:
    """Up to ``batch_size`` keys of rows of ``space`` (matching its condition) next in the
    epoch, in epoch order, and the epoch's state after them: fewer when the epoch ends, or
    when ``budget`` candidates were probed first (so few of the range's keys match now that
    the rest of the epoch should go on over the key index: :func:`rest_of_epoch`)."""
    low, span, permutation, position, share = state
    taken: list[np.ndarray] = []
    need, probed = batch_size, 0
    rate = min(max(share, 1 / 64), 1.0)
    while need and position < span and probed < budget:
        size = min(span - position, math.ceil(need / rate * 1.2) + 16, budget - probed)
        probed += size
        candidates = low + permutation(np.arange(position, position + size))
        found = space.probe(candidates)["key"]
        hit = np.flatnonzero(np.isin(candidates, found, assume_unique=True))
        if len(hit) > need:  # the rest of the round stays for the next call
            hit = hit[:need]
            size = int(hit[-1]) + 1
        taken.append(candidates[hit])
        position += size
        need -= len(hit)
        rate = max(len(hit) / size, 1 / 64) if size else rate
    keys = np.concatenate(taken) if taken else np.empty(0, np.int64)
    return keys, EpochState(low, span, permutation, position, rate)


def rest_of_epoch(state: EpochState, keys: np.ndarray) -> np.ndarray:
    """Of ``keys`` (the matching rows' keys, from a key index), those the epoch has not
    reached yet, in epoch order: the keys of its range whose positions in its permutation
    are at or past where it stands (keys above the range, stored since it began, join the
    next epoch)."""
    inside = keys[(keys >= state.low) & (keys < state.low + state.span)]
    positions = state.permutation.inverse(inside - state.low)
    ahead = positions >= state.position
    return inside[ahead][np.argsort(positions[ahead], kind="stable")]
