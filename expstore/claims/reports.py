"""Reports on claims: queue depth by claim state, and each row's consumption record.

Read-only views over ``expstore_consumption`` (see :mod:`expstore.claims.queue`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, case, func, select
from sqlalchemy.sql.elements import ColumnElement

from .._args import check_text
from ..db.handle import BufferHandle
from ..db.row_ids import ids_to_keys
from ..db.schema import buffers, checkpoints, consumption, produced, progress, rows, targets
from ..draw_counts import times_sampled
from ..errors import UnsupportedTypeError
from ..query import QueryCondition
from ..retention.tombstones import buried

__all__ = [
    "IN_FLIGHT_SHOWN",
    "Completions",
    "InFlight",
    "Lineage",
    "ProducedBy",
    "QueueStats",
    "checkpoint_value",
    "claim_state",
    "queue_stats",
    "row_lineage",
]

_C = consumption.c


def checkpoint_value(text: str | None) -> Any:
    """A checkpoint as stored (its JSON text in ``expstore_checkpoints.state``) back as the
    value it was acked with; None for no checkpoint."""
    return None if text is None else json.loads(text)


class ProducedBy(NamedTuple):
    """Which prompt claim produced a row (``claim.ack(produce=rows, into=buffer)``): the
    claim, its consumer (the actor), the prompt's buffer and row id (None when a claim of
    several prompts gave a plain list), and when (database clock)."""

    claim_id: str
    consumer: str
    prompt_buffer: str | None
    prompt_id: str | None
    produced_at: float


class Lineage(NamedTuple):
    """The consumption record of one row; of a row no longer stored, its tombstone's."""

    #: ``unclaimed``, ``leased``, ``expired`` (lease ran out, not acked), ``consumed``, or
    #: ``evicted`` (no longer stored; the fields below are its record as it went).
    state: str
    consumer: str | None
    claimed_at: float | None
    lease_until: float | None
    acked_at: float | None
    #: The checkpoint its consumer acked it with (None without one).
    checkpoint: Any
    checkpoint_seq: int | None
    times_claimed: int
    #: Draws counted for samplers with ``consume_after``.
    times_sampled: int = 0
    #: When an evicted row went (database clock), and why: ``capacity``, ``stale``,
    #: ``delete`` or ``clear``, with the buffer's eviction policy for the first two.
    evicted_at: float | None = None
    evicted_by: str | None = None
    eviction_policy: str | None = None
    #: A row produced by a prompt claim's ack: which claim, actor and prompt.
    produced_by: ProducedBy | None = None
    #: A prompt with a completion target: the target and the completions stored for it.
    target: int | None = None
    done: int | None = None


class InFlight(NamedTuple):
    """A row a live claim holds now: its id, the consumer (an actor, for a prompt),
    when it was claimed and its lease ends (database clock), how many completions it
    still needs (None: no completion target), and how long ago its progress was last saved
    (seconds; None: never)."""

    id: str
    consumer: str
    claimed_at: float
    lease_until: float
    needs: int | None
    progress_age_s: float | None


class Completions(NamedTuple):
    """A prompt queue's completion targets (rows stored with ``store_prompts``): the
    prompts with a target, those done (target reached), the completions asked for and
    stored so far."""

    prompts: int
    done: int
    target: int
    stored: int


class QueueStats(NamedTuple):
    """How many matching rows are unclaimed, leased, expired (waiting to be claimed again)
    and consumed, and per consumer how many it holds and has consumed. For the whole
    buffer (no condition) also the rows held now (``in_flight``, the oldest claims first,
    at most :data:`IN_FLIGHT_SHOWN`) and, for a prompt queue, its ``completions``."""

    total: int
    unclaimed: int
    leased: int
    expired: int
    consumed: int
    per_consumer: dict[str, dict[str, int]]
    in_flight: tuple[InFlight, ...] = ()
    completions: Completions | None = None


#: The most rows held now that :class:`QueueStats` lists.
IN_FLIGHT_SHOWN = 100


def claim_state(now: Any) -> ColumnElement[str]:
    """A row's claim state from its entry (outer-joined, so NULL for a row never claimed):
    ``unclaimed`` (also after a release), ``consumed``, ``expired`` or ``leased``."""
    return case(
        (_C.key.is_(None), "unclaimed"),
        (_C.acked_at.is_not(None), "consumed"),
        (_C.lease_until.is_(None), "unclaimed"),
        (_C.lease_until < now, "expired"),
        else_="leased",
    )


def queue_stats(handle: BufferHandle, query_condition: QueryCondition) -> QueueStats:
    """Queue depth: matching rows by claim state, and per consumer."""
    state = claim_state(handle.dialect.now()).label("state")
    with handle.errors("read queue statistics"), handle.read() as conn:
        if query_condition is None:
            # Every row of the buffer: the claimed ones are its consumption entries (which
            # go with their rows), the rest unclaimed, by the buffer's row count; no pass
            # over the rows.
            held = select(buffers.c.row_count).where(buffers.c.id == handle.buffer_id)
            stmt = (
                select(state, _C.consumer, func.count())
                .where(_C.buffer_id == handle.buffer_id)
                .group_by(state, _C.consumer)
            )
            claimed = conn.execute(stmt).all()
            unclaimed = int(conn.execute(held).scalar_one()) - sum(int(c) for *_, c in claimed)
            grouped: Sequence[Any] = [*claimed, ("unclaimed", None, unclaimed)]
            flying, completions = _in_flight(handle, conn), _completions(handle, conn)
        else:
            stmt = (
                select(state, _C.consumer, func.count())
                .select_from(rows.outerjoin(consumption, _C.key == rows.c.key))
                .where(*handle.where(query_condition))
                .group_by(state, _C.consumer)
            )
            grouped = conn.execute(stmt).all()
            flying, completions = (), None
    totals = dict.fromkeys(("unclaimed", "leased", "expired", "consumed"), 0)
    per: dict[str, dict[str, int]] = {}
    for name, consumer, count in grouped:
        totals[name] += int(count)
        if consumer is not None and name != "unclaimed":
            per.setdefault(consumer, {"leased": 0, "expired": 0, "consumed": 0})[name] += int(count)
    return QueueStats(
        sum(totals.values()), **totals, per_consumer=per, in_flight=flying, completions=completions
    )


def _producers(handle: BufferHandle, conn: Connection, keys: list[int]) -> dict[int, ProducedBy]:
    """Who produced each row of ``keys`` that a prompt claim's ack stored."""
    if not keys:
        return {}
    p = produced.c
    stmt = (
        select(p.key, p.claim_id, p.consumer, buffers.c.name, p.prompt_id, p.produced_at)
        .select_from(produced.outerjoin(buffers, buffers.c.id == p.prompt_buffer_id))
        .where(handle.dialect.key_in(p.key))
    )
    found = conn.execute(stmt, {"keys": handle.dialect.key_set(keys)})
    return {
        int(k): ProducedBy(str(claim), str(who), name, prompt, float(at))
        for k, claim, who, name, prompt, at in found
    }


def _in_flight(handle: BufferHandle, conn: Connection) -> tuple[InFlight, ...]:
    """The rows live claims hold now, oldest claim first, through the ``(buffer_id,
    acked_at, lease_until)`` index (only the entries held)."""
    now = float(conn.execute(select(handle.dialect.now())).scalar_one())
    stmt = (
        select(
            rows.c.id,
            _C.consumer,
            _C.claimed_at,
            _C.lease_until,
            targets.c.target - targets.c.done,
            progress.c.saved_at,
        )
        .select_from(
            consumption.join(rows, rows.c.key == _C.key)
            .outerjoin(targets, targets.c.key == _C.key)
            .outerjoin(progress, progress.c.key == _C.key)
        )
        .where(_C.buffer_id == handle.buffer_id, _C.acked_at.is_(None), _C.lease_until >= now)
        .order_by(_C.claimed_at, _C.key)
        .limit(IN_FLIGHT_SHOWN)
    )
    return tuple(
        InFlight(
            str(i),
            str(consumer),
            float(at),
            float(until),
            None if needs is None else int(needs),
            None if saved is None else max(0.0, now - float(saved)),
        )
        for i, consumer, at, until, needs, saved in conn.execute(stmt)
    )


def _completions(handle: BufferHandle, conn: Connection) -> Completions | None:
    """The buffer's completion targets in sum (None: it has none), by the targets'
    ``buffer_id`` index."""
    t = targets.c
    stmt = select(
        func.count(),
        func.coalesce(func.sum(case((t.done >= t.target, 1), else_=0)), 0),
        func.coalesce(func.sum(t.target), 0),
        func.coalesce(func.sum(t.done), 0),
    ).where(t.buffer_id == handle.buffer_id)
    prompts, done, target, stored = conn.execute(stmt).one()
    if not prompts:
        return None
    return Completions(int(prompts), int(done), int(target), int(stored))


def row_lineage(handle: BufferHandle, ids: Sequence[str]) -> dict[str, Lineage]:
    """The consumption record of each stored row of ``ids`` (rows never claimed:
    ``unclaimed``), and of each row no longer stored whose tombstone the buffer keeps
    (``evicted``, see :mod:`expstore.retention.tombstones`); other ids are left out."""
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        what = "one string" if isinstance(ids, str) else f"{type(ids).__name__} {ids!r}"
        raise UnsupportedTypeError(f"lineage() needs a list of ids (str), got {what}")
    ids = [check_text("id", i) for i in ids]
    cp = checkpoints.c
    with_checkpoint = consumption.outerjoin(
        checkpoints,
        and_(
            cp.buffer_id == _C.buffer_id,
            cp.consumer == _C.consumer,
            cp.seq == _C.checkpoint_seq,
        ),
    )
    stmt = (
        select(
            _C.key,
            claim_state(handle.dialect.now()),
            _C.consumer,
            _C.claimed_at,
            _C.lease_until,
            _C.acked_at,
            cp.state,
            _C.checkpoint_seq,
            _C.times_claimed,
        )
        .select_from(with_checkpoint)
        .where(handle.dialect.key_in(_C.key))
    )
    with handle.errors("read lineage"), handle.read() as conn:
        key_of = ids_to_keys(handle, conn, list(ids))
        keys = list(key_of.values())
        bound = {"keys": handle.dialect.key_set(keys)}
        found = {
            int(r[0]): Lineage(r[1], r[2], r[3], r[4], r[5], checkpoint_value(r[6]), r[7], r[8])
            for r in conn.execute(stmt, bound)
        }
        gone = buried(handle, conn, [i for i in ids if i not in key_of])
        made = _producers(handle, conn, keys)
        goals = {
            int(k): (int(t), int(d))
            for k, t, d in conn.execute(
                select(targets.c.key, targets.c.target, targets.c.done).where(
                    handle.dialect.key_in(targets.c.key)
                ),
                bound,
            )
        }
    never = Lineage("unclaimed", None, None, None, None, None, None, 0)
    drawn = times_sampled(handle, keys) if keys else {}
    stored = {
        row_id: found.get(key, never)._replace(
            times_sampled=drawn.get(key, 0),
            produced_by=made.get(key),
            target=goals[key][0] if key in goals else None,
            done=goals[key][1] if key in goals else None,
        )
        for row_id, key in key_of.items()
    }
    evicted = {
        row_id: Lineage(
            "evicted",
            t.consumer,
            t.claimed_at,
            t.lease_until,
            t.acked_at,
            checkpoint_value(t.checkpoint),
            t.checkpoint_seq,
            t.times_claimed,
            0,
            t.evicted_at,
            t.reason,
            t.policy,
        )
        for row_id, t in gone.items()
    }
    # In the order asked (an id both stored and evicted before is its stored row's).
    return {i: stored[i] if i in stored else evicted[i] for i in ids if i in stored or i in evicted}
