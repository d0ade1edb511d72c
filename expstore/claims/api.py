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
nothing. The storage side is :mod:`expstore.claims.queue`.

A learner that may be restarted while its old process still runs (a preempted pod, a
long GC pause) opens its consumer instead, which fences every older incarnation out, and
commits each training step in one transaction::

    learner = buffer.consumer("learner-0", takeover=True)   # a new generation; old leases freed
    state = learner.checkpoint(default={"step": 0})
    while training:
        claim = learner.claim(256, lease_s=120, wait_s=30)
        loss, td = train_on(claim.batch)
        with learner.step() as step:                          # all or nothing, one commit
            step.ack(claim)
            step.save_checkpoint({"step": state["step"] + 1})
            step.set_policy_version(version)
            step.update_priorities(claim.ids, td)

See :class:`Consumer` and :class:`Step`; the generations are
:mod:`expstore.claims.generations`, the step's transaction
:mod:`expstore.claims.steps`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from .._args import (
    MAX_BATCH,
    check_checkpoint,
    check_consumer,
    check_flag,
    check_int,
    check_lease,
    check_priorities,
    check_seconds,
    check_staleness,
)
from .._retry import CLAIM_POLL, RATE_LIMIT_WAIT, Waiting
from ..converters.base import Converter, as_converter
from ..converters.default import DefaultConverter
from ..db.engine import is_memory
from ..db.pipeline import Batched
from ..db.schema import buffers
from ..db.schema import rows as rows_table
from ..dedup import Dedup, check_dedup
from ..errors import (
    AdmissionTimeoutError,
    ClaimFinishedError,
    ClaimOwnerError,
    FencedError,
    InvalidArgumentError,
    StorageError,
    UnknownConsumerError,
    UnsupportedTypeError,
    WaitTimeoutError,
)
from ..lifecycle.hooks import BufferState
from ..limits.counters import WriteBlocked
from ..model.rows import DataRow
from ..policy_versions import check_version
from ..query import QueryCondition
from ..samplers.group import GroupSampler
from ..samplers.loop import SampleInfo
from ..storage.reader import ROW_COLUMNS
from ..storage.sql import SqlStorage
from ..storage.writer import (
    StoreReport,
    as_source,
    duplicate_of,
    prepare,
    store_rows,
    write_in,
)
from .group_claims import claim_counts
from .orders import claim_order
from .prompts import (
    MAX_TARGET,
    AdmissionBlocked,
    AdmissionSettings,
    AdmissionState,
    admission_settings,
    admission_state,
    clear_admission,
    describe,
    largest_key,
    needs_of,
    record_produced,
    set_targets,
    store_admission,
)
from .queue import Claimed, ClaimQueue, RateLimitFound, Scope, ShortClaim, queue_of
from .ready_groups import GroupTally
from .steps import StepParts, commit_step

__all__ = [
    "Admission",
    "Claim",
    "Consumer",
    "Step",
    "claim_rows",
    "count_ready_groups",
    "wait_for_rows",
    "wait_until",
]

#: The most JSON a claim's saved progress may hold (a partial rollout, not its arrays).
MAX_PROGRESS_BYTES = 16 * 1024 * 1024

#: The default lease: long enough for a training step, short enough that a dead learner's
#: rows come back within minutes.
DEFAULT_LEASE_S = 300.0


class Claim:
    """Rows claimed by one consumer: ``batch`` (what the converter built; a list of
    DataRows by default), their ``ids`` and ``keys``, ``claim_id``, ``consumer`` and when the
    lease ends (``lease_until``, database clock), and the ``generation`` of the consumer's
    incarnation that made it (0: a plain ``buffer.claim``). Finish it with :meth:`ack` or
    :meth:`release`; used as a context manager it is released if the block raises before
    either (unless a newer incarnation has fenced this one out: then it is left as it
    is). Each finishing call raises FencedError, changing nothing, once a newer
    incarnation of its consumer has opened (see :class:`Consumer`)."""

    def __init__(
        self,
        queue: ClaimQueue,
        claimed: Claimed,
        ids: list[str],
        batch: Any,
        refund: Callable[[int], None] | None = None,
        storage: SqlStorage | None = None,
    ) -> None:
        self._queue = queue
        self._storage = storage
        self._claimed = claimed
        # Gives the rows' samples back to the rate limit they were counted under (None:
        # not counted), when they go back to the queue unconsumed.
        self._refund = refund
        self._produced: StoreReport | None = None
        self._progress: dict[str, Any] | None = None
        self._ids: dict[int, str] | None = None
        #: After an ack: the prompts it released still short of their completion target.
        self.unfinished: list[str] = []
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
    def generation(self) -> int:
        """The generation of the consumer's incarnation that made the claim (0: a plain
        ``buffer.claim``; see :class:`Consumer`)."""
        return self._claimed.generation

    @property
    def claimed_at(self) -> float:
        return self._claimed.claimed_at

    @property
    def lease_until(self) -> float:
        return self._claimed.lease_until

    def __len__(self) -> int:
        return len(self.ids)

    def _id_of(self) -> dict[int, str]:
        """The claim's rows' ids by key (rows gone before they were fetched, evicted or
        deleted, have none; their ids are looked up then, once)."""
        if self._ids is None:
            keys = [int(k) for k in self.keys.tolist()]
            if len(keys) == len(self.ids):
                self._ids = dict(zip(keys, self.ids, strict=True))
            else:
                self._ids = self._queue.ids_of(keys)
        return self._ids

    def _check_held(self, action: str) -> None:
        if self.state != "held":
            raise ClaimFinishedError(
                f"claim {self.claim_id} was already {self.state}; it cannot be {action}. "
                "Nothing was changed"
            )

    def ack(
        self,
        checkpoint: Any = ...,
        *,
        consumer: str | None = None,
        allow_evicted: bool = False,
        produce: Sequence[DataRow] | Mapping[str, Sequence[DataRow]] | None = None,
        into: Any = None,
        dedup: Dedup = None,
    ) -> int:
        """Mark the rows consumed; with ``checkpoint`` (any JSON value: step, epoch, data
        cursor) store it as this consumer's checkpoint in the same transaction. Returns how
        many rows were acked.

        If rows of the claim left the buffer before the ack (capacity eviction, which
        takes leased rows too, or ``delete()``), the ack raises RowsEvictedError saying
        how many and why, and changes nothing (the checkpoint is not stored; the claim is
        still held). ``allow_evicted=True`` acks the rows left and stores the checkpoint
        anyway, returning how many were acked. With eviction ``"stale"``, rows the policy
        kept for this claim are evicted by the ack, in its transaction.

        ``produce=rows, into=other_buffer`` (a buffer of the same database): consume,
        transform, produce in one transaction, as Kafka's transactional read-process-write.
        The rows are stored into ``other_buffer`` (with its retention, rate limit and
        ``dedup``) in the ack's own transaction: if anything fails (the lease was taken
        over, a duplicate id, the process killed before the commit) nothing of it is stored
        and the claim is not acked, so whoever claims the rows next makes them again; once
        committed the rows are stored once and the claim is done. An ack retried after its
        commit (a network error on the way back) finds the claim acked and raises
        ClaimFinishedError: nothing is stored twice. :attr:`produced` says what was stored
        (a StoreReport); lineage links each produced row to this claim, its consumer and
        its prompt row.

        Prompts with a completion target (``store_prompts(rows, group_size=G)``): the
        completions stored count towards it (``produce={row_id: rows}`` says which prompt
        each is for; a list will do for a claim of one row). A prompt that reached its
        target is consumed; one still short is released in the same transaction, claimable
        again for what it still needs (:attr:`unfinished` names them). More completions
        than a prompt needs (:attr:`needs`) raise InvalidArgumentError and change nothing.
        An ack without ``produce`` gives its prompts up: consumed as they are."""
        self._check_held("acked")
        claimed = self._as(consumer)
        with_checkpoint = checkpoint is not ...
        allowed = check_flag("allow_evicted", allow_evicted)
        target = None if produce is None and into is None else self._target(produce, into)
        plan = None if produce is None else self._plan(produce)
        dedup = check_dedup(dedup)
        prompt_ids = self._id_of() if plan is not None else {}

        def write(
            conn: Connection, tx: Batched | None, state: BufferState | None = None
        ) -> tuple[Mapping[int, int] | None, StoreReport]:
            assert target is not None and plan is not None
            rows, made, by_prompt = plan
            here = self._queue.handle
            if made is None and needs_of(here, conn, self.keys.tolist()):
                raise InvalidArgumentError(
                    f"claim {self.claim_id} holds {len(self)} prompts with completion "
                    "targets: say which prompt each completion is for with "
                    "produce={row_id: [rows]}. Nothing was stored or acked"
                )
            if not rows:  # every generation failed: nothing to store, the prompts short
                return made, StoreReport(0, 0, 0, 0, 0)
            # Without a dedup every row is stored or the ack fails on its id: every row
            # of these ids is this write's. With one, the rows above the largest key now.
            above = 0 if dedup is None else largest_key(target.handle, conn)
            report = write_in(target.handle, conn, as_source(rows), dedup, state, tail=tx)[2]
            stored = record_produced(
                target.handle,
                conn,
                by_prompt,
                prompt_ids,
                here.buffer_id,
                self.claim_id,
                self.consumer,
                above,
                tx,
            )
            if stored is None:  # sent with the commit: every row stored, or the ack fails
                return made, report
            # What the write stored counts (a dedup may have left some out).
            return None if made is None else {k: stored.get(k, 0) for k in made}, report

        waiting = RATE_LIMIT_WAIT.start()
        while True:
            try:
                done = self._queue.ack(
                    claimed,
                    None if not with_checkpoint else checkpoint,
                    with_checkpoint=with_checkpoint,
                    allow_evicted=allowed,
                    produce=None if target is None else write,
                    # known before the write where every row is stored or none
                    made=None if plan is None or dedup is not None else plan[1],
                    # the target's state, read with the ack's first statements
                    produce_state=None if target is None else target.handle,
                )
                break
            except WriteBlocked as blocked:  # rolled back: wait for the learners, then again
                assert target is not None
                target.rate_limits.wait_to_write(blocked, waiting)
            except StorageError as exc:  # a produced row's id stored already?
                if target is None or plan is None or not isinstance(exc.__cause__, IntegrityError):
                    raise
                duplicate = duplicate_of(target.handle, as_source(plan[0]))
                if duplicate is None:
                    raise
                raise duplicate from exc
        self.state = "acked"
        ids = self._id_of()
        self.unfinished = [ids.get(k, str(k)) for k in done.short]
        if done.short and self._refund is not None:
            self._refund(len(done.short))  # back in the queue unconsumed
        if target is not None and done.produced is not None:
            self._produced = done.produced
            there = target.handle
            there.dialect.wrote(there.connections.engine, there.buffer_id, done.produced.stored)
        return done.acked

    def _plan(
        self, produce: Sequence[DataRow] | Mapping[str, Sequence[DataRow]]
    ) -> tuple[list[DataRow], dict[int, int] | None, list[tuple[int | None, list[str]]]]:
        """What ``ack(produce=...)`` stores: the rows, how many are for each prompt key
        (None: the claim holds several rows and a list does not say), and the produced
        ids per prompt key, for lineage; checked before anything is written."""
        keys = {i: k for k, i in self._id_of().items()}
        if isinstance(produce, Mapping):
            strange = [i for i in produce if i not in keys]
            if strange:
                raise InvalidArgumentError(
                    f"produce= names row {strange[0]!r}, which is not one of claim "
                    f"{self.claim_id}'s rows ({len(self)}); key the completions by the "
                    "claim's ids (claim.ids). Nothing was stored or acked"
                )
            parts = {keys[i]: prepare(rows) if len(rows) else [] for i, rows in produce.items()}
            flat = [row for rows in parts.values() for row in rows]
            every = prepare(flat) if flat else []
            made = {k: len(rows) for k, rows in parts.items()}
            by_prompt: list[tuple[int | None, list[str]]] = [
                (k, [row.id for row in rows]) for k, rows in parts.items()
            ]
            return every, made, by_prompt
        every = prepare(produce)
        ids = [row.id for row in every]
        if len(self) == 1:
            key = int(self.keys[0])
            return every, {key: len(every)}, [(key, ids)]
        return every, None, [(None, ids)]

    def _target(self, produce: object, into: Any) -> SqlStorage:
        """The storage ``ack(produce=, into=)`` writes into, checked before any write."""
        if produce is None or into is None:
            raise InvalidArgumentError(
                "ack(produce=rows, into=buffer) takes both: the rows the claim's work made "
                "and the buffer to store them in. Nothing was changed"
            )
        target = getattr(into, "sql", None)
        if not isinstance(target, SqlStorage):
            raise UnsupportedTypeError(
                f"into= takes a ReplayBuffer, got {type(into).__name__}. Nothing was changed"
            )
        here = self._storage
        assert here is not None  # claims are made by claim_rows, which gives it
        if here.identity[0] != target.identity[0] or (
            is_memory(here.url)
            and here.handle.connections.engine is not target.handle.connections.engine
        ):
            raise InvalidArgumentError(
                f"into= must be a buffer of this claim's database ({here.handle.shown_url()}), "
                f"got one of {target.handle.shown_url()}: one transaction cannot span two "
                "databases. Nothing was changed"
            )
        return target

    @property
    def progress(self) -> dict[str, Any]:
        """The progress saved on the claim's rows (by this claim, or by an earlier claim of
        them whose actor died or whose lease ran out), by row id: what
        :meth:`save_progress` stored, to continue from instead of starting over. Read once,
        when first asked for."""
        if self._progress is None:
            keys = self.keys.tolist()
            saved = self._queue.progress_of(keys)
            ids = self._id_of()
            self._progress = {ids[k]: state for k, state in saved.items()}
        return self._progress

    def save_progress(self, state: Any, *, row_id: str | None = None) -> None:
        """Save ``state`` (any JSON value: the tokens or messages generated so far, the
        policy version of each segment) as the progress of the claim's row ``row_id``
        (optional for a claim of one row), in one statement, while the claim holds it.
        Whoever claims the row next (this actor after a restart, or another once the lease
        ran out) finds it in :attr:`progress`; the ack removes it. LeaseExpiredError,
        saving nothing, if the claim no longer holds the row; at most
        ``MAX_PROGRESS_BYTES`` of JSON."""
        self._check_held("given progress")
        text = check_checkpoint(state, "progress", "saved")
        if len(text.encode()) > MAX_PROGRESS_BYTES:
            raise InvalidArgumentError(
                f"progress of {len(text.encode()):,} bytes of JSON is more than "
                f"{MAX_PROGRESS_BYTES:,}; store large outputs as rows (ack(produce=...)) or "
                "keep less. Nothing was saved"
            )
        if row_id is None:
            if len(self.ids) != 1:
                raise InvalidArgumentError(
                    f"claim {self.claim_id} holds {len(self.ids)} rows: name the row with "
                    "save_progress(state, row_id=...). Nothing was saved"
                )
            row_id = self.ids[0]
        keys = [k for k, i in self._id_of().items() if i == row_id]
        if not keys:
            raise InvalidArgumentError(
                f"row {row_id!r} is not one of claim {self.claim_id}'s rows. Nothing was saved"
            )
        self._queue.save_progress(self._claimed, keys, text)
        if self._progress is not None:
            self._progress[row_id] = json.loads(text)

    @property
    def needs(self) -> dict[str, int]:
        """How many completions each of the claim's prompts with a completion target still
        needs, by row id (rows without a target are left out), read from the database when
        asked: make that many and ack them with ``produce={row_id: rows}``."""
        found = self._queue.needs(self.keys.tolist())
        return {i: found[k] for k, i in self._id_of().items() if k in found}

    @property
    def produced(self) -> StoreReport | None:
        """What ``ack(produce=, into=)`` stored (None before such an ack)."""
        return self._produced

    def release(self, *, consumer: str | None = None) -> int:
        """Give the rows back to the queue now; returns how many. Under a rate limit their
        samples are given back too (they are counted again when claimed again)."""
        self._check_held("released")
        done = self._queue.release(self._as(consumer))
        self.state = "released"
        if self._refund is not None and done:
            self._refund(done)
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
            try:
                self.release()
            except FencedError:
                pass  # a newer incarnation owns the name: the block's own error matters

    def __repr__(self) -> str:
        return (
            f"Claim({self.claim_id}, consumer={self.consumer!r}, rows={len(self)}, "
            f"state={self.state!r})"
        )


class Consumer:
    """One incarnation of a named consumer (a learner), opened by
    :meth:`expstore.ReplayBuffer.consumer`: it holds the ``generation`` that opening took, and
    every claim, ack, release, renewal and checkpoint it makes carries it.

    Fencing, as ZooKeeper's fencing tokens and Kafka's producer epochs: opening the same
    name again (a restarted learner) takes a higher generation, and from the moment that
    commits nothing an older incarnation sends changes anything; its claims, acks,
    releases, renewals and steps raise :class:`~expstore.errors.FencedError`. The check
    runs inside the transaction of the write it guards, holding the consumer's row, so a
    new generation is either before a write (which is refused) or after it, never in between.

    ``name``, ``generation``; ``taken_back``: rows of the predecessors' claims that opening
    with ``takeover=True`` released (0 without)."""

    def __init__(self, sql: SqlStorage, name: str, generation: int, taken_back: int = 0) -> None:
        self._sql = sql
        self.name = name
        #: This incarnation's fencing token (Kafka's consumer-group generation): each
        #: opening of the name takes the next one.
        self.generation = generation
        self.taken_back = taken_back

    def claim(
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
    ) -> Claim:
        """:meth:`expstore.ReplayBuffer.claim` as this incarnation (the same arguments but
        ``consumer``); FencedError, claiming nothing, once a newer one has opened."""
        return claim_rows(
            self._sql,
            batch_size,
            query_condition,
            consumer=self.name,
            lease_s=lease_s,
            order=order,
            converter=converter,
            wait_s=wait_s,
            max_staleness=max_staleness,
            min_batch_size=min_batch_size,
            generation=self.generation,
        )

    def checkpoint(self, default: Any = ...) -> Any:
        """The checkpoint this consumer (any of its incarnations) last stored; ``default``
        if it has none (without ``default``: UnknownConsumerError)."""
        try:
            return queue_of(self._sql.handle).checkpoint(self.name)[1]
        except UnknownConsumerError:
            if default is ...:
                raise
            return default

    def step(self) -> Step:
        """A training step's writes, committed in one transaction when the ``with`` block
        ends (see :class:`Step`)::

            with learner.step() as step:
                step.ack(claim)
                step.save_checkpoint({"step": n})
                step.set_policy_version(version)
        """
        return Step(self)

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, generation={self.generation})"


class Step:
    """The writes of one training step, committed all together or not at all.

    Inside ``with consumer.step() as step:`` collect :meth:`ack` (one or more claims),
    :meth:`checkpoint`, :meth:`set_policy_version` and :meth:`update_priorities`; each is
    checked when given (a bad argument raises there, adding nothing). When the block ends
    they run in ONE database transaction, with the consumer's generation checked in it: the
    acks, the checkpoint (stored with the acked rows, as ``claim.ack(checkpoint=...)``
    does), the policy version with the ``"stale"`` eviction it brings (as
    :meth:`~expstore.ReplayBuffer.set_policy_version`), and the priorities (as
    :meth:`~expstore.ReplayBuffer.update_priorities`). If any part fails (FencedError,
    LeaseExpiredError, PolicyVersionError...) nothing of the step is written. If the block
    raises, nothing is written and the claims stay held (release them, or let their lease
    run out). A learner killed at any moment finds either the whole step in the database
    or nothing of it: its checkpoint and the buffer's policy version always agree.

    After the block: ``state`` (``"committed"``), ``acked`` (rows acked), ``evicted``
    (rows the version's eviction deleted), ``updated`` (rows whose priority was set),
    ``checkpoint_seq`` (None without a checkpoint). Without ``with``, call
    :meth:`commit`."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._claims: list[Claim] = []
        self._allow_evicted: list[bool] = []
        self._checkpoint: str | None = None
        self._version: int | None = None
        self._force = False
        self._ids: list[str] = []
        self._priorities: list[np.ndarray] = []
        self.state = "open"
        self.acked = 0
        self.evicted = 0
        self.updated = 0
        self.checkpoint_seq: int | None = None

    def _check_open(self) -> None:
        if self.state != "open":
            raise ClaimFinishedError(
                f"this training step was already {self.state}; open a new one with "
                "consumer.step(). Nothing was changed"
            )

    def ack(self, claim: Claim, *, allow_evicted: bool = False) -> None:
        """Ack ``claim`` (its rows consumed) with the step. Rows of it evicted or deleted
        meanwhile make the step raise RowsEvictedError at its commit, writing nothing,
        unless ``allow_evicted=True`` (the rows left are acked), as :meth:`Claim.ack`."""
        self._check_open()
        allowed = check_flag("allow_evicted", allow_evicted)
        if not isinstance(claim, Claim):
            raise UnsupportedTypeError(
                f"step.ack() takes a Claim (from consumer.claim()), got {type(claim).__name__}"
            )
        claim._check_held("acked")
        consumer = self._consumer
        if claim.consumer != consumer.name:
            raise ClaimOwnerError(
                f"claim {claim.claim_id} belongs to consumer {claim.consumer!r}, not "
                f"{consumer.name!r}; ack it in a step of that consumer. Nothing was changed"
            )
        if claim.generation != consumer.generation:
            raise FencedError(
                f"claim {claim.claim_id} was made by generation {claim.generation} of consumer "
                f"{consumer.name!r}, not by this step's generation {consumer.generation}: an "
                "incarnation acks only its own claims. Nothing was changed"
            )
        if any(c is claim for c in self._claims):
            raise InvalidArgumentError(
                f"claim {claim.claim_id} is already acked in this step; give each claim once"
            )
        self._claims.append(claim)
        self._allow_evicted.append(allowed)

    def save_checkpoint(self, state: Any) -> None:
        """Store ``state`` (any JSON value) as the consumer's checkpoint with the step (the
        last one given wins; read it back with ``consumer.checkpoint()``)."""
        self._check_open()
        self._checkpoint = check_checkpoint(state)

    def set_policy_version(self, version: int, *, force: bool = False) -> None:
        """Publish ``version`` with the step, as
        :meth:`~expstore.ReplayBuffer.set_policy_version` (going backwards needs
        ``force=True``; with eviction ``"stale"`` the rows it makes stale go in the same
        transaction)."""
        self._check_open()
        if not isinstance(force, bool):
            raise UnsupportedTypeError(f"force must be True or False, got {force!r}")
        self._version = check_version(version)
        self._force = force

    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> None:
        """Set stored priorities by row id with the step, as
        :meth:`~expstore.ReplayBuffer.update_priorities` (ids no longer stored are
        skipped; for an id given twice, here or in another call of the step, the last
        priority wins)."""
        self._check_open()
        checked, values = check_priorities(ids, priorities)
        self._ids.extend(checked)
        self._priorities.append(values)

    def commit(self) -> None:
        """Write the step in one transaction (what the end of the ``with`` block does)."""
        self._check_open()
        for claim in self._claims:  # finished meanwhile (claim.ack(), another step)
            claim._check_held("acked")
        consumer = self._consumer
        parts = StepParts(
            claims=tuple(c._claimed for c in self._claims),
            allow_evicted=tuple(self._allow_evicted),
            checkpoint=self._checkpoint,
            version=self._version,
            force=self._force,
            ids=tuple(self._ids),
            priorities=np.concatenate(self._priorities) if self._priorities else None,
        )
        sql = consumer._sql
        done = commit_step(queue_of(sql.handle), consumer.name, consumer.generation, parts)
        self.state = "committed"
        for claim in self._claims:
            claim.state = "acked"
        self.acked = done.acked
        self.evicted = done.evicted
        self.checkpoint_seq = done.checkpoint_seq
        self.updated = sql.priorities_updated(done.priorities)

    def __enter__(self) -> Step:
        self._check_open()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.commit()
        elif self.state == "open":
            self.state = "abandoned"

    def __repr__(self) -> str:
        return (
            f"Step({self._consumer.name!r}, generation={self._consumer.generation}, "
            f"claims={len(self._claims)}, state={self.state!r})"
        )


def claim_rows(
    sql: SqlStorage,
    batch_size: int,
    query_condition: QueryCondition = None,
    *,
    consumer: str,
    lease_s: float = DEFAULT_LEASE_S,
    order: Any = "oldest",
    converter: Converter[Any] | None = None,
    wait_s: float | None = None,
    max_staleness: int | None = None,
    min_batch_size: int | None = None,
    generation: int = 0,
) -> Claim:
    """See :meth:`expstore.ReplayBuffer.claim`; ``generation``: the incarnation claiming (see
    :class:`Consumer`; 0 for a plain claim)."""
    n = check_int("batch_size", batch_size, minimum=1, maximum=MAX_BATCH)
    consumer = check_consumer(consumer)
    lease = check_lease(lease_s)
    wait_s = check_seconds("wait_s", wait_s, optional=True)
    min_n = check_int("min_batch_size", min_batch_size, minimum=1, maximum=n, optional=True)
    if min_n is not None and wait_s is None:
        raise InvalidArgumentError(
            f"min_batch_size={min_n} is how many rows a claim waits for before it returns; "
            "give wait_s= too (the most seconds to wait), or leave min_batch_size out to "
            "take what there is now"
        )
    queue = queue_of(sql.handle)
    builder = as_converter(DefaultConverter() if converter is None else converter)
    strategy = claim_order(
        order, sql, query_condition, Scope(query_condition, check_staleness(max_staleness))
    )
    strategy.check(n, min_n)
    claimable, what = strategy.claimable, strategy.what
    need = n if min_n is None else min_n
    waiting = CLAIM_POLL.start(wait_s) if wait_s is not None else None
    admission: Waiting | None = waiting  # a prompt queue's admission: waited for within wait
    while True:
        if waiting is not None:
            _wait_for_claimable(sql, claimable, need, min_n, waiting, wait_s, what)
        want = n
        # Samples counted for this attempt; an attempt that takes nothing gives them back.
        held = sql.rate_limits.reserve()
        with held:
            # A buffer last seen without a rate limit is claimed from at once: the claim's
            # own transaction checks there still is none (no round trip of its own).
            unlimited = not sql.rate_limits.maybe_limited()
            if not unlimited:
                # Counted against the rate limit before the claim, so only as many rows as
                # are claimable now: a learner polling an empty queue must not count samples
                # that a writer held by block_writers could pass against. With min_n, as
                # many as the budget allows down to min_n; with wait, waiting no longer than
                # the claim's own.
                want = min(n, claimable(n))
                if want:
                    remaining = None if waiting is None else waiting.remaining()
                    left = None if remaining is None else max(remaining, 0.0)
                    least = None if min_n is None else min(min_n, want)
                    held.add(want, at_least=least, unit=strategy.unit, timeout=left)
                    want = held.counted or want
            try:
                claimed = queue.claim(
                    want,
                    strategy.scope,
                    consumer,
                    lease,
                    strategy.candidates,
                    strategy.groups,
                    generation,
                    at_least=min_n or 0,
                    unlimited=unlimited,
                    columns=ROW_COLUMNS if builder.paths is None else None,
                )
            except RateLimitFound:  # set since this handle last looked: count, then claim
                sql.rate_limits.observe(True)
                continue
            except AdmissionBlocked as blocked:
                state: AdmissionState = blocked.args[0]
                if admission is None:  # no wait_s= given: the queue's own timeout
                    admission = CLAIM_POLL.start(state.timeout_s)
                if not admission.sleep():
                    raise _held_back(sql, state, admission.timeout_s) from None
                continue
            except ShortClaim as short:
                # Other claimers took rows between the count and the claim; nothing was
                # taken: wait for min_n again, within the same deadline.
                assert waiting is not None  # min_n goes with wait
                if not waiting.sleep():
                    raise _timed_out(sql, min_n, int(short.args[0]), wait_s, what) from None
                continue
            held.use(len(claimed.keys))
        break
    # Gives the claim's samples back if its rows return to the queue unconsumed.
    refund = held.later()
    try:
        if claimed.rows is not None:  # read by the claim's own statement
            fetched = sql.fetch_read(claimed.keys, claimed.rows)
        else:
            fetched = sql.fetch(claimed.keys, builder.paths, writable=not builder.copies_arrays)
        info = SampleInfo(claimed.keys, list(fetched.ids))
        batch = builder.attach_info(builder.build(fetched), info)
    except BaseException as exc:
        # The caller never gets this claim: its rows go back to the queue now, and their
        # samples back to the rate limit, instead of waiting out the lease.
        _give_back(queue, claimed, refund, exc)
        raise
    # The claim keeps its keys, not the rows its statement read.
    return Claim(queue, claimed._replace(rows=None), list(fetched.ids), batch, refund, sql)


def count_ready_groups(
    sql: SqlStorage,
    sampler: GroupSampler,
    query_condition: QueryCondition,
    max_staleness: int | None,
) -> GroupTally:
    """See :meth:`expstore.ReplayBuffer.ready_groups`."""
    if not isinstance(sampler, GroupSampler):
        raise UnsupportedTypeError(
            f"ready_groups takes the GroupSampler a group claim uses, got {sampler!r}"
        )
    sampler.on_buffer(sql)
    return claim_counts(sampler, sql, query_condition, check_staleness(max_staleness))


def _give_back(
    queue: ClaimQueue,
    claimed: Claimed,
    refund: Callable[[int], None] | None,
    exc: BaseException,
) -> None:
    """Release a claim its caller never got (fetching or converting its rows raised
    ``exc``) and ``refund`` its samples (None: none counted); if that fails too, ``exc``
    says so."""
    try:
        queue.release(claimed)
        if refund is not None:
            refund(len(claimed.keys))
    except Exception as failed:  # the first error is the one to raise
        exc.add_note(
            f"The claim's {len(claimed.keys)} rows could not be released ({failed}); they "
            "return to the queue when its lease runs out"
        )


def _wait_for_claimable(
    sql: SqlStorage,
    claimable: Callable[[int], int],
    need: int,
    min_n: int | None,
    waiting: Waiting,
    wait_s: float | None,
    what: str,
) -> None:
    """Poll until ``need`` rows are claimable; past the deadline, WaitTimeoutError saying
    what each side is doing, unless (without min_n) some rows are (the claim takes them)."""
    seen = claimable(need)
    while seen < need:
        if not waiting.sleep():
            seen = claimable(need)
            if seen >= need or (min_n is None and seen):
                return
            raise _timed_out(sql, min_n, seen, wait_s, what)
        seen = claimable(need)


def _held_back(
    sql: SqlStorage, state: AdmissionState, waited: float | None
) -> AdmissionTimeoutError:
    """The error of a claim of prompts that waited ``waited`` seconds for admission."""
    why = {
        "backlog": "the completions stored and not yet consumed reached max_backlog",
        "staleness": "the completions in flight and stored unconsumed reached "
        "(max_staleness + 1) * batch_size",
    }
    held_by = state.held_by or "staleness"
    return AdmissionTimeoutError(
        f"waited {waited} s to claim prompts of buffer {sql.handle.name!r}: {why[held_by]} "
        f"({describe(state)}). The learners are behind: the claim is admitted once they "
        "consume more (or raise the bound with set_admission()). Nothing was claimed",
        held_by,
        state.in_flight,
        state.backlog,
    )


def _timed_out(
    sql: SqlStorage, min_n: int | None, seen: int, wait_s: float | None, what: str
) -> WaitTimeoutError:
    """The error of a claim's wait that timed out with ``seen`` rows claimable."""
    if min_n is None:
        held = f"no {what} became claimable within {wait_s} s"
    else:
        unit = "rows" if what == "row" else "rows, in " + what.replace(" group ", " groups ")
        held = f"waited {wait_s} s for min_batch_size={min_n} claimable {unit}, found {seen}"
    return WaitTimeoutError(
        f"{held}. {sql.rate_limits.situation()}. Check that actors are writing rows that "
        "match the condition (for group claims: complete groups the group condition "
        "accepts, within max_staleness), or wait longer. Nothing was claimed"
    )


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
    timeout_s: float | None,
    claimable: bool,
    max_staleness: int | None = None,
) -> int:
    """See :meth:`expstore.ReplayBuffer.wait_for`."""
    min_rows = check_int("min_rows", min_rows, minimum=1)
    limit = check_seconds("timeout_s", timeout_s, optional=True)
    scope = Scope(query_condition, check_staleness(max_staleness))
    seen = [0]

    def ready() -> bool:
        seen[0] = queue_of(sql.handle).count(scope, min_rows, claimable=claimable)
        return seen[0] >= min_rows

    try:
        wait_until(ready, limit)
    except WaitTimeoutError:
        kind = "claimable rows" if claimable else "rows"
        raise WaitTimeoutError(
            f"waited {limit} s for {min_rows} matching {kind}, found {seen[0]}. "
            f"{sql.rate_limits.situation()}. Check that actors are writing rows that match "
            "the condition, or wait longer"
        ) from None
    return seen[0]


# -- prompt queues (expstore.claims.prompts) ------------------------------------
def store_prompts(
    sql: SqlStorage,
    prompts: Sequence[DataRow],
    group_size: int | Sequence[int],
    parts: int = 1,
) -> StoreReport:
    """See :meth:`expstore.ReplayBuffer.store_prompts`."""
    batch = prepare(prompts)
    wanted: list[Any] = [group_size] * len(batch)
    if isinstance(group_size, Sequence) and not isinstance(group_size, (str, bytes)):
        wanted = list(group_size)
    if len(wanted) != len(batch):
        raise InvalidArgumentError(
            f"group_size= gives {len(wanted)} targets for {len(batch)} prompts; give one "
            "number for all, or one per prompt. Nothing was stored"
        )
    goals = [check_int("group_size", t, minimum=1, maximum=MAX_TARGET) for t in wanted]
    parts = check_int("parts", parts, minimum=1, maximum=MAX_TARGET)
    if parts > min(goals, default=parts):
        raise InvalidArgumentError(
            f"parts={parts} splits each prompt's group_size over that many rows, so every "
            f"part needs one completion at least; a prompt asks for {min(goals)}. Nothing "
            "was stored"
        )
    rows, shares = _in_parts(batch, goals, parts)
    handle = sql.handle

    def give_targets(conn: Connection) -> None:  # in the rows' own transaction
        ids = list(shares)
        stmt = select(rows_table.c.id, rows_table.c.key).where(
            rows_table.c.buffer_id == handle.buffer_id, rows_table.c.id.in_(ids)
        )
        key_of = {str(i): int(k) for i, k in conn.execute(stmt).all()}
        set_targets(handle, conn, {key_of[i]: shares[i] for i in ids if i in key_of})

    return store_rows(handle, rows, None, give_targets)[2]


def _in_parts(
    batch: list[DataRow], goals: list[int], parts: int
) -> tuple[list[DataRow], dict[str, int]]:
    """The rows to store for ``batch`` split into ``parts`` rows each (ids ``<id>#<i>``,
    the rest the same), and each row's share of its prompt's target, by id."""
    if parts == 1:
        return batch, {row.id: goal for row, goal in zip(batch, goals, strict=True)}
    rows: list[DataRow] = []
    shares: dict[str, int] = {}
    for row, goal in zip(batch, goals, strict=True):
        for i in range(parts):
            part_id = f"{row.id}#{i}"
            if len(part_id) > 255:
                raise InvalidArgumentError(
                    f"prompt id {row.id[:40]!r}... is too long to name its parts "
                    f"({part_id[:40]!r}... has {len(part_id)} characters, at most 255). "
                    "Nothing was stored"
                )
            rows.append(row.model_copy(update={"id": part_id}))
            shares[part_id] = goal // parts + (1 if i < goal % parts else 0)
    return rows, shares


def set_admission(
    sql: SqlStorage,
    into: Any,
    *,
    batch_size: int | None,
    max_batches_ahead: int | None,
    max_backlog: int | None,
    timeout_s: float | None,
) -> None:
    """See :meth:`expstore.ReplayBuffer.set_admission`."""
    handle = sql.handle
    if into is None:
        with handle.errors("remove the admission bound"), handle.write() as conn:
            clear_admission(handle, conn)
        return
    target = getattr(into, "sql", None)
    if not isinstance(target, SqlStorage):
        raise UnsupportedTypeError(
            f"into= takes the ReplayBuffer the completions go to, got {type(into).__name__}"
        )
    if target.identity[0] != sql.identity[0]:
        raise InvalidArgumentError(
            "into= must be a buffer of the prompts' database: admission counts both in one "
            "transaction. Nothing was changed"
        )
    batch = check_int("batch_size", batch_size, minimum=1, optional=True)
    ahead = check_int("max_batches_ahead", max_batches_ahead, minimum=0, optional=True)
    backlog_ = check_int("max_backlog", max_backlog, minimum=1, optional=True)
    wait_s = check_seconds("timeout_s", timeout_s, optional=True)
    if (batch is None) != (ahead is None):
        raise InvalidArgumentError(
            "batch_size and max_batches_ahead go together (the bound is (max_batches_ahead "
            "+ 1) * batch_size completions in flight and stored unconsumed); give both or "
            "neither. Nothing was changed"
        )
    if batch is None and backlog_ is None:
        raise InvalidArgumentError(
            "set_admission() needs a bound: batch_size with max_batches_ahead, or max_backlog "
            "(or into=None to remove the bound). Nothing was changed"
        )
    settings = AdmissionSettings(target.handle.buffer_id, batch, ahead, backlog_, wait_s)
    with handle.errors("set the admission bound"), handle.write() as conn:
        store_admission(handle, conn, settings)


class Admission(NamedTuple):
    """A prompt buffer's admission bound as set (``buffer.admission()``): the buffer the
    completions go to (its name), the learner's batch, how many batches ahead generation
    may run, the bound on stored unconsumed completions, and a claim's default wait."""

    into: str
    batch_size: int | None
    max_batches_ahead: int | None
    max_backlog: int | None
    timeout_s: float | None


def admission_setting(sql: SqlStorage) -> Admission | None:
    """See :meth:`expstore.ReplayBuffer.admission`."""
    handle = sql.handle
    with handle.errors("read the admission bound"), handle.read() as conn:
        settings = admission_settings(handle, conn)
        if settings is None:
            return None
        name = select(buffers.c.name).where(buffers.c.id == settings.into_id)
        into = conn.execute(name).scalar_one()
    return Admission(
        into,
        settings.batch_size,
        settings.max_batches_ahead,
        settings.max_backlog,
        settings.timeout_s,
    )


def admission_now(sql: SqlStorage) -> AdmissionState | None:
    """See :meth:`expstore.ReplayBuffer.admission_stats`."""
    handle = sql.handle
    with handle.errors("read the admission bound"), handle.single() as conn:
        settings = admission_settings(handle, conn)
        if settings is None:
            return None
        return admission_state(handle, conn, settings, handle.dialect.now())
