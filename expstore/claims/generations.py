"""Consumer generations: fencing a learner's older incarnations, as ZooKeeper's fencing tokens
and Kafka's producer epochs do.

Opening a consumer (``buffer.consumer("learner-0")``) bumps ``expstore_consumers.generation``
for that name in one transaction and hands the new number to the incarnation. Every
claim, ack, release, renewal and checkpoint carries the generation of whoever sends it, and the
statement that would write checks it, in the same transaction, holding the consumer's row:
anything but the current generation raises :class:`~expstore.errors.FencedError` and changes
nothing. Because opening updates that row and the checks lock it (claims with a shared
lock, so one incarnation's threads claim side by side; acks, releases, renewals and steps
exclusively, as an ack's checkpoint numbering already did), a new generation commits either
before such a write (which is then refused) or after it (which then happened in full
before the new incarnation began). After a new generation commits, nothing an older incarnation
sends changes anything: a stalled learner (preempted pod, long GC pause) that wakes up and
acks its old claim cannot move the checkpoint back.

Plain claims (``buffer.claim(consumer="x")``, without an opened consumer) carry generation 0,
which is the generation of every name never opened: AWorld-style callers go on as before. Once
a name has been opened they are refused like any other older incarnation, since a plain
claimant could be exactly the stalled process the generation fences out.

Lock order, the same everywhere (so Postgres never deadlocks on it): the buffer's row (only
writes that take it anyway: a training step that sets the policy version or priorities),
then the consumer's row, then consumption entries.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Integer, String, bindparam, select

from ..db.handle import BufferHandle
from ..db.schema import consumers
from ..errors import FencedError

__all__ = ["check_generation", "current_generation", "hold_generation", "next_generation"]

_C = consumers.c


def next_generation(handle: BufferHandle, conn: Connection, consumer: str) -> int:
    """Open a new incarnation of ``consumer`` in the caller's transaction: its generation, one
    above the last (1 for a name never opened). The consumer's row stays locked until the
    transaction ends."""
    insert = handle.dialect.upsert(consumers)
    bumped = conn.execute(
        insert.values(buffer_id=handle.buffer_id, consumer=consumer, last_seq=0, generation=1)
        .on_conflict_do_update(
            index_elements=[_C.buffer_id, _C.consumer], set_={"generation": _C.generation + 1}
        )
        .returning(_C.generation)
    ).scalar_one()
    return int(bumped)


def current_generation(handle: BufferHandle, *, shared: bool = False) -> Any:
    """A scalar subquery: the generation of the consumer bound as ``consumer`` of the buffer
    bound as ``buffer_id`` (NULL for a name without a row), its row locked until the
    transaction ends (``shared``: as claims lock it). For a statement that reads it with
    others (the buffer's row first, which it does not lock: the lock order holds)."""
    dialect = handle.dialect
    lock = dialect.share_locked if shared else dialect.locked
    mine = select(_C.generation).where(
        _C.buffer_id == bindparam("buffer_id", type_=Integer),
        _C.consumer == bindparam("consumer", type_=String),
    )
    return lock(mine).scalar_subquery()


def hold_generation(
    handle: BufferHandle,
    conn: Connection,
    consumer: str,
    generation: int,
    action: str,
    *,
    shared: bool = False,
) -> None:
    """Lock ``consumer``'s row until the caller's transaction ends (``shared``: against
    a new generation only, as claims do) and raise FencedError, changing nothing, unless
    ``generation`` is its current generation (0 for a name never opened). ``action`` says what was
    refused ("ack", "claim", ...)."""
    found = _read_generation(handle, conn, consumer, shared)
    check_generation(handle, conn, consumer, generation, action, found, shared=shared)


def _read_generation(handle: BufferHandle, conn: Connection, consumer: str, shared: bool) -> Any:
    """The consumer's generation, its row locked (None: the name has no row)."""
    key = ("consumer generation", shared)
    stmt = handle.statement(key, lambda: select(current_generation(handle, shared=shared)))
    return stmt.run(conn, buffer_id=handle.buffer_id, consumer=consumer)[0][0]


def check_generation(
    handle: BufferHandle,
    conn: Connection,
    consumer: str,
    generation: int,
    action: str,
    current: Any,
    *,
    shared: bool = False,
) -> None:
    """:func:`hold_generation` once the consumer's generation was read, its row locked (``current``:
    what :func:`current_generation` gave; None: the name has no row yet, which a plain claim
    makes and locks here)."""
    if current is None:
        if generation == 0:
            # A row to hold, so that a consumer opened meanwhile waits for this write (or
            # this write for it) instead of passing it unseen.
            insert = handle.dialect.upsert(consumers).values(
                buffer_id=handle.buffer_id, consumer=consumer, last_seq=0, generation=0
            )
            conn.execute(insert.on_conflict_do_nothing(index_elements=[_C.buffer_id, _C.consumer]))
            current = _read_generation(handle, conn, consumer, shared)
        else:
            current = 0
    if int(current) != generation:
        raise FencedError(_refusal(handle, consumer, generation, int(current), action))


def _refusal(
    handle: BufferHandle, consumer: str, generation: int, current: int, action: str
) -> str:
    if generation == 0:
        return (
            f"consumer {consumer!r} of buffer {handle.name!r} was opened with "
            f"buffer.consumer({consumer!r}) (generation {current}); a {action} without a "
            "generation (buffer.claim(consumer=...), or a claim it made) is refused, since it "
            "could come "
            "from an older incarnation. Claim through the Consumer that buffer.consumer() "
            "returned, or use another consumer name. Nothing was changed"
        )
    if generation > current:
        return (
            f"consumer {consumer!r} of buffer {handle.name!r} is at generation {current}, behind "
            f"this incarnation's generation {generation}: the database was made anew or restored "
            f"since it opened. Its {action} is refused and nothing was changed; open the "
            f"consumer again with buffer.consumer({consumer!r})"
        )
    return (
        f"consumer {consumer!r} of buffer {handle.name!r} was opened again (generation "
        f"{current}) after this incarnation (generation {generation}): its {action} is refused and "
        "nothing was changed. A newer learner owns the name now; stop this one (it was "
        f"preempted or paused), or open buffer.consumer({consumer!r}) again to take over"
    )
