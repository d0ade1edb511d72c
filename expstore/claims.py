"""Claims, checkpoints and waiting: a buffer as a consume-once work queue for learners.

::

    claim = buffer.claim(256, consumer="learner-0", lease_s=120)   # rows nobody else gets
    loss = train_on(claim.batch)
    claim.ack(checkpoint={"step": step})   # consumed, and the cursor stored, in one commit

    state = buffer.checkpoint("learner-0", default={"step": 0})    # after a restart

A claim holds its rows for ``lease_s`` seconds (by the database's clock); ``ack`` marks them
consumed, ``release`` gives them back, and rows of a claim whose lease ran out (its learner
died) are claimed again by whoever asks next: at-least-once delivery, exactly-once by the
acked record. An ack after the lease ran out still succeeds if nobody claimed the rows
meanwhile; otherwise it raises :class:`~expstore.errors.LeaseExpiredError` and changes
nothing. The storage side is :mod:`expstore.features.claims.queue`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from ._args import (
    MAX_BATCH,
    check_consumer,
    check_flag,
    check_int,
    check_lease,
    check_seconds,
    check_staleness,
)
from ._retry import CLAIM_POLL
from .converters.base import Converter, as_converter
from .converters.default import DefaultConverter
from .errors import (
    ClaimFinishedError,
    ClaimOwnerError,
    EmptyBufferError,
    InvalidArgumentError,
    UnsupportedTypeError,
    WaitTimeoutError,
)
from .features.claims.queue import Claimed, ClaimQueue, Scope
from .query import QueryCondition
from .samplers.base import KeySampler, SampleInfo
from .samplers.group import GroupSampler
from .samplers.uniform import UniformSampler
from .storage.base import Storage
from .storage.sql import SqlStorage

__all__ = ["Claim", "claim_rows", "wait_for_rows", "wait_until"]

#: The default lease: long enough for a training step, short enough that a dead learner's
#: rows come back within minutes.
DEFAULT_LEASE_S = 300.0


class Claim:
    """Rows claimed by one consumer: ``batch`` (what the converter built; a list of
    DataRows by default), their ``ids`` and ``keys``, ``claim_id``, ``consumer`` and when the
    lease ends (``lease_until``, database clock). Finish it with :meth:`ack` or
    :meth:`release`; used as a context manager it is released if the block raises before
    either."""

    def __init__(self, queue: ClaimQueue, claimed: Claimed, ids: list[str], batch: Any) -> None:
        self._queue = queue
        self._claimed = claimed
        self.ids = ids
        self.batch = batch
        self.state = "held"

    @property
    def claim_id(self) -> str:
        return self._claimed.claim_id

    @property
    def consumer(self) -> str:
        return self._claimed.consumer

    @property
    def keys(self) -> np.ndarray:
        return self._claimed.keys

    @property
    def claimed_at(self) -> float:
        return self._claimed.claimed_at

    @property
    def lease_until(self) -> float:
        return self._claimed.lease_until

    def __len__(self) -> int:
        return len(self.ids)

    def _check_held(self, action: str) -> None:
        if self.state != "held":
            raise ClaimFinishedError(
                f"claim {self.claim_id} was already {self.state}; it cannot be {action}. "
                "Nothing was changed"
            )

    def ack(
        self, checkpoint: Any = ..., *, consumer: str | None = None, allow_evicted: bool = False
    ) -> int:
        """Mark the rows consumed; with ``checkpoint`` (any JSON value: step, epoch, data
        cursor) store it as this consumer's checkpoint in the same transaction. Returns how
        many rows were acked.

        If rows of the claim left the buffer before the ack (capacity eviction, which
        takes leased rows too, or ``delete()``), the ack raises RowsEvictedError saying
        how many and why, and changes nothing (the checkpoint is not stored; the claim is
        still held). ``allow_evicted=True`` acks the rows left and stores the checkpoint
        anyway, returning how many were acked. With eviction ``"stale"``, rows the policy
        kept for this claim are evicted by the ack, in its transaction."""
        self._check_held("acked")
        claimed = self._as(consumer)
        with_checkpoint = checkpoint is not ...
        done = self._queue.ack(
            claimed,
            None if not with_checkpoint else checkpoint,
            with_checkpoint=with_checkpoint,
            allow_evicted=check_flag("allow_evicted", allow_evicted),
        )
        self.state = "acked"
        return done

    def release(self, *, consumer: str | None = None) -> int:
        """Give the rows back to the queue now; returns how many."""
        self._check_held("released")
        done = self._queue.release(self._as(consumer))
        self.state = "released"
        return done

    def renew(self, lease_s: float | None = None) -> float:
        """Extend the lease to ``lease_s`` (default: the claim's own) from now; returns when
        it ends. For work that takes longer than a lease: renew before it runs out."""
        self._check_held("renewed")
        c = self._claimed
        lease = check_lease(c.lease_until - c.claimed_at if lease_s is None else lease_s)
        until = self._queue.renew(c, lease)
        self._claimed = c._replace(lease_until=until)
        return until

    def _as(self, consumer: str | None) -> Claimed:
        if consumer is None:
            return self._claimed
        consumer = check_consumer(consumer)
        if consumer != self._claimed.consumer:  # even a claim of no rows: checked here
            raise ClaimOwnerError(
                f"claim {self.claim_id} belongs to consumer {self._claimed.consumer!r}, not "
                f"{consumer!r}; finish it as that consumer. Nothing was changed"
            )
        return self._claimed

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and self.state == "held":
            self.release()

    def __repr__(self) -> str:
        return (
            f"Claim({self.claim_id}, consumer={self.consumer!r}, rows={len(self)}, "
            f"state={self.state!r})"
        )


def _candidates(
    storage: Storage, order: Any, query_condition: QueryCondition
) -> Callable[[int], np.ndarray] | None:
    if order == "fifo":
        return None
    if order == "random":
        order = UniformSampler()
    if not isinstance(order, KeySampler):
        raise UnsupportedTypeError(
            'order must be "fifo", "random" or a sampler that chooses keys (UniformSampler, '
            f"PrioritizedSampler, ...), got {order!r}"
        )
    sampler = order

    def draw(m: int) -> np.ndarray:
        for _ in range(2):  # again if the choice found the database made anew
            try:
                keys = sampler.choose(storage, m, query_condition).keys
            except EmptyBufferError:
                keys = np.empty(0, dtype=np.int64)
            if not sampler.on_buffer(storage):
                break
        return keys

    return draw


def claim_rows(
    sql: SqlStorage,
    n: int,
    query_condition: QueryCondition = None,
    *,
    consumer: str,
    lease_s: float = DEFAULT_LEASE_S,
    order: Any = "fifo",
    converter: Converter[Any] | None = None,
    wait: float | None = None,
    max_staleness: int | None = None,
) -> Claim:
    """See :meth:`expstore.ReplayBuffer.claim`."""
    n = check_int("n", n, minimum=1, maximum=MAX_BATCH)
    consumer = check_consumer(consumer)
    lease = check_lease(lease_s)
    wait_s = check_seconds("wait", wait, optional=True)
    scope = Scope(query_condition, check_staleness(max_staleness))
    queue = sql.claims
    builder = as_converter(DefaultConverter() if converter is None else converter)
    if isinstance(order, KeySampler):
        order.on_buffer(sql)
    if isinstance(order, GroupSampler):
        if n % order.group_size:
            raise InvalidArgumentError(
                f"a claim of whole groups of {order.group_size} rows takes n that is a "
                f"multiple of {order.group_size}; got n={n}"
            )
        candidates, groups = None, order.claim_taker(sql, query_condition, scope.max_staleness)
    else:
        candidates, groups = _candidates(sql, order, query_condition), None
    if isinstance(order, GroupSampler):  # whole groups, not rows, must be claimable
        size = order.group_size

        def claimable(upto: int) -> int:
            groups_now = order.claimable_groups(
                sql, query_condition, scope.max_staleness, -(-upto // size)
            )
            return groups_now * size

        what = f"whole group of {size} rows"
    else:

        def claimable(upto: int) -> int:
            return queue.count(scope, upto, claimable=True)

        what = "row"
    if wait_s is not None:
        try:
            wait_until(lambda: claimable(n) >= n, wait_s)
        except WaitTimeoutError:
            if not claimable(1):
                raise WaitTimeoutError(
                    f"no {what} became claimable within {wait_s} s; check that actors are "
                    "writing (and match the condition), or wait longer"
                ) from None
    want = n
    if sql.sampling_limited():
        # Counted against the rate limit before the claim, so only as many rows as are
        # claimable now: a learner polling an empty queue must not count samples that a
        # writer held by block_writers could pass against.
        want = min(n, claimable(n))
    counted = sql.acquire_samples(want)[0] if want else 0
    try:
        claimed = queue.claim(want, scope, consumer, lease, candidates, groups)
    except BaseException:
        sql.refund_samples(counted)
        raise
    if counted:
        sql.refund_samples(counted - len(claimed.keys))
    fetched = sql.fetch(claimed.keys, builder.paths, writable=not builder.copies_arrays)
    info = SampleInfo(claimed.keys, list(fetched.ids))
    batch = builder.attach_info(builder.build(fetched), info)
    return Claim(queue, claimed, list(fetched.ids), batch)


def wait_until(ready: Callable[[], bool], timeout: float | None) -> None:
    """Call ``ready`` with the growing pauses of :data:`~expstore._retry.CLAIM_POLL` until
    it is true; WaitTimeoutError after ``timeout`` seconds (None: no limit)."""
    waiting = CLAIM_POLL.start(timeout)
    while not ready():
        if not waiting.sleep():
            raise WaitTimeoutError(f"not ready after {timeout} s")


def wait_for_rows(
    sql: SqlStorage,
    min_rows: int,
    query_condition: QueryCondition,
    *,
    timeout: float | None,
    claimable: bool,
    max_staleness: int | None = None,
) -> int:
    """See :meth:`expstore.ReplayBuffer.wait_for`."""
    min_rows = check_int("min_rows", min_rows, minimum=1)
    limit = check_seconds("timeout", timeout, optional=True)
    scope = Scope(query_condition, check_staleness(max_staleness))
    seen = [0]

    def ready() -> bool:
        seen[0] = sql.claims.count(scope, min_rows, claimable=claimable)
        return seen[0] >= min_rows

    try:
        wait_until(ready, limit)
    except WaitTimeoutError:
        kind = "claimable rows" if claimable else "rows"
        raise WaitTimeoutError(
            f"waited {limit} s for {min_rows} matching {kind}, found {seen[0]}; check that "
            "actors are writing rows that match the condition, or wait longer"
        ) from None
    return seen[0]
