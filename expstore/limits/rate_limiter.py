"""Rate limits kept with the buffer (Reverb's ``RateLimiter``), obeyed by every process.

::

    buffer.set_rate_limiter(RateLimiter(min_size=1_000, samples_per_insert=4.0))
    batch = buffer.sample(sampler, batch_size=256)   # waits while the budget is spent

A limiter counts rows *inserted* into the buffer (``I``, from when it was set, rows already
there counting as inserted, less the rows *discarded*: inserted but never to be drawn, such
as groups a group condition refuses or rows gone stale) and rows *sampled* (``S``, every
row of every batch drawn by ``sample`` or ``claim``, by every process). As in Reverb:

- a sample of ``n`` rows may go when ``I >= min_size`` and
  ``I * samples_per_insert - (S + n) >= min_diff``;
- with ``block_writers=True`` a write of ``n`` rows may go when ``I + n <= min_size`` or
  ``(I + n) * samples_per_insert - S <= max_diff``;
- ``min_diff = samples_per_insert * min_size - error_buffer`` and ``max_diff =
  samples_per_insert * min_size + error_buffer`` (Reverb's ``SampleToInsertRatio``); the
  default ``error_buffer`` is ``samples_per_insert * min_size``, so samples never outrun
  ``samples_per_insert`` per inserted row. Without ``samples_per_insert`` only ``min_size``
  holds (Reverb's ``MinSize``).

A call that may not go waits, polling with back-off, up to ``timeout_s`` seconds, then raises
:class:`~expstore.errors.RateLimitedError` naming the bound that held it, with the numbers
(inserted, discarded, sampled, the settings) and when learners last sampled and actors
last inserted. ``RateLimiter.queue(max_size)`` bounds the backlog of rows inserted and
not yet claimed (Reverb's ``Queue``). A call that could
never go (a sample larger than the window writers are held to) raises
:class:`~expstore.errors.InvalidArgumentError` at once. The counters live in the database
(:mod:`expstore.limits.counters`) and survive restarts. Differences from Reverb: ``I``
counts inserts, not the table's size, so evictions do not lower it (which is why
``min_size`` above the buffer's capacity is refused). A discarded row leaves ``I`` for
``min_size`` (as Reverb's ``Delete`` lowers the size) *and* for the ratio: Reverb deletes
rows that were sampled, whose budget was spent; a discarded row was never drawable, so the
budget it would add could never be spent, and writers held by ``block_writers`` would wait
for samples that never come.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._args import check_int, check_number
from ..errors import InvalidArgumentError

__all__ = ["RateLimitStats", "RateLimiter"]

#: Stands for an unbounded difference (MinSize) in the database's float column.
UNBOUNDED = 1e300


@dataclass(frozen=True)
class RateLimiter:
    """``RateLimiter(min_size=1, samples_per_insert=None, error_buffer=None, *,
    block_writers=False, timeout_s=60.0)``; see :mod:`expstore.limits.rate_limiter`."""

    min_size: int = 1
    samples_per_insert: float | None = None
    error_buffer: float | None = None
    block_writers: bool = False
    timeout_s: float | None = 60.0

    def __post_init__(self) -> None:
        check_int("min_size", self.min_size, minimum=1)
        if self.samples_per_insert is not None:
            check_number("samples_per_insert", self.samples_per_insert, positive=True)
            floor = max(1.0, float(self.samples_per_insert))
            if self.error_buffer is not None:
                check_number("error_buffer", self.error_buffer, minimum=0.0)
                if self.error_buffer < floor:
                    raise InvalidArgumentError(
                        f"error_buffer must be at least max(1, samples_per_insert) = {floor:g} "
                        f"(else one insert or one sample could never fit), got "
                        f"{self.error_buffer!r}"
                    )
        elif self.error_buffer is not None:
            raise InvalidArgumentError(
                "error_buffer bounds the samples per insert; give samples_per_insert too, or "
                "leave error_buffer out for a min_size-only limit"
            )
        if self.block_writers and self.samples_per_insert is None:
            raise InvalidArgumentError(
                "block_writers holds writers to samples_per_insert; give samples_per_insert"
            )
        if not isinstance(self.block_writers, bool):
            raise InvalidArgumentError(f"block_writers must be a bool, got {self.block_writers!r}")
        if self.timeout_s is not None:
            check_number("timeout_s", self.timeout_s, minimum=0.0)

    @classmethod
    def queue(cls, max_size: int, *, timeout_s: float | None = 60.0) -> RateLimiter:
        """A bound on the backlog of a work queue of claims (Reverb's ``Queue``): writers
        wait while more than ``max_size`` rows are inserted and not yet claimed, nor
        discarded (rows of groups ready to claim and of groups still being written; rows a
        group condition refuses or that went stale are discarded, see
        :func:`expstore.limits.counters.discard`). Learners claim as soon as a row is
        there. It is ``RateLimiter(1, samples_per_insert=1.0, error_buffer=max_size - 1,
        block_writers=True)``: each row claimed once, the ratio of one sample per insert
        holds writers ``max_size`` rows ahead of the claims. A row claimed again (its
        claim released, or its lease ran out) counts as sampled again, which loosens the
        bound by the rows delivered twice. For ``sample`` with replacement, use a ratio."""
        size = check_int("max_size", max_size, minimum=2)
        return cls(1, 1.0, float(size - 1), block_writers=True, timeout_s=timeout_s)

    @property
    def ratio(self) -> float:
        return 1.0 if self.samples_per_insert is None else float(self.samples_per_insert)

    @property
    def buffer(self) -> float:
        """The error buffer in force (default: samples_per_insert * min_size)."""
        if self.samples_per_insert is None:
            return UNBOUNDED
        if self.error_buffer is not None:
            return float(self.error_buffer)
        return max(self.ratio * self.min_size, max(1.0, self.ratio))

    @property
    def min_diff(self) -> float:
        if self.samples_per_insert is None:
            return -UNBOUNDED
        return self.ratio * self.min_size - self.buffer

    @property
    def max_diff(self) -> float:
        if self.samples_per_insert is None:
            return UNBOUNDED
        return self.ratio * self.min_size + self.buffer

    def check_sample(self, n: int) -> None:
        """InvalidArgumentError if a sample of ``n`` rows could never go."""
        if self.block_writers and n > self.max_diff - self.min_diff:
            raise InvalidArgumentError(
                f"a sample of {n} rows can never go under this rate limit: writers are held "
                f"within {self.max_diff - self.min_diff:g} samples of budget "
                f"(2 * error_buffer). Sample fewer rows at a time, or set a larger "
                f"error_buffer (at least {math.ceil(n / 2)})"
            )

    def check_insert(self, n: int) -> None:
        """InvalidArgumentError if a write of ``n`` rows could never go."""
        if self.block_writers and n * self.ratio > self.max_diff - self.min_diff:
            # Enough for this write to go in steady state (within 2 * error_buffer) and as
            # the first write into an empty buffer past min_size (within max_diff).
            least = max(math.ceil(n * self.ratio / 2), math.ceil((n - self.min_size) * self.ratio))
            raise InvalidArgumentError(
                f"a write of {n} rows can never go under this rate limit: it adds "
                f"{n * self.ratio:g} samples of budget, more than the "
                f"{self.max_diff - self.min_diff:g} writers are held within. Write smaller "
                f"batches, or set a larger error_buffer (at least {least})"
            )

    def settings(self) -> dict[str, Any]:
        """The columns of ``expstore_rate_limits`` this limiter sets."""
        return {
            "min_size": self.min_size,
            "samples_per_insert": self.ratio,
            "min_diff": self.min_diff,
            "max_diff": self.max_diff,
            "block_writers": self.block_writers,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_settings(cls, row: Any) -> RateLimiter:
        """The limiter a row of ``expstore_rate_limits`` holds."""
        if row.min_diff <= -UNBOUNDED / 2:
            return cls(int(row.min_size), timeout_s=row.timeout_s)
        ratio, min_size, max_diff = float(row.samples_per_insert), int(row.min_size), row.max_diff
        return cls(
            min_size,
            ratio,
            _error_buffer(ratio, min_size, float(max_diff)),
            block_writers=bool(row.block_writers),
            timeout_s=row.timeout_s,
        )


def _error_buffer(ratio: float, min_size: int, max_diff: float) -> float:
    """The error buffer that gave ``max_diff = ratio * min_size + error_buffer``. The
    subtraction can leave it an ulp off what was given (0.9999999999999999 for 1.0, below
    its floor of max(1, ratio)): of the difference rounded to 12 significant digits and the
    difference itself, the first that gives ``max_diff`` back and is not below the floor;
    else the difference, raised to the floor when within rounding of it."""
    base = ratio * min_size
    raw = max_diff - base
    floor = max(1.0, ratio)
    for value in (float(f"{raw:.12g}"), raw):
        if value >= floor and base + value == max_diff:
            return value
    return floor if floor > raw >= floor * (1 - 1e-9) else raw


class RateLimitStats(NamedTuple):
    """A buffer's rate limit now: what was counted since it was set, whether a sample of
    one row or a write of one row could go, and when each side last moved (the database's
    clock, seconds since the epoch; None: not yet)."""

    limiter: RateLimiter
    #: Rows inserted (rows present when the limit was set count as inserted).
    inserted: int
    #: Rows drawn by samples and claims.
    sampled: int
    can_sample: bool
    can_insert: bool
    #: Of the inserted rows, those that can never be drawn: the limit counts
    #: ``inserted - discarded`` as inserted.
    discarded: int = 0
    last_sample_at: float | None = None
    last_insert_at: float | None = None
