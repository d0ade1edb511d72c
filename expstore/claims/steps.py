"""One transaction per training step: a learner's acks of one or more claims, its
checkpoint, the policy version it publishes (with the ``"stale"`` eviction that follows
it) and the priorities it sets, all committed together or not at all, with the learner's
generation checked in the same transaction (see :mod:`expstore.claims.generations`).

After a crash the learner reads its checkpoint and the buffer's policy version, which
always agree: either the whole step is there, or nothing of it. Each part is the code the
standalone call runs (``ClaimQueue.ack_in``, ``ClaimQueue.store_checkpoint``,
:func:`~expstore.policy_versions.set_version_in`,
:func:`~expstore.priorities.update_priorities_in`), here on the step's
connection.

Order inside the transaction, which is also the locking order: the buffer's row (only
when the step sets a version or priorities, which take it anyway; writers take it first
too), the consumer's row (the generation check), the checkpoint, the claims' entries, the
version and its eviction, the priorities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..db.handle import retried
from ..db.schema import buffers
from ..lifecycle.registry import buffer_row, lock_buffer
from ..policy_versions import set_version_in
from ..priorities import Update, update_priorities_in
from .generations import hold_generation
from .queue import Claimed, ClaimQueue

__all__ = ["StepDone", "StepParts", "commit_step"]

#: Called with the name of each part of a step once it has run inside the step's
#: transaction ("fenced", "checkpoint", "ack 0", "ack 1", ..., "policy version",
#: "priorities"), and with "committed" once the transaction has committed: a hook for
#: tests that stop the process between two parts (see tests/claims/).
after_part: Callable[[str], None] | None = None


class StepParts(NamedTuple):
    """What one training step writes, each part checked already: the claims to ack, the
    checkpoint (JSON text, None: none), the policy version (None: unchanged) and whether
    it may go backwards, and the priorities to set by id (the last given for an id wins)."""

    claims: tuple[Claimed, ...] = ()
    #: Per claim: whether its ack may leave out rows evicted meanwhile (RowsEvictedError).
    allow_evicted: tuple[bool, ...] = ()
    checkpoint: str | None = None
    version: int | None = None
    force: bool = False
    ids: tuple[str, ...] = ()
    priorities: np.ndarray | None = None


class StepDone(NamedTuple):
    """What a committed step did: rows acked, the checkpoint's number (None: no
    checkpoint), rows the version's ``"stale"`` eviction deleted, and the priority update
    (None: no row of its ids stored)."""

    acked: int
    checkpoint_seq: int | None
    evicted: int
    priorities: Update | None


def _reached(part: str) -> None:
    if after_part is not None:
        after_part(part)


def commit_step(queue: ClaimQueue, consumer: str, generation: int, parts: StepParts) -> StepDone:
    """Write ``parts`` for ``consumer``'s incarnation ``generation`` in one transaction:
    FencedError (nothing written) unless it is the consumer's current generation, and any other
    part's error (a claim whose lease ran out and was claimed again, a version going
    backwards) rolls back every part."""
    handle = queue.handle
    now = handle.dialect.now()

    def write() -> StepDone:
        with handle.errors("commit a training step"), handle.write() as conn:
            # Still the handle's buffer; its row locked first, as writers take it, when a
            # part may change rows: a version (stale eviction), priorities, or acks of a
            # buffer whose eviction is "stale" (the ack evicts what it kept for the claim).
            (policy,) = buffer_row(handle, conn, buffers.c.eviction)
            if parts.version is not None or parts.ids or (parts.claims and policy == "stale"):
                lock_buffer(handle, conn, buffers.c.id)
            hold_generation(handle, conn, consumer, generation, "training step")
            _reached("fenced")
            seq = None
            if parts.checkpoint is not None:
                seq = queue.store_checkpoint(conn, consumer, parts.checkpoint, now)
                _reached("checkpoint")
            acked = 0
            for i, claim in enumerate(parts.claims):
                allowed = i < len(parts.allow_evicted) and parts.allow_evicted[i]
                retention = queue.retention(claim, allow_evicted=allowed)
                retention.hold_buffer(conn)  # locked above already if it may evict
                acked += queue.ack_in(conn, claim, now, seq, retention)[0]
                _reached(f"ack {i}")
            evicted = 0
            if parts.version is not None:
                evicted = set_version_in(handle, conn, parts.version, force=parts.force)
                _reached("policy version")
            updated = None
            if parts.ids and parts.priorities is not None:
                updated = update_priorities_in(handle, conn, parts.ids, parts.priorities)
                _reached("priorities")
        _reached("committed")
        return StepDone(acked, seq, evicted, updated)

    # A deadlock with a claim or a writer (Postgres) rolls it back: again, whole.
    return retried(write)
