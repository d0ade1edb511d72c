"""Prompt queues: completion targets, who produced what, and admission by staleness.

Prompts (tasks) are rows of a buffer that actors claim like any rows (leases, fencing,
saved progress). This module holds what makes such a buffer a prompt queue:

- **Completion targets.** A prompt stored with ``group_size=G`` has an entry in
  ``expstore_targets``: ``target`` (G) and ``done`` (the completions stored for it so far).
  An ack that stores completions (``claim.ack(produce=..., into=rollouts)``) adds them to
  ``done`` in its transaction: a prompt that reached its target is consumed; one still
  short is released in the same transaction, claimable again for what it still needs
  (:func:`count_completions`). An ack that produces nothing gives the prompt up (consumed
  as it is). A prompt split into parts (several actors generating one group) is one row
  per part, each with its own share of the target.
- **Lineage of completions.** Each produced row gets an entry in ``expstore_produced``
  naming the prompt claim, its consumer (the actor) and the prompt row
  (:func:`record_produced`), written with the rows.
- **Admission.** A prompt buffer may carry an admission bound (``expstore_admission``,
  AReaL's rule): a claim of its prompts is admitted while the completions in flight (what
  the live claims of prompts still need) plus those stored in the rollouts buffer and not
  yet consumed (inserted, less discarded, less acked by its consumers; at most the rows
  it holds) stay below ``(max_batches_ahead + 1) * batch_size``, and while the stored ones
  stay below ``max_backlog``. Every claim of the buffer locks its admission row while it
  counts and takes, so the bound holds across every process and host, and the counts
  are the database's own: nothing to lose in a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from ..db.handle import BufferHandle
from ..db.pipeline import Batched
from ..db.schema import (
    admission,
    buffers,
    consumers,
    consumption,
    newest_first,
    produced,
    rows,
    targets,
)
from ..errors import InvalidArgumentError
from ..limits.counters import discarded_total

__all__ = [
    "AdmissionBlocked",
    "AdmissionSettings",
    "AdmissionState",
    "admission_settings",
    "admission_state",
    "admit",
    "admitted",
    "clear_admission",
    "completions_added",
    "count_completions",
    "describe",
    "largest_key",
    "needs_of",
    "record_produced",
    "store_admission",
    "set_targets",
    "short_of",
]

_C = consumption.c
_T = targets.c
_A = admission.c

#: The most completions one prompt may ask for.
MAX_TARGET = 1_000_000


@dataclass(frozen=True)
class AdmissionSettings:
    """A prompt buffer's admission bound, as stored: the buffer its completions go to
    (``into_id``), the learner's batch (completions per step) and ``max_batches_ahead`` (both
    or neither), ``max_backlog`` (completions stored and not yet consumed), and how long a
    claim waits by default (``timeout_s``; None: as long as it takes)."""

    into_id: int
    batch_size: int | None
    max_batches_ahead: int | None
    max_backlog: int | None
    timeout_s: float | None

    @property
    def staleness_bound(self) -> int | None:
        """``(max_batches_ahead + 1) * batch_size``: completions in flight and stored
        unconsumed that admission lets exist at once (None: no such bound)."""
        if self.batch_size is None or self.max_batches_ahead is None:
            return None
        return (self.max_batches_ahead + 1) * self.batch_size


class AdmissionState(NamedTuple):
    """What admission sees now: completions ``in_flight`` (still needed by the live claims
    of prompts) and ``backlog`` (stored into the rollouts buffer, not yet consumed), the
    bounds, and ``capacity`` (how many more completions a claim may put in flight; None:
    no staleness bound). ``held_by`` names the bound that holds claims back now:
    ``"staleness"``, ``"backlog"`` or None."""

    in_flight: int
    backlog: int
    staleness_bound: int | None
    max_backlog: int | None
    capacity: int | None
    held_by: str | None
    #: How long a claim waits for room by default (the settings' ``timeout_s``).
    timeout_s: float | None = None


class AdmissionBlocked(Exception):
    """Internal: a claim of prompts found no room under the admission bound (rolled back,
    nothing taken); ``args[0]``: the :class:`AdmissionState` it saw."""


# -- targets ----------------------------------------------------------------------------
def set_targets(handle: BufferHandle, conn: Connection, found: Mapping[int, int]) -> None:
    """Give the rows of ``found`` (key: target) their completion targets, in the caller's
    transaction (the one that stored them)."""
    if found:
        conn.execute(
            targets.insert(),
            [{"key": k, "buffer_id": handle.buffer_id, "target": t} for k, t in found.items()],
        )


def needs_of(handle: BufferHandle, conn: Connection, keys: Sequence[int]) -> dict[int, int]:
    """How many completions each row of ``keys`` with a target still needs, by key."""
    if not len(keys):
        return {}
    dialect = handle.dialect
    statement = handle.statement(
        ("completions needed",),
        lambda: select(_T.key, _T.target - _T.done).where(dialect.key_in(_T.key)),
    )
    found = statement.run(conn, keys=dialect.key_set(list(keys)))
    return {int(k): int(left) for k, left in found}


def count_completions(
    handle: BufferHandle,
    conn: Connection,
    keys: Sequence[int],
    made: Mapping[int, int] | None,
    claim_id: str,
) -> list[int]:
    """Add the completions an ack stored (``made``: key -> how many; None: the ack stored
    none) to the targets of the claim's rows ``keys``, in the ack's transaction; returns
    the keys of the rows still short of their target (the caller releases them); see
    :func:`short_of`. On Postgres the statement that acks the claim's entries does this
    (:func:`completions_added`)."""
    if made is None:
        return []
    left = needs_of(handle, conn, keys)
    short = short_of(made, left, claim_id)
    for k, n in made.items():
        if n and k in left:
            conn.execute(update(targets).where(_T.key == k).values(done=_T.done + n))
    return short


def short_of(made: Mapping[int, int], left: Mapping[int, int], claim_id: str) -> list[int]:
    """The rows still short of their target once ``made`` (key -> completions an ack
    stored) is added to what they needed (``left``: key -> completions still needed,
    rows with a target only). A row given more than it needs raises InvalidArgumentError
    (the whole ack rolls back); rows without a target are acked as any row."""
    made = {k: n for k, n in made.items() if k in left}  # rows without a target: as before
    over = {k: (n, left[k]) for k, n in made.items() if n > left[k]}
    if over:
        k, (n, need) = next(iter(over.items()))
        raise InvalidArgumentError(
            f"claim {claim_id}: {n} completions for a prompt that needs {need} more (row "
            f"key {k}); store at most what claim.needs says. Nothing was stored or acked"
        )
    return sorted(k for k, need in left.items() if made.get(k, 0) < need)


def completions_added(handle: BufferHandle) -> tuple[Any, Any]:
    """For a statement that acks a claim's entries (Postgres): ``(added, needs)``, the
    claim's keys bound with the completions stored for each (``keys`` and ``values``, see
    :meth:`~expstore.db.dialects.Dialect.key_value_params`) added to their targets (a CTE),
    and what those targets still needed before (a subquery of ``key`` and ``need``, read
    in the statement's snapshot), for :func:`short_of`."""
    given = handle.dialect.bound_key_values()
    added = (
        update(targets)
        .where(_T.key == given.c.key, given.c.value > 0)
        .values(done=_T.done + cast(given.c.value, Integer))
        .returning(_T.key)
        .cte("added")
    )
    needs = (
        select(_T.key.label("key"), (_T.target - _T.done).label("need"))
        .where(handle.dialect.key_in(_T.key))
        .subquery("needs")
    )
    return added, needs


# -- lineage of completions --------------------------------------------------------------
def record_produced(
    into: BufferHandle,
    conn: Connection,
    ids_by_prompt: Sequence[tuple[int | None, Sequence[str]]],
    prompt_ids: Mapping[int, str],
    prompt_buffer_id: int,
    claim_id: str,
    consumer: str,
    above: int,
    tail: Batched | None = None,
) -> dict[int, int] | None:
    """Record which prompt row (``ids_by_prompt``: pairs of a prompt key, None when the
    claim did not say, and the ids of the rows produced for it) of which claim produced
    each row this write just stored into ``into``'s buffer (keys above ``above``, the
    buffer's largest key before it: rows a dedup left out, or stored earlier under the same
    id, are not this write's), in the caller's transaction. Returns how many rows were
    stored per prompt key; with ``tail`` (Postgres), the statement is sent with the
    transaction's COMMIT instead, and None is returned (for a write that stores every row
    or fails)."""
    wanted = [i for _, ids in ids_by_prompt for i in ids]
    if not wanted:
        return {}
    if into.dialect.modifying_ctes:  # one statement: the rows' keys read as it inserts
        pairs = [(prompt, str(i)) for prompt, ids in ids_by_prompt for i in ids]
        statement = into.statement(("record produced",), partial(_produced_statement, into))
        params = {
            "into_id": into.buffer_id,
            "above": above,
            "ids": [i for _, i in pairs],
            "prompt_keys": [p for p, _ in pairs],
            "prompt_ids": [None if p is None else prompt_ids.get(p) for p, _ in pairs],
            "claim_id": claim_id,
            "consumer": consumer,
            "prompt_buffer_id": prompt_buffer_id,
        }
        if tail is not None:
            tail.at_commit(lambda: statement.send(conn, **params))
            return None
        found = statement.run(conn, **params)
        stored: dict[int, int] = {}
        for (prompt,) in found:
            if prompt is not None:
                stored[int(prompt)] = stored.get(int(prompt), 0) + 1
        return stored
    stmt = select(rows.c.key, rows.c.id).where(
        rows.c.buffer_id == into.buffer_id, rows.c.key > above, rows.c.id.in_(wanted)
    )
    key_of = {str(i): int(k) for k, i in conn.execute(stmt).all()}
    entries = [
        {
            "key": key_of[i],
            "buffer_id": into.buffer_id,
            "claim_id": claim_id,
            "consumer": consumer,
            "prompt_buffer_id": prompt_buffer_id,
            "prompt_key": prompt,
            "prompt_id": None if prompt is None else prompt_ids.get(prompt),
        }
        for prompt, ids in ids_by_prompt
        for i in ids
        if i in key_of
    ]
    if entries:
        # The database's clock in the statement (no round trip of its own).
        conn.execute(produced.insert().values(produced_at=into.dialect.now()), entries)
    stored = {}
    for prompt, ids in ids_by_prompt:
        if prompt is not None:
            stored[prompt] = stored.get(prompt, 0) + sum(i in key_of for i in ids)
    return stored


def _produced_statement(into: BufferHandle) -> Any:
    """:func:`record_produced` as one statement (Postgres): the produced rows' ids, prompt
    keys and prompt ids bound as arrays (``unnest``), each id's row among those above
    ``above`` found by the (buffer_id, id) index, its lineage inserted; returns the prompt
    key of each entry."""
    given = (
        func.unnest(
            bindparam("ids", type_=ARRAY(Text)),
            bindparam("prompt_keys", type_=ARRAY(BigInteger)),
            bindparam("prompt_ids", type_=ARRAY(Text)),
        )
        .table_valued(
            column("id", Text), column("prompt_key", BigInteger), column("prompt_id", Text)
        )
        .render_derived(name="given")
    )
    into_id = bindparam("into_id", type_=Integer)
    found = (
        select(
            rows.c.key,
            into_id,
            bindparam("claim_id", type_=String),
            bindparam("consumer", type_=String),
            bindparam("prompt_buffer_id", type_=Integer),
            given.c.prompt_key,
            given.c.prompt_id,
            into.dialect.now(),
        )
        .select_from(given)
        .join(
            rows,
            and_(
                rows.c.buffer_id == into_id,
                rows.c.id == given.c.id,
                rows.c.key > bindparam("above", type_=BigInteger),
            ),
        )
    )
    entered = (
        produced.insert()
        .from_select(
            [
                "key",
                "buffer_id",
                "claim_id",
                "consumer",
                "prompt_buffer_id",
                "prompt_key",
                "prompt_id",
                "produced_at",
            ],
            found,
        )
        .returning(produced.c.prompt_key)
        .cte("entered")
    )
    return select(entered.c.prompt_key)


def largest_key(handle: BufferHandle, conn: Connection) -> int:
    """The buffer's largest row key now (0 for none), by its ``(buffer_id, key)`` index."""
    stmt = newest_first(select(rows.c.key), handle.buffer_id).limit(1)
    return int(conn.execute(stmt).scalar() or 0)


# -- admission ---------------------------------------------------------------------------
def store_admission(handle: BufferHandle, conn: Connection, settings: AdmissionSettings) -> None:
    """Store the buffer's admission bound (replacing any), in the caller's transaction."""
    values = {
        "into_id": settings.into_id,
        "batch_size": settings.batch_size,
        "max_staleness": settings.max_batches_ahead,  # (the column's name)
        "max_backlog": settings.max_backlog,
        "timeout_s": settings.timeout_s,
    }
    insert = handle.dialect.upsert(admission).values(buffer_id=handle.buffer_id, **values)
    conn.execute(insert.on_conflict_do_update(index_elements=[_A.buffer_id], set_=values))


def clear_admission(handle: BufferHandle, conn: Connection) -> bool:
    """Remove the buffer's admission bound; whether it had one."""
    gone = conn.execute(delete(admission).where(_A.buffer_id == handle.buffer_id))
    return bool(gone.rowcount)


def admission_settings(
    handle: BufferHandle, conn: Connection, *, lock: bool = False
) -> AdmissionSettings | None:
    """The buffer's admission bound (None: it has none); ``lock``: hold its row until the
    transaction ends (claims do, so that one counts and takes at a time)."""
    stmt = select(_A.into_id, _A.batch_size, _A.max_staleness, _A.max_backlog, _A.timeout_s).where(
        _A.buffer_id == handle.buffer_id
    )
    found = conn.execute(handle.dialect.locked(stmt) if lock else stmt).first()
    if found is None:
        return None
    return AdmissionSettings(
        int(found.into_id),
        None if found.batch_size is None else int(found.batch_size),
        None if found.max_staleness is None else int(found.max_staleness),
        None if found.max_backlog is None else int(found.max_backlog),
        None if found.timeout_s is None else float(found.timeout_s),
    )


def in_flight(handle: BufferHandle, conn: Connection, now: Any) -> int:
    """Completions the live claims of the buffer's rows still need: a row with a target
    counts what it needs, one without counts 1. Read through the ``(buffer_id, acked_at,
    lease_until)`` index: only the entries held now."""
    return int(conn.execute(select(_in_flight(handle, now))).scalar_one())


def _in_flight(handle: BufferHandle, now: Any) -> Any:
    """:func:`in_flight` as a scalar subquery."""
    need = func.coalesce(_T.target - _T.done, 1)
    return (
        select(func.coalesce(func.sum(need), 0))
        .select_from(consumption.outerjoin(targets, _T.key == _C.key))
        .where(
            _C.buffer_id == handle.buffer_id,
            _C.acked_at.is_(None),
            _C.lease_until >= now,
        )
        .scalar_subquery()
    )


def backlog(conn: Connection, into_id: int) -> int:
    """Rows stored into buffer ``into_id`` and not yet consumed: inserted, less discarded,
    less acked by its consumers, and at most the rows it holds (rows evicted unconsumed
    leave it). Counters only: the same cost whatever the history."""
    return max(0, int(conn.execute(select(_backlog(into_id))).scalar_one() or 0))


def _backlog(into_id: int) -> Any:
    """:func:`backlog` as a scalar subquery (NULL where the buffer is gone)."""
    acked = (
        select(func.coalesce(func.sum(consumers.c.acked), 0))
        .where(consumers.c.buffer_id == into_id)
        .scalar_subquery()
    )
    left = buffers.c.inserted - discarded_total(into_id) - acked
    return (
        select(case((left < buffers.c.row_count, left), else_=buffers.c.row_count))
        .where(buffers.c.id == into_id)
        .scalar_subquery()
    )


def admission_state(
    handle: BufferHandle, conn: Connection, settings: AdmissionSettings, now: Any
) -> AdmissionState:
    """The counts and the room left under ``settings``, now."""
    # one statement, one snapshot (taken after the admission row, for a claim)
    found = conn.execute(select(_in_flight(handle, now), _backlog(settings.into_id))).one()
    flying, stored = int(found[0]), max(0, int(found[1] or 0))
    bound = settings.staleness_bound
    capacity = None if bound is None else bound - flying - stored
    held_by = None
    if settings.max_backlog is not None and stored >= settings.max_backlog:
        held_by = "backlog"
    elif capacity is not None and capacity <= 0:
        held_by = "staleness"
    return AdmissionState(
        flying, stored, bound, settings.max_backlog, capacity, held_by, settings.timeout_s
    )


def has_admission(buffer_id: Any) -> Any:
    """Whether the buffer has an admission bound, as an expression (for a statement that
    reads it with others: a claim's first)."""
    return select(_A.buffer_id).where(_A.buffer_id == buffer_id).exists()


def admit(
    handle: BufferHandle, conn: Connection, now: Any, *, bounded: bool = True
) -> AdmissionState | None:
    """Before a claim of the buffer's rows takes any: lock the buffer's admission row and
    count (None: the buffer has no admission bound; ``bounded=False``: the claim's first
    statement found none, and nothing is read). Raises :class:`AdmissionBlocked` when no
    room is left."""
    if not bounded:
        return None
    settings = admission_settings(handle, conn, lock=True)
    if settings is None:
        return None
    state = admission_state(handle, conn, settings, now)
    if state.held_by is not None:
        raise AdmissionBlocked(state)
    return state


def admitted(
    handle: BufferHandle, conn: Connection, taken: list[int], state: AdmissionState
) -> tuple[list[int], list[int]]:
    """Split the rows a claim took into those admitted (in order, while what they need
    fits the room ``state`` left) and those to give back. Raises AdmissionBlocked if not
    even the first fits; InvalidArgumentError if the first needs more than the whole
    bound (it could never be admitted)."""
    if state.capacity is None or not taken:
        return taken, []
    needs = needs_of(handle, conn, taken)
    room = state.capacity
    kept: list[int] = []
    for k in taken:
        need = needs.get(k, 1)
        if need > room:
            break
        kept.append(k)
        room -= need
    if not kept:
        need = needs.get(taken[0], 1)
        if state.staleness_bound is not None and need > state.staleness_bound:
            raise InvalidArgumentError(
                f"a prompt needs {need} completions, more than the admission bound "
                f"(max_batches_ahead + 1) * batch_size = {state.staleness_bound} lets exist at "
                "once: it could never be claimed. Raise batch_size or max_batches_ahead in "
                "set_admission(), or store the prompt in parts (store_prompts(parts=...)). "
                "Nothing was claimed"
            )
        raise AdmissionBlocked(state)
    return kept, taken[len(kept) :]


def describe(state: AdmissionState) -> str:
    """The admission counts in words, for a wait's timeout."""
    parts = [f"{state.in_flight} completions in flight", f"{state.backlog} stored unconsumed"]
    if state.staleness_bound is not None:
        parts.append(f"bound (max_batches_ahead + 1) * batch_size = {state.staleness_bound}")
    if state.max_backlog is not None:
        parts.append(f"max_backlog = {state.max_backlog}")
    return ", ".join(parts)
