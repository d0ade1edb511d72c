"""Drawing without a key index: rejection over the buffer's key range.

A :class:`~expstore.storage.key_space.KeySpace` gives the range the buffer's keys lie in and
probes candidate keys. Candidates drawn uniformly from the range, kept when the probe finds
them (a row of the buffer matching the condition), are independent uniform draws among the
matching rows; kept again with probability ``w / w_max`` they are draws in proportion to
``w`` (prioritized replay). That is exact rejection sampling, and its cost is the batch
divided by the share of the range that is kept, whatever the buffer's size: nothing in
memory grows with the buffer.

When too little of the range is kept (a condition few rows meet, a buffer whose keys are
mixed with other buffers', weights far apart), :func:`draw_uniform` gives up after its
``budget`` of candidates and the sampler chooses over its key index instead (whose
matching rows are then few). Giving up depends only on what was drawn, and either way the
rows come from the same distribution, so the batch's distribution is exact.

Recency weights by rank need no probe when the buffer's keys are dense (every key of the
range a row of it): a rank is then a key's distance from the smallest, and
:func:`draw_ranks` draws ranks by the weight ``(rank + 1) ** power``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypedDict, cast

import numpy as np

from ..storage.base import KeySpace

__all__ = [
    "MIN_KEPT",
    "PROBE_BUDGET",
    "BlockedCdf",
    "DrawOptions",
    "Drawn",
    "Ranked",
    "draw_ranks",
    "draw_shares",
    "draw_uniform",
    "ranked",
    "top_ranks",
]

#: Candidate keys probed per batch at most (or 64 per row asked, if more) before a sampler
#: falls back to its key index: the default of ``draw_uniform(budget=)`` and of
#: :attr:`KeySampler.probe_budget <expstore.samplers.base.KeySampler.probe_budget>`.
PROBE_BUDGET = 1 << 15
#: Below this share of candidates kept (measured after the first round) a sampler falls
#: back to its key index at once: the matching rows are few enough to hold.
MIN_KEPT = 1 / 128

Accept = Callable[[dict[str, np.ndarray]], np.ndarray]


class DrawOptions(TypedDict, total=False):
    """What :func:`draw_uniform` takes for a sampler's draw (see
    :meth:`KeySampler.draw_rows <expstore.samplers.base.KeySampler.draw_rows>`)."""

    columns: Sequence[str]
    accept: Accept | None
    name: str | None
    min_kept: float
    min_tried: int
    probe: bool


class Drawn(NamedTuple):
    """Keys drawn (in draw order, repeats possible) and their probed columns."""

    keys: np.ndarray
    columns: dict[str, np.ndarray]
    #: The share of candidates kept, to size the next call's first round.
    kept: float


def draw_uniform(
    space: KeySpace,
    n: int,
    rng: np.random.Generator,
    *,
    columns: Sequence[str] = (),
    accept: Accept | None = None,
    quota: Accept | None = None,
    hint: float = 1.0,
    budget: int = PROBE_BUDGET,
    name: str | None = None,
    min_kept: float = MIN_KEPT,
    min_tried: int = 0,
    probe: bool = True,
) -> Drawn | None:
    """``n`` independent draws among the matching rows of ``space``: uniform, or, with
    ``accept`` (the probability of keeping each found candidate, from its ``"key"`` and
    ``columns``), in proportion to it. ``quota(columns)`` may then say which of the kept
    candidates, in order, are still wanted (a mask; stratified draws fill a share per
    group). None when it does not pay (see the module's docstring): past ``budget``
    candidates (or 64 per row asked, if more), or a share of them kept below ``min_kept``
    (once ``min_tried`` were drawn: a draw whose rows are rare tells only then).
    ``probe=False`` (with ``accept`` and no ``columns``): candidates are not probed, and
    ``accept`` alone says which are kept (a chance of 0 for a key that is not a matching
    row), where it finds that out anyway (the first rows of groups).

    Over a space that holds its rows in memory (:attr:`KeySpace.listed
    <expstore.storage.base.KeySpace.listed>`, a key index) the same draw takes positions in
    it directly: uniform ones, or, with ``accept``, by the cumulative sum of every row's
    chance, which ``name`` (what ``accept`` depends on beside the columns, e.g. the
    sampler's parameters) keeps while the arrays are unchanged."""
    if not space.rows or n <= 0:
        return None
    if space.listed is not None:
        return _draw_listed(space, space.listed, n, rng, columns, accept, quota, name, hint)
    low, high = space.candidates
    if high <= low:  # no row can match (see KeySpace.low)
        return None
    if accept is None and quota is None and not columns and space.every_key_matches:
        # Every key of the range is a matching row: nothing to probe.
        return Drawn(rng.integers(low, high, size=n), {}, 1.0)
    budget = max(budget, 64 * n)
    taken: list[np.ndarray] = []
    taken_columns: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    need, tried, kept = n, 0, 0
    rate = min(max(hint, min_kept), 1.0)
    while need:
        size = min(budget - tried, math.ceil(need / max(rate, min_kept) * 1.2) + 16)
        if size <= 0:
            return None
        candidates = rng.integers(low, high, size=size)
        if probe:
            found = space.probe(candidates, columns)
        else:  # accept alone says which candidates are matching rows
            found = {"key": np.unique(candidates)}
        where = _positions(found["key"], candidates)
        hit = where >= 0
        if accept is not None and hit.any():
            chances = accept({c: found[c][where[hit]] for c in ("key", *columns)})
            hit[np.flatnonzero(hit)[rng.random(int(hit.sum())) >= chances]] = False
        tried += size
        kept += int(hit.sum())
        chosen = np.flatnonzero(hit)
        if quota is not None:
            chosen = chosen[quota({c: found[c][where[chosen]] for c in columns})]
        chosen = chosen[:need]
        taken.append(candidates[chosen])
        for c in columns:
            taken_columns[c].append(found[c][where[chosen]])
        need -= len(chosen)
        # The share of candidates that were of use: with a quota, only those still wanted
        # (the last groups to fill may be a small part of the range).
        rate = (n - need) / tried if quota is not None else kept / tried
        if need and rate < min_kept and tried >= min_tried:
            return None
    keys = np.concatenate(taken)
    return Drawn(keys, {c: np.concatenate(v) for c, v in taken_columns.items()}, kept / tried)


def draw_shares(
    space: KeySpace,
    name: str,
    values: Sequence[Any],
    shares: Sequence[int],
    rng: np.random.Generator,
    *,
    hint: float = 1.0,
    budget: int = PROBE_BUDGET,
) -> Drawn | None:
    """``shares[i]`` independent uniform draws among the matching rows of ``space`` that
    hold ``values[i]`` in the column ``name``, for every ``i``, in no particular order
    (stratified draws). Over a space that holds its rows in memory, positions among each
    value's rows (:meth:`KeySpace.rows_of`, the values with a share alone); over the
    database, candidates drawn uniformly kept while their value still wants rows (see
    :func:`draw_uniform`), None when that does not pay."""
    if space.listed is not None:
        parts = []
        draws = rng.random(int(sum(shares)))
        taken = 0
        for value, share in zip(values, shares, strict=True):
            if share:
                held = space.rows_of(name, [value], ())
                if not len(held):
                    return None  # (a value no row holds: the caller's values are off)
                at = (draws[taken : taken + share] * len(held)).astype(np.int64)
                parts.append(held[at])
                taken += share
        keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return Drawn(keys, {}, hint)
    remaining = list(shares)
    number = {value: i for i, value in enumerate(values)}

    def wanted(columns: dict[str, np.ndarray]) -> np.ndarray:
        take = np.zeros(len(columns[name]), dtype=bool)
        for i, value in enumerate(columns[name].tolist()):
            group = number.get(value)
            if group is not None and remaining[group]:
                remaining[group] -= 1
                take[i] = True
        return take

    n = int(sum(shares))
    return draw_uniform(space, n, rng, columns=(name,), quota=wanted, hint=hint, budget=budget)


def _draw_listed(
    space: KeySpace,
    index: dict[str, np.ndarray],
    n: int,
    rng: np.random.Generator,
    columns: Sequence[str],
    accept: Accept | None,
    quota: Accept | None,
    name: str | None,
    hint: float,
) -> Drawn | None:
    """:func:`draw_uniform` over rows held in memory: positions drawn directly (``hint``
    comes back as the share kept: it sizes draws over the database, not these)."""
    rows = len(index["key"])
    if quota is None:
        if accept is None:
            at = rng.integers(0, rows, size=n)
        else:

            def compute() -> BlockedCdf:
                every = {c: index[c] for c in ("key", *columns)}
                chances = np.asarray(accept(every), dtype=np.float64)
                return BlockedCdf(np.cumsum(chances))

            sources = tuple(index[c] for c in ("key", *columns))
            cdf = compute() if name is None else space.remember(f"cdf:{name}", sources, compute)
            if not (cdf.total > 0 and math.isfinite(cdf.total)):
                return None  # no row can be drawn
            at = cdf.search(rng.random(n) * cdf.total)
    else:  # shares to fill: candidate positions kept as they are still wanted
        parts: list[np.ndarray] = []
        need = n
        for _ in range(64):
            candidates = rng.integers(0, rows, size=2 * need + 16)
            if accept is not None:
                chances = accept({c: index[c][candidates] for c in ("key", *columns)})
                candidates = candidates[rng.random(len(candidates)) < chances]
            wanted = quota({c: index[c][candidates] for c in columns})
            chosen = candidates[wanted][:need]
            parts.append(chosen)
            need -= len(chosen)
            if not need:
                break
        else:
            return None
        at = np.concatenate(parts)
    return Drawn(index["key"][at], {c: index[c][at] for c in columns}, hint)


def draw_ranks(count: int, n: int, power: float, rng: np.random.Generator) -> np.ndarray | None:
    """``n`` distinct ranks of ``0 .. count - 1``, drawn one after another with probability
    proportional to ``(rank + 1) ** power`` among those not yet drawn (successive sampling,
    as the key-index path's Gumbel top-k). None when ``n`` is not well below ``count`` or
    the power is too steep for rejection to pay.

    Proposals come from the continuous density ``x ** power`` on ``[1, count + 1)`` (by its
    inverse CDF), rank ``floor(x) - 1``, whose mass ``m(r)`` lies between ``(r+1) ** p`` and
    ``(r+2) ** p``; a proposal is kept with probability ``(r+1) ** p / (M m(r))``, ``M`` the
    largest ratio of the two (1 for ``p >= 0``, ``2 ** -p`` below), which makes the kept
    ranks exactly ``(r+1) ** p``-weighted."""
    if n * 4 > count or power < -1.0 or power > 64.0:
        return None
    if power == 0.0:
        return _distinct(lambda size: rng.integers(0, count, size=size), n, count)
    if (power + 1.0) * math.log(count + 1.0) > 700.0:  # exp() of it would overflow
        return None
    q = power + 1.0
    bound = 1.0 if power >= 0 else 2.0**-power

    def proposals(size: int) -> np.ndarray:
        u = rng.random(size)
        if q == 0.0:  # density 1/x
            x = np.exp(u * math.log(count + 1.0))
        else:
            top = math.log(count + 1.0) * q
            # x = (1 + u ((count + 1) ** q - 1)) ** (1 / q), in logs to stay finite
            x = np.exp(np.log1p(u * math.expm1(top)) / q)
        ranks = np.minimum(np.floor(x).astype(np.int64) - 1, count - 1)
        ranks = np.maximum(ranks, 0)
        r1 = ranks + 1.0
        # m(r) = ((r+2) ** q - (r+1) ** q) / q, computed without cancellation
        if q == 0.0:
            mass = np.log1p(1.0 / r1)
        else:
            mass = np.exp(q * np.log(r1)) * np.expm1(q * np.log1p(1.0 / r1)) / q
        chance = np.exp(power * np.log(r1)) / (bound * mass)
        return ranks[rng.random(size) < chance]

    return _distinct(proposals, n, count)


def top_ranks(count: int, n: int, power: float, rng: np.random.Generator) -> np.ndarray:
    """:func:`draw_ranks` where rejection does not pay, over every rank held in memory:
    all ``count`` ranks in a random order when ``n`` asks for as many; else Gumbel top-k
    (the ``n`` largest log-weights plus Gumbel noise are ``n`` ranks drawn one after
    another in proportion to ``(rank + 1) ** power`` among those not yet drawn; logs keep
    large powers from overflowing)."""
    if n >= count:
        return rng.permutation(count)
    if power == 0.0:
        return rng.choice(count, size=n, replace=False)
    scores = power * np.log(np.arange(1, count + 1, dtype=np.float64)) + rng.gumbel(size=count)
    top = np.argpartition(scores, count - n)[count - n :]
    return cast("np.ndarray", top[np.argsort(-scores[top], kind="stable")])


class Ranked(NamedTuple):
    """A space's matching rows by rank (insertion order, the oldest rank 0): how many there
    are and the key of each rank."""

    rows: int
    keys: Callable[[np.ndarray], np.ndarray]


def ranked(space: KeySpace, late_limit: int) -> Ranked | None:
    """The matching rows of ``space`` by rank, when a rank gives its key without a probe:
    rows held in memory (a rank is a position); a range whose every key is a matching row
    (a rank is the key's distance from the smallest one); or, under ``max_staleness``, a
    dense range with at most ``late_limit`` late stale rows among the fresh ones (less the
    late keys before it). None otherwise."""
    listed = space.listed
    if listed is not None:
        keys = listed["key"]
        return Ranked(len(keys), keys.__getitem__)
    if space.every_key_matches:
        late = np.empty(0, dtype=np.int64)
    elif space.dense and space.max_staleness is not None:
        found = space.late_stale_keys(late_limit)  # those from low to max_key
        if found is None:
            return None
        late = found
    else:
        return None
    low = space.low
    # The r-th matching key is low + r + the late keys before it: those whose key, less
    # low and the late keys before them, is at most r.
    before = late - low - np.arange(len(late))

    def keys_of(ranks: np.ndarray) -> np.ndarray:
        keys: np.ndarray = low + ranks + np.searchsorted(before, ranks, side="right")
        return keys

    return Ranked(space.max_key - low + 1 - len(late), keys_of)


def _distinct(draw: Callable[[int], np.ndarray], n: int, count: int) -> np.ndarray | None:
    """The first ``n`` distinct values of successive ``draw(size)`` calls, in order."""
    out: list[int] = []
    seen: set[int] = set()
    for _ in range(64):
        for value in draw(2 * (n - len(out)) + 16).tolist():
            if value not in seen:
                seen.add(value)
                out.append(value)
                if len(out) == n:
                    return np.array(out, dtype=np.int64)
    return None


def _positions(found: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Each candidate's position in ``found`` (sorted), -1 where it is not there."""
    if not len(found):
        return np.full(len(candidates), -1, dtype=np.int64)
    at = np.searchsorted(found, candidates).clip(max=len(found) - 1)
    return np.where(found[at] == candidates, at, -1)


class BlockedCdf:
    """A cumulative sum searched in two steps: which block of ``BLOCK`` entries (over a
    table of block ends small enough to stay in cache), then within that block (one
    contiguous read per target). Over a million rows this costs a third less than
    ``np.searchsorted`` over the whole sum, whose random probes miss the cache."""

    BLOCK = 32

    def __init__(self, cdf: np.ndarray) -> None:
        n = len(cdf)
        blocks = -(-n // self.BLOCK)
        padded = np.full(blocks * self.BLOCK, np.inf)
        padded[:n] = cdf
        self.n = n
        self.total = float(cdf[-1])
        self.blocks = padded.reshape(blocks, self.BLOCK)
        self.ends = self.blocks[:, -1].copy()

    def search(self, targets: np.ndarray) -> np.ndarray:
        """``np.searchsorted(cdf, targets, side="right")``, clipped to the last index."""
        block = np.searchsorted(self.ends, targets, side="right")
        np.minimum(block, len(self.ends) - 1, out=block)
        within = (self.blocks[block] <= targets[:, None]).sum(axis=1)
        positions = block * self.BLOCK + within
        return cast("np.ndarray", np.minimum(positions, self.n - 1, out=positions))
