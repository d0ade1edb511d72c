"""Claims: a consume-once queue over a buffer's rows, whole in one package.

- :mod:`~expstore.claims.api`: what users hold (:class:`Claim`, :class:`Consumer`,
  :class:`Step`) and what the buffer forwards to (``claim_rows``, prompt queues'
  ``store_prompts``, ``set_admission``);
- :mod:`~expstore.claims.steps`: a learner's training step in one transaction;
  :mod:`~expstore.claims.group_claims`: claiming whole groups (a claim order);
- :mod:`~expstore.claims.queue`: claims, renewals, releases and acks in SQL;
- below it, what the queue composes: :mod:`~expstore.claims.generations` (consumers'
  incarnations, fencing), :mod:`~expstore.claims.prompts` (targets, progress, admission),
  :mod:`~expstore.claims.ready_groups` (the ready-group index group claims read),
  :mod:`~expstore.claims.reports` (lineage, queue stats) and
  :mod:`~expstore.claims.lease_retention` (retention that respects leases).

The storage does not know the claims: the queue and the ready-group index are kept per
buffer handle (:meth:`~expstore.db.handle.BufferHandle.part`), made on first use.
"""

from __future__ import annotations

from .api import (
    DEFAULT_LEASE_S,
    MAX_PROGRESS_BYTES,
    Admission,
    Claim,
    Consumer,
    Step,
    admission_now,
    admission_setting,
    claim_rows,
    count_ready_groups,
    set_admission,
    store_prompts,
    wait_for_rows,
    wait_until,
)

__all__ = [
    "DEFAULT_LEASE_S",
    "MAX_PROGRESS_BYTES",
    "Admission",
    "Claim",
    "Consumer",
    "Step",
    "admission_now",
    "admission_setting",
    "claim_rows",
    "count_ready_groups",
    "set_admission",
    "store_prompts",
    "wait_for_rows",
    "wait_until",
]
