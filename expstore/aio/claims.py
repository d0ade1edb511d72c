"""Claims, consumers and training steps for asyncio code: :class:`AsyncClaim`,
:class:`AsyncConsumer`, :class:`AsyncStep`, the async faces of
:class:`~expstore.claims.Claim`, :class:`~expstore.claims.Consumer` and
:class:`~expstore.claims.Step` (same arguments, results and guarantees; what touches the
database is a coroutine, run on the handle's thread)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from ..claims import DEFAULT_LEASE_S, Claim, Consumer, Step
from ..converters.base import Converter
from ..dedup import Dedup
from ..errors import ClaimFinishedError, FencedError
from ..model.rows import DataRow
from ..query import QueryCondition
from .calls import Calls

__all__ = ["AsyncClaim", "AsyncConsumer", "AsyncStep", "claim_on"]


async def claim_on(calls: Calls, claim: Callable[[], Claim]) -> AsyncClaim:
    """Run ``claim()`` on a thread of its own (any claim may wait: with ``wait_s=``, on a
    rate limit, on a prompt queue's admission); a claim that lands after its caller was
    cancelled is released at once."""
    made = await calls.run_then(True, _release_abandoned, claim)
    return AsyncClaim(calls, made)


def _release_abandoned(claim: Claim) -> None:
    if claim.state == "held" and len(claim):
        claim.release()


class AsyncClaim:
    """A :class:`~expstore.claims.Claim` whose ``ack``, ``release``, ``renew`` and
    ``save_progress`` (and the database reads ``progress()`` and ``needs()``) are
    coroutines. Its rows and facts are attributes as on the claim: ``batch``, ``ids``,
    ``keys``, ``claim_id``, ``consumer``, ``generation``, ``lease_until``, ``state``,
    ``produced``; ``claim.sync`` is the Claim itself. ``async with claim:`` releases it if
    the block raises before it was acked or released."""

    def __init__(self, calls: Calls, claim: Claim) -> None:
        self._calls = calls
        self.sync = claim

    batch = property(lambda self: self.sync.batch, doc="What the claim's converter built.")
    ids = property(lambda self: self.sync.ids, doc="The claimed rows' ids.")
    keys = property(lambda self: self.sync.keys, doc="The claimed rows' keys.")
    claim_id = property(lambda self: self.sync.claim_id, doc="The claim's id.")
    consumer = property(lambda self: self.sync.consumer, doc="Who claimed.")
    generation = property(
        lambda self: self.sync.generation, doc="The claiming incarnation's generation."
    )
    claimed_at = property(lambda self: self.sync.claimed_at, doc="When (database clock).")
    lease_until = property(lambda self: self.sync.lease_until, doc="When the lease ends.")
    state = property(lambda self: self.sync.state, doc="held, acked or released.")
    produced = property(lambda self: self.sync.produced, doc="What ack(produce=) stored.")
    unfinished = property(lambda self: self.sync.unfinished, doc="Prompts short after ack.")

    def __len__(self) -> int:
        return len(self.sync)

    async def ack(
        self,
        checkpoint: Any = ...,
        *,
        consumer: str | None = None,
        allow_evicted: bool = False,
        produce: Sequence[DataRow] | Mapping[str, Sequence[DataRow]] | None = None,
        into: Any = None,
        dedup: Dedup = None,
    ) -> int:
        """:meth:`Claim.ack <expstore.claims.Claim.ack>`; ``into`` may be an async or a sync
        buffer. Cancelled, the ack commits whole or not at all: ``await buffer.settle()``,
        then ``claim.state`` says which."""
        target = getattr(into, "sync", into)
        return await self._calls.run(
            self.sync.ack,
            checkpoint,
            consumer=consumer,
            allow_evicted=allow_evicted,
            produce=produce,
            into=target,
            dedup=dedup,
        )

    async def release(self, *, consumer: str | None = None) -> int:
        """:meth:`Claim.release <expstore.claims.Claim.release>`."""
        return await self._calls.run(self.sync.release, consumer=consumer)

    async def renew(self, lease_s: float | None = None) -> float:
        """:meth:`Claim.renew <expstore.claims.Claim.renew>`."""
        return await self._calls.run(self.sync.renew, lease_s)

    async def save_progress(self, state: Any, *, row_id: str | None = None) -> None:
        """:meth:`Claim.save_progress <expstore.claims.Claim.save_progress>`."""
        await self._calls.run(self.sync.save_progress, state, row_id=row_id)

    async def progress(self) -> dict[str, Any]:
        """The claim's :attr:`~expstore.claims.Claim.progress` (read once)."""
        return await self._calls.run(_progress, self.sync)

    async def needs(self) -> dict[str, int]:
        """The claim's :attr:`~expstore.claims.Claim.needs`, read now."""
        return await self._calls.run(_needs, self.sync)

    async def __aenter__(self) -> AsyncClaim:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and self.sync.state == "held":
            try:
                await self.release()
            except (FencedError, ClaimFinishedError):
                # A newer incarnation owns the name, or an ack cancelled while it ran
                # finished meanwhile: the block's own error (or cancellation) matters.
                pass

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"


def _progress(claim: Claim) -> dict[str, Any]:
    return claim.progress


def _needs(claim: Claim) -> dict[str, int]:
    return claim.needs


class AsyncConsumer:
    """A :class:`~expstore.claims.Consumer` incarnation (from
    ``await buffer.consumer(name)``) whose claims and checkpoint reads are coroutines and
    whose training steps commit with ``async with consumer.step() as step:``."""

    def __init__(self, calls: Calls, consumer: Consumer) -> None:
        self._calls = calls
        self.sync = consumer
        self.name = consumer.name
        self.generation = consumer.generation
        self.taken_back = consumer.taken_back

    async def claim(
        self,
        batch_size: int,
        query_condition: QueryCondition = None,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        order: Any = "oldest",
        converter: Converter[Any] | None = None,
        wait_s: float | None = None,
        max_staleness: int | None = None,
        min_batch_size: int | None = None,
    ) -> AsyncClaim:
        """:meth:`Consumer.claim <expstore.claims.Consumer.claim>`, awaited."""
        return await claim_on(
            self._calls,
            functools.partial(
                self.sync.claim,
                batch_size,
                query_condition,
                lease_s=lease_s,
                order=order,
                converter=converter,
                wait_s=wait_s,
                max_staleness=max_staleness,
                min_batch_size=min_batch_size,
            ),
        )

    async def checkpoint(self, default: Any = ...) -> Any:
        """:meth:`Consumer.checkpoint <expstore.claims.Consumer.checkpoint>`."""
        return await self._calls.run(self.sync.checkpoint, default)

    def step(self) -> AsyncStep:
        """A training step, committed in one transaction when ``async with`` ends."""
        return AsyncStep(self._calls, self.sync.step())

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"


class AsyncStep:
    """A :class:`~expstore.claims.Step`: ``ack``, ``checkpoint``, ``set_policy_version``
    and ``update_priorities`` collect (checked at once, no database call), ``await
    commit()`` (or the end of ``async with``) writes them in one transaction."""

    def __init__(self, calls: Calls, step: Step) -> None:
        self._calls = calls
        self.sync = step

    def ack(self, claim: AsyncClaim | Claim, *, allow_evicted: bool = False) -> None:
        """:meth:`Step.ack <expstore.claims.Step.ack>`."""
        self.sync.ack(
            claim.sync if isinstance(claim, AsyncClaim) else claim, allow_evicted=allow_evicted
        )

    def save_checkpoint(self, state: Any) -> None:
        """:meth:`Step.save_checkpoint <expstore.claims.Step.save_checkpoint>`."""
        self.sync.save_checkpoint(state)

    def set_policy_version(self, version: int, *, force: bool = False) -> None:
        """:meth:`Step.set_policy_version <expstore.claims.Step.set_policy_version>`."""
        self.sync.set_policy_version(version, force=force)

    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> None:
        """:meth:`Step.update_priorities <expstore.claims.Step.update_priorities>`."""
        self.sync.update_priorities(ids, priorities)

    async def commit(self) -> None:
        """Write the step in one transaction."""
        await self._calls.run(self.sync.commit)

    state = property(lambda self: self.sync.state, doc="open, committed or abandoned.")
    acked = property(lambda self: self.sync.acked, doc="Rows acked by the commit.")
    evicted = property(lambda self: self.sync.evicted, doc="Rows the version evicted.")
    updated = property(lambda self: self.sync.updated, doc="Rows given a priority.")
    checkpoint_seq = property(lambda self: self.sync.checkpoint_seq, doc="The checkpoint's seq.")

    async def __aenter__(self) -> AsyncStep:
        self.sync.__enter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.commit()
        elif self.sync.state == "open":
            self.sync.state = "abandoned"

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"
