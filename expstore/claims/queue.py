"""Claims: a consume-once work queue over a buffer's rows, kept in the database.

A claim takes rows no other consumer gets while its lease holds; ``ack`` marks them
consumed (with the consumer's checkpoint, in the same transaction), ``release`` returns
them, and a lease that runs out without an ack (the consumer died) returns them by itself.
Claim state lives in ``expstore_consumption`` (see :mod:`expstore.db.schema`), one
narrow row per experience row ever claimed, so claiming never rewrites a payload.

How concurrent claimers stay apart:

- Postgres: candidates are read without locks, then locked with ``FOR NO KEY UPDATE SKIP
  LOCKED`` (claimers pass over each other's rows instead of waiting), and the consumption
  entry is written with an upsert whose ``WHERE`` says the row is still claimable, evaluated
  on the newest committed entry. A row whose claim committed between the read and the lock
  is therefore never taken twice.
- SQLite: the whole claim is one ``BEGIN IMMEDIATE`` transaction (one writer at a time).

Leases are measured by the database's clock, the same for every host.

Every claim, ack, release and renewal first checks, in its own transaction and holding
the consumer's row, that it comes from the consumer's current incarnation (see
:mod:`expstore.claims.generations`: fencing); the consumer's row is always locked
before the claims' entries. On Postgres a FIFO claim, an ack without a checkpoint or
produced rows and a release are each one statement that commits on its own where no
feature needs the transaction: the same checks, as a guard the statement reads before it
locks anything else, and nothing written unless it holds (see :meth:`ClaimQueue._guard`
and :meth:`ClaimQueue._finish_at_once`); where it fails, the transaction finds out why.
An ack in a transaction (a checkpoint, produced rows) sets the entries with one statement
(:meth:`ClaimQueue._finish_statement`) that also counts them to the consumer, deletes their
saved progress, adds the completions to the targets and stores an incarnation's
checkpoint, so its round trips are the transaction's BEGIN, head and COMMIT, that
statement, and those of the rows it stores. An ack that stores rows (``produce``) without
a checkpoint sends all of them in two batches (psycopg's pipeline mode, see
:meth:`ClaimQueue._ack_batched`): two round trips, the target buffer's row taken only by
the last.

FIFO claims do not walk the consumed part of the buffer again on every call: each handle
keeps, per condition, a key below which every matching row has a committed consumption
entry. It may stay there because of the buffer's write order: every write to a buffer locks
the buffer's row first (see :mod:`expstore.lifecycle.registry`), so a buffer's rows commit in
key order and a row committed later always has a greater key (a key is never handed out
twice, on SQLite too: see :class:`~expstore.db.dialects.SqliteDialect`). Rows below
that key that become claimable again (released, or their lease ran out) are found through the
(buffer_id, acked_at, lease_until) index, which holds only a few unacked entries.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, TypeVar

import numpy as np
from sqlalchemy import (
    BigInteger,
    Connection,
    Double,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from .._args import check_checkpoint
from ..db.dialects import Dialect
from ..db.handle import BufferHandle, retried
from ..db.pipeline import Batched, batched, batches
from ..db.schema import (
    buffers,
    checkpoints,
    consumers,
    consumption,
    oldest_first,
    progress,
    ready_groups,
    rows,
)
from ..errors import (
    ClaimFinishedError,
    ClaimOwnerError,
    LeaseExpiredError,
    StorageError,
    UnknownConsumerError,
)
from ..lifecycle.hooks import BufferState, StateChanged, changed_since_read, send_state
from ..lifecycle.reader_state import limited_flag
from ..lifecycle.registry import buffer_row
from ..policy_versions import fresh_clause, oldest_fresh
from ..query import QueryCondition, condition_key
from ..query.conditions import has_changed
from .generations import check_generation, current_generation, hold_generation, next_generation
from .lease_retention import AckRetention
from .prompts import (
    admit,
    admitted,
    completions_added,
    count_completions,
    has_admission,
    needs_of,
    short_of,
)
from .ready_groups import forget_consumed
from .reports import Lineage, QueueStats, checkpoint_value, queue_stats, row_lineage

__all__ = [
    "Acked",
    "ClaimQueue",
    "Claimed",
    "GroupTaker",
    "Lineage",
    "QueueStats",
    "Scope",
    "ShortClaim",
]

_C = consumption.c
_T = TypeVar("_T")
#: A released entry: no claim holds the row, which is claimable again.
_RELEASED: dict[str, Any] = {"claim_id": None, "consumer": None, "lease_until": None}
#: Rounds a sampler-ordered claim draws candidates before it takes claimable rows at random.
_DRAW_ROUNDS = 4


class ShortClaim(Exception):
    """Internal: a claim found fewer rows than it must take at least (rolled back, nothing
    taken); ``args[0]``: how many it found."""


class _StaleFound(Exception):
    """Internal: an ack found the buffer's eviction "stale" after locking the consumer's
    row (rolled back, nothing written): it starts again, locking the buffer's row first."""


class RateLimitFound(Exception):
    """Internal: a claim made as for a buffer without a rate limit found one (rolled back,
    nothing taken): count against it first, then claim again."""


class Acked(NamedTuple):
    """What an ack did: how many rows it acked, the keys of the prompts it released again
    (short of their completion targets), and what its ``produce`` returned besides the
    completions (None: no produce)."""

    acked: int
    short: list[int]
    produced: Any


class Claimed(NamedTuple):
    """What one claim took: its id, its consumer, the rows' keys in claim order, when it
    was taken and its lease ends (database clock, seconds since the epoch), the generation
    of the consumer's incarnation that took it (0: a plain claim; see
    :mod:`expstore.claims.generations`), and the rows as the claim's own statement
    read them (the ``columns`` asked for, in claim order; None: not read)."""

    claim_id: str
    consumer: str
    keys: np.ndarray
    claimed_at: float
    lease_until: float
    generation: int = 0
    rows: list[Sequence[Any]] | None = None


class _GuardFailed(Exception):
    """Internal: a claim's guarded statement took nothing, its guard failing."""


class _Guarded:
    """A claim that commits on its own: the row ``columns`` it reads, the guard's bound
    values, the rows read and the database's clock as its guard row gave it."""

    def __init__(self, columns: Sequence[Any], params: dict[str, Any]) -> None:
        self.columns = columns
        self.params = params
        self.read: list[Sequence[Any]] = []
        self.at = 0.0


#: The database's clock, as a float (a bound value) or as SQL evaluated by the statement.
Now = float | ColumnElement[float]
#: An ack's ``produce(conn, batched transaction or None, the target's state or None)``:
#: the completions it stored per prompt key (None: not said), and its report.
_Produce = Callable[
    [Connection, Batched | None, BufferState | None], tuple[Mapping[int, int] | None, Any]
]


def unblocked(now: Now) -> ColumnElement[bool]:
    """The row of ``expstore_rows`` has no entry that keeps it from being claimed, looked up
    by key for each row the scan passes (a scalar subquery, which neither planner turns
    into a join): walking the buffer in key order, the scan stops after the rows it needs.
    As an outer or anti join, Postgres read every entry of the table first."""
    blocked = (
        select(or_(_C.acked_at.is_not(None), _C.lease_until >= now))
        .where(_C.key == rows.c.key)
        .scalar_subquery()
    )
    return blocked.is_not(true())


def _held_entry(now: Now) -> ColumnElement[bool]:
    """An existing entry that leaves its row claimable: released, or its lease ran out."""
    return and_(_C.acked_at.is_(None), or_(_C.lease_until.is_(None), _C.lease_until < now))


def _claim_values(dialect: Dialect) -> dict[str, Any]:
    """A claim's entry, bound: its ``claim_id`` and ``consumer``, taken now (the database's
    clock) for ``lease_s`` seconds."""
    now = dialect.now()
    return {
        "claim_id": bindparam("claim_id", type_=String),
        "consumer": bindparam("consumer", type_=String),
        "claimed_at": now,
        "lease_until": now + bindparam("lease_s", type_=Double),
    }


def _new_entries(dialect: Dialect) -> Any:
    """Entries for the rows of the bound ``keys`` never claimed (returning key and when);
    DO NOTHING leaves an existing entry unlocked (DO UPDATE would lock it even where its
    WHERE fails, making its ack wait)."""
    values = {**_claim_values(dialect), "buffer_id": bindparam("buffer_id", type_=Integer)}
    return (
        dialect.insert_per_key(consumption, {**values, "times_claimed": 1})
        .on_conflict_do_nothing(index_elements=[_C.key])
        .returning(_C.key, _C.claimed_at)
    )


def _entries_again(dialect: Dialect) -> Any:
    """The entries of the bound ``keys`` that leave their rows claimable (released, or
    their lease ran out) handed to the bound claim (returning key and when)."""
    return (
        update(consumption)
        .where(dialect.key_in(_C.key), _held_entry(dialect.now()))
        .values(**_claim_values(dialect), times_claimed=_C.times_claimed + 1)
        .returning(_C.key, _C.claimed_at)
    )


#: Takes whole groups for a claim: (queue, conn, n rows, now, entry, stamps) -> (keys taken,
#: what to do once the claim has committed) (see :mod:`expstore.claims.group_claims`).
GroupTaker = Callable[
    ["ClaimQueue", Connection, int, Any, dict[str, Any], list[float]],
    tuple[list[int], Callable[[], None]],
]


class Scope(NamedTuple):
    """Which rows a claim or a count is about: those matching ``condition`` and, with
    ``max_staleness``, no more than that many policy versions behind the buffer's current
    one (evaluated by each statement, see :mod:`expstore.policy_versions`)."""

    condition: QueryCondition = None
    max_staleness: int | None = None

    def matching(self, handle: BufferHandle) -> list[ColumnElement[bool]]:
        """The clauses for rows known to be the buffer's."""
        clauses = handle.matching(self.condition)
        if self.max_staleness is not None:
            clauses.append(fresh_clause(handle.buffer_id, self.max_staleness))
        return clauses

    def where(self, handle: BufferHandle) -> list[ColumnElement[bool]]:
        """The clauses for the buffer's rows in scope."""
        return [rows.c.buffer_id == handle.buffer_id, *self.matching(handle)]

    @property
    def key(self) -> str:
        """Equal for equal scopes, to keep floors by."""
        return f"{condition_key(self.condition)}|{self.max_staleness}"


class _Entry(NamedTuple):
    """A claim's consumption entry as an ack, release or renewal finds it."""

    key: int
    consumer: str | None
    acked_at: float | None


def _bound(value: Any) -> bool:
    """Whether a value set on entries is a plain value (bound), not SQL."""
    return not isinstance(value, ColumnElement)


def _setting(names: tuple[str, ...], values: dict[str, Any]) -> dict[Any, Any]:
    """The entries' columns ``names`` set to ``values``: SQL (the database's clock) written
    in, the rest bound as ``v_<name>``."""
    return {
        _C[name]: values[name]
        if not _bound(values[name])
        else bindparam(f"v_{name}", type_=_C[name].type)
        for name in names
    }


def _stored_checkpoint(dialect: Any, buffer_id: Any, consumer: Any, seq: Any) -> Any:
    """A CTE that stores the state bound as ``state`` as ``consumer``'s checkpoint number
    ``seq`` (a column of another CTE), at the database's clock; returns its number."""
    return (
        checkpoints.insert()
        .from_select(
            ["buffer_id", "consumer", "seq", "state", "created_at"],
            select(buffer_id, consumer, seq, bindparam("state", type_=Text), dialect.now()),
        )
        .returning(checkpoints.c.seq)
        .cte("stored")
    )


def _held_ctes(dialect: Any, mine: Any, rows_where: list[Any] | None) -> tuple[Any, Any]:
    """``(kept, held)``: the claim's entries (``mine``) locked in key order, as claims lock
    them; with ``rows_where``, first the rows of the keys bound as ``keys`` (and matching
    it) locked ``FOR KEY SHARE`` in key order (``kept``; the entries' scan waits on the
    count of them, which Postgres evaluates once, before its first row is locked)."""
    kept = None
    if rows_where is not None:
        kept = dialect.key_shared(
            select(rows.c.key).where(*rows_where, dialect.key_in()).order_by(rows.c.key)
        ).cte("kept")
        mine = and_(mine, select(func.count()).select_from(kept).scalar_subquery() >= 0)
    held = (
        select(_C.key, _C.consumer, _C.acked_at)
        .where(mine)
        .order_by(_C.key)
        .with_for_update()
        .cte("held")
    )
    return kept, held


class _Acking(NamedTuple):
    """What the statement that sets an ack's entries also does (Postgres). With
    ``count_acked`` (an ack none of whose rows can be released again), the entries set
    are added to the consumer's ``acked`` count. ``hold_rows``: the claim's keys, whose
    rows it locks against deletion before the entries (see
    :meth:`AckRetention.hold_rows`). ``drop_progress`` (with ``count_acked``): the rows'
    saved progress deleted. ``checkpoint_state`` (with ``count_acked``): stored as the
    consumer's next checkpoint, the entries acked with its number. ``completions`` (with
    ``hold_rows``): the completions stored for each of those keys, added to their
    targets."""

    count_acked: bool
    hold_rows: list[int] | None = None
    drop_progress: bool = False
    checkpoint_state: str | None = None
    completions: list[int] | None = None


class _Floor(NamedTuple):
    """Where a FIFO claim of a scope starts looking, as a handle saw it last."""

    #: Below it every row in scope has a committed consumption entry.
    key: int
    #: The oldest fresh version when it was set (scopes with max_staleness): rows below
    #: the floor come back into scope if the version is forced back below it.
    oldest: int | None


def queue_of(handle: BufferHandle) -> ClaimQueue:
    """The claim queue of ``handle``'s buffer: one per handle, made on first use."""
    return handle.part(ClaimQueue)


class ClaimQueue:
    """The claims of one buffer, as one handle sees them."""

    def __init__(self, handle: BufferHandle) -> None:
        self._handle = handle
        #: Per scope: where a FIFO claim starts (see :class:`_Floor`); set once a claim
        #: has committed.
        self._floors: dict[str, _Floor] = {}
        #: Whether this handle's last ack found the buffer's eviction "stale" (its acks
        #: lock the buffer's row first; see :meth:`_finish`).
        self._stale_seen = False
        #: Whether this handle's last claim in a transaction found an admission bound:
        #: its claims then start with that transaction, not with a guarded statement
        #: whose guard an admission bound fails (a round trip for nothing).
        self._bounded_seen = False
        handle.caches.append(self.clear)

    @property
    def handle(self) -> BufferHandle:
        """The buffer's handle (for a training step's transaction)."""
        return self._handle

    def clear(self) -> None:
        self._floors.clear()

    # -- claiming ------------------------------------------------------------------------
    def claim(
        self,
        n: int,
        scope: Scope,
        consumer: str,
        lease_s: float,
        candidates: Callable[[int], np.ndarray] | None = None,
        groups: GroupTaker | None = None,
        generation: int = 0,
        at_least: int = 0,
        unlimited: bool = False,
        columns: Sequence[Any] | None = None,
    ) -> Claimed:
        """Claim up to ``n`` claimable rows matching the condition: oldest first, or, with
        ``candidates`` (a function giving up to that many keys chosen by a sampler), among
        the keys it chooses. ``generation``: the consumer's incarnation claiming (0: a plain
        claim), FencedError unless it is the consumer's current one. With ``at_least``, a
        claim that finds fewer rows takes none (its transaction rolled back) and raises
        :class:`ShortClaim`. ``unlimited``: the caller counted nothing against a rate limit,
        believing the buffer has none; the claim checks in its transaction (no round trip
        of its own) and, finding one, takes nothing and raises :class:`RateLimitFound`.

        ``columns`` (of ``expstore_rows``): read the rows taken with the claim, where it
        can (:attr:`Claimed.rows`). A FIFO claim of rows with no ``max_staleness``, no
        ``at_least``, of a buffer without a rate limit or an admission bound, by a
        consumer that has claimed before, is then one statement that commits on its own
        (Postgres, see :meth:`_claim_at_once`); a buffer that does not use those features
        pays nothing for them."""
        handle = self._handle
        claim_id = uuid.uuid4().hex
        if (
            columns is not None
            and handle.dialect.modifying_ctes
            and candidates is None
            and groups is None
            and not at_least
            and unlimited
            and scope.max_staleness is None
            and not self._bounded_seen
        ):
            fast = self._claim_at_once(n, scope, consumer, lease_s, generation, claim_id, columns)
            if fast is not None:
                return fast
        now = handle.dialect.now()  # evaluated by each statement: no round trip of its own

        def write() -> tuple[list[int], float, dict[str, _Floor], list[Callable[[], None]]]:
            """One attempt: the keys, when, the FIFO floor the claim moves once committed
            and what a group taker does then."""
            floors: dict[str, _Floor] = {}
            committed: list[Callable[[], None]] = []
            with handle.errors("claim rows"), handle.write() as conn:
                # One statement: still the handle's buffer, whether it has a rate limit
                # and an admission bound, and the consumer's generation (its row held shared).
                limited, current, bounded = self._claim_head(conn, consumer)
                self._bounded_seen = bounded
                if unlimited and limited:  # a limit set since the caller looked
                    raise RateLimitFound  # rolls the transaction back
                check_generation(handle, conn, consumer, generation, "claim", current, shared=True)
                # The claim's entries: taken now (the database's clock), for lease_s.
                entry = {"claim_id": claim_id, "consumer": consumer, "lease_s": lease_s}
                stamps: list[float] = []  # when the entries were written, by the database
                # A prompt queue's admission bound: its row held until the claim commits.
                admission = admit(handle, conn, now, bounded=bounded)
                want = n
                if admission is not None and admission.capacity is not None:
                    want = min(n, admission.capacity)  # every row needs one at least
                if groups is not None:
                    keys, then = groups(self, conn, want, now, entry, stamps)
                    committed.append(then)
                elif candidates is None:
                    keys = self._claim_oldest(
                        conn, want, scope, now, entry, stamps, floors, lease_s
                    )
                else:
                    keys = self._claim_drawn(conn, want, scope, now, entry, stamps, candidates)
                if admission is not None:
                    keys, over = admitted(handle, conn, keys, admission)
                    self.give_back(conn, over, claim_id)
                if len(keys) < at_least:
                    raise ShortClaim(len(keys))  # rolls the transaction back
                at = stamps[0] if stamps else float(conn.execute(select(now)).scalar_one())
            return keys, at, floors, committed

        # A deadlock with an ack or another claim (Postgres) rolls it back: claim again.
        keys, at, floors, committed = retried(write)
        self._floors.update(floors)
        for then in committed:
            then()
        keys_ = np.asarray(keys, dtype=np.int64)
        return Claimed(claim_id, consumer, keys_, at, at + lease_s, generation)

    def _claim_head(self, conn: Connection, consumer: str) -> tuple[bool, Any, bool]:
        """A claim's first statement: checks the buffer's row is still the handle's
        buffer; returns whether the buffer has a rate limit, the consumer's generation (None: no
        row yet), its row locked shared until the transaction ends, and whether the buffer
        has an admission bound. Compiled once per handle."""
        handle = self._handle

        def build() -> Any:
            buffer_id = bindparam("buffer_id", type_=Integer)
            return select(
                buffers.c.name,
                buffers.c.created_at,
                limited_flag(buffer_id),
                current_generation(handle, shared=True),
                has_admission(buffer_id),
            ).where(buffers.c.id == buffer_id)

        found = handle.statement(("claim head",), build).run(
            conn, buffer_id=handle.buffer_id, consumer=consumer
        )
        if not found:
            raise handle.recreated(None)
        name, created_at, limited, current, bounded = found[0]
        handle.check_row(name, float(created_at))
        return bool(limited), current, bool(bounded)

    def _take(
        self,
        conn: Connection,
        keys: list[int],
        entry: dict[str, Any],
        stamps: list[float],
    ) -> list[int]:
        """Lock the rows of ``keys`` no other transaction holds and write this claim's
        entries for those still claimable; returns the keys taken, in the given order."""
        taken = set(self.enter(conn, self.lock_free(conn, keys), entry, stamps))
        return [k for k in keys if k in taken]

    def lock_free(self, conn: Connection, keys: list[int]) -> list[int]:
        """Lock the rows of ``keys`` that no other transaction holds and that are claimable
        by this statement's snapshot; returns their keys."""
        if not keys:
            return []
        handle = self._handle
        dialect = handle.dialect
        # Still claimable by this statement's snapshot: a claim that committed since the
        # candidates were read is passed over here, not met in the upsert (which would lock
        # its entries and make its ack wait for this transaction).
        locked = handle.statement(
            ("lock free",),
            lambda: dialect.skip_locked(
                select(rows.c.key).where(dialect.key_in(), unblocked(dialect.now()))
            ),
        )
        return [int(k) for (k,) in locked.run(conn, keys=dialect.key_set(keys))]

    def enter(
        self, conn: Connection, free: list[int], entry: dict[str, Any], stamps: list[float]
    ) -> list[int]:
        """Write this claim's entries (``entry``: its ``claim_id``, ``consumer`` and
        ``lease_s``) for the locked rows ``free`` still claimable, taken now by the
        database's clock; returns the keys entered."""
        if not free:
            return []
        handle = self._handle
        dialect = handle.dialect
        params = {
            "claim_id": entry["claim_id"],
            "consumer": entry["consumer"],
            "lease_s": float(entry["lease_s"]),
            "buffer_id": handle.buffer_id,
        }
        new = handle.statement(("enter new",), partial(_new_entries, dialect))
        returned = list(new.run(conn, keys=dialect.key_set(free), **params))
        entered = {int(k) for k, _ in returned}
        again = [k for k in free if k not in entered]
        if again:  # rows released, or whose lease ran out: their entry changes hands
            reclaim = handle.statement(("enter again",), partial(_entries_again, dialect))
            params.pop("buffer_id")
            returned += reclaim.run(conn, keys=dialect.key_set(again), **params)
        if returned:
            stamps.append(float(returned[0][1]))
        return [int(k) for k, _ in returned]

    def give_back(self, conn: Connection, keys: list[int], claim_id: str) -> None:
        """Release this claim's entries of ``keys`` inside its own transaction (a group
        that could only be claimed in part)."""
        if keys:
            dialect = self._handle.dialect
            conn.execute(
                update(consumption)
                .where(dialect.key_in(_C.key), _C.claim_id == claim_id)
                .values(**_RELEASED),
                {"keys": dialect.key_set(keys)},
            )

    def _claim_oldest(
        self,
        conn: Connection,
        n: int,
        scope: Scope,
        now: Now,
        entry: dict[str, Any],
        stamps: list[float],
        floors: dict[str, _Floor],
        lease_s: float,
    ) -> list[int]:
        handle = self._handle
        if handle.dialect.modifying_ctes:
            return self._claim_oldest_at_once(conn, n, scope, entry, stamps, floors, lease_s)
        where = scope.where(handle)
        floor_key = scope.key
        oldest = self._oldest(conn, scope)
        start = self._start(conn, scope, oldest)
        taken: list[int] = []
        floor: int | None = None
        scan_from = start
        while len(taken) < n:
            want = n - len(taken)
            scan = (
                oldest_first(select(rows.c.key), handle.buffer_id)
                .where(*where, rows.c.key >= scan_from, unblocked(now))
                .limit(want)
            )
            found = [int(k) for k in conn.execute(scan).scalars()]
            got = self._take(conn, found, entry, stamps)
            taken.extend(got)
            if floor is None and len(got) < len(found):
                # Held by a claimer still in its transaction (or taken since our read):
                # the floor stays below it until its entry commits.
                floor = min(set(found) - set(got))
            if found:
                scan_from = found[-1] + 1
            if len(found) < want:
                break
        floors[floor_key] = _Floor(scan_from if floor is None else floor, oldest)
        return taken

    def _claim_oldest_at_once(
        self,
        conn: Connection,
        n: int,
        scope: Scope,
        entry: dict[str, Any],
        stamps: list[float],
        floors: dict[str, _Floor],
        lease_s: float,
        guarded: _Guarded | None = None,
    ) -> list[int]:
        """:meth:`_claim_oldest` where one statement may write in its WITH clause
        (Postgres): each round is one statement (see :meth:`_oldest_statement`) that
        finds where to start, reads the candidates, locks those no other transaction
        holds and writes their entries. The same steps as the statements of
        :meth:`_claim_oldest` (the same floor, the same candidates, the same locks and
        the same upsert whose WHERE is evaluated on the newest committed entry), in one
        snapshot: a row whose claim committed after it was taken is met by the insert's
        conflict, and passed over.

        ``guarded``: each round commits on its own (``conn`` is in autocommit), takes rows
        only while the guard holds (see :meth:`_guard`) and reads the rows it takes;
        :class:`_GuardFailed` if it failed at the first round (nothing taken), and the
        rows taken so far if at a later one."""
        oldest = self._oldest(conn, scope)
        floor = self._floors.get(scope.key)
        start = 0 if floor is None else floor.key
        if floor is not None and oldest is not None:
            if floor.oldest is None or oldest < floor.oldest:
                start = 0  # the version forced back: every row may be in scope again
        reopen = start > 0
        if has_changed(scope.condition):
            # The tracked paths read now, as compiling the condition would: statements
            # compiled with a path's old slot (another process untracked it, and its slot
            # went to another path) are dropped before this one is taken.
            self._handle.tracked_paths()
        columns = None if guarded is None else guarded.columns
        params = {} if guarded is None else guarded.params
        taken: list[int] = []
        held: int | None = None
        rounds = 0
        while len(taken) < n:
            want = n - len(taken)
            statement = self._oldest_statement(scope, reopen, columns)
            found: list[int] = []
            got: set[int] = set()
            ok = True
            bound = {
                "start": start,
                "want": want,
                "claim_id": entry["claim_id"],
                "consumer": entry["consumer"],
                "lease_s": lease_s,
                **params,
            }
            if guarded is None:
                result = statement.run(conn, **bound)
            else:  # a round that commits on its own, rolled back alone by a deadlock
                result = retried(partial(self._run_alone, conn, statement, bound))
            for key, at, kind, *read in result:
                if kind == 0:
                    found.append(int(key))
                elif kind == 3:
                    start = int(key)  # lowered where rows below the floor came back
                elif kind == 4:
                    ok = bool(key)
                    guarded.at = float(at)  # type: ignore[union-attr]
                else:
                    got.add(int(key))
                    stamps.append(float(at))
                    if guarded is not None:
                        guarded.read.append(read)
            rounds += 1
            if not ok:
                if rounds == 1:
                    raise _GuardFailed
                break  # the rows taken so far committed: the claim is those
            found.sort()
            taken.extend(k for k in found if k in got)
            if held is None and len(got) < len(found):
                # Held by a claimer still in its transaction (or taken since our read):
                # the floor stays below it until its entry commits.
                held = min(set(found) - got)
            reopen = False
            if found:
                start = found[-1] + 1
            if len(found) < want:
                break
        floors[scope.key] = _Floor(start if held is None else held, oldest)
        return taken

    def _run_alone(self, conn: Connection, statement: Any, bound: dict[str, Any]) -> Any:
        with self._handle.errors("claim rows"):
            return statement.run(conn, **bound)

    def _claim_at_once(
        self,
        n: int,
        scope: Scope,
        consumer: str,
        lease_s: float,
        generation: int,
        claim_id: str,
        columns: Sequence[Any],
    ) -> Claimed | None:
        """A FIFO claim as statements that commit on their own (one, unless other claimers
        hold the rows it meets), each taking rows only while :meth:`_guard` holds, and
        reading the rows it takes (``columns``): no BEGIN, no first statement, no COMMIT,
        no fetch of its own. None where the guard failed at once (nothing taken): the claim
        is then made in a transaction (:meth:`claim`), which finds out why."""
        handle = self._handle
        guarded = _Guarded(
            columns,
            {
                "buffer_id": handle.buffer_id,
                "name": handle.name,
                "created_at": handle.created_at,
                "generation": generation,
            },
        )
        entry = {"claim_id": claim_id, "consumer": consumer}
        stamps: list[float] = []
        floors: dict[str, _Floor] = {}

        try:
            with handle.errors("claim rows"), handle.single() as conn:
                keys = self._claim_oldest_at_once(
                    conn, n, scope, entry, stamps, floors, lease_s, guarded
                )
        except _GuardFailed:
            return None
        self._floors.update(floors)
        at = stamps[0] if stamps else guarded.at
        by_key = {int(r[0]): r for r in guarded.read}
        return Claimed(
            claim_id,
            consumer,
            np.asarray(keys, dtype=np.int64),
            at,
            at + lease_s,
            generation,
            [by_key[k] for k in keys],
        )

    def _oldest_statement(
        self, scope: Scope, reopen: bool, columns: Sequence[Any] | None = None
    ) -> Any:
        """One round of a FIFO claim as one statement, compiled once per handle and scope
        (``reopen``: the round starts at the handle's floor, lowered to the smallest key
        below it whose row came back, released or its lease run out). Its rows: ``(key,
        NULL, 0)`` per candidate, ``(key, claimed_at, 1 or 2)`` per row taken (a new entry,
        an entry that changed hands), ``(start, NULL, 3)`` where it started.

        With ``columns`` (of ``expstore_rows``), the statement of a claim that commits on
        its own (see :meth:`_claim_at_once`): it takes rows only if :meth:`_guard` holds
        (its row ``(1 or 0, NULL, 4)`` says whether it did), and each row is followed by
        ``columns`` of the row taken (NULL for the other kinds)."""
        handle = self._handle

        def build() -> Any:
            dialect = handle.dialect
            now = dialect.now()
            guard = None if columns is None else self._guard().cte("guard")
            start: Any = bindparam("start", type_=BigInteger)
            lease_until = now + bindparam("lease_s", type_=Double)
            claim_id = bindparam("claim_id", type_=String)
            consumer = bindparam("consumer", type_=String)
            if reopen:
                # The few unacked entries below the floor, through the (buffer_id,
                # acked_at, lease_until) index, whose rows match the condition.
                below = (
                    select(func.min(rows.c.key))
                    .select_from(consumption.join(rows, rows.c.key == _C.key))
                    .where(
                        _C.buffer_id == handle.buffer_id,
                        _held_entry(now),
                        _C.key < start,
                        *scope.matching(handle),
                    )
                    .correlate(None)
                    .scalar_subquery()
                )
                start = func.least(start, below)
            begin = select(start.label("start")).cte("begin")
            # The guard's one row is read before any candidate (the consumer's row locked
            # first, as in the lock order); no candidate at all where it fails.
            allowed = [] if guard is None else [select(guard.c.ok).scalar_subquery()]
            candidates = (
                oldest_first(select(rows.c.key), handle.buffer_id)
                .where(
                    *allowed,
                    *scope.where(handle),
                    rows.c.key >= select(begin.c.start).scalar_subquery(),
                    unblocked(now),
                )
                .limit(bindparam("want", type_=Integer))
                .cte("candidates")
            )
            # Still claimable by this statement's snapshot, and not held by another.
            free = dialect.skip_locked(
                select(rows.c.key).where(rows.c.key.in_(select(candidates.c.key)), unblocked(now))
            ).cte("free")
            # Rows never claimed get an entry; DO NOTHING leaves an existing entry unlocked.
            new = (
                dialect.upsert(consumption)
                .from_select(
                    [
                        "key",
                        "buffer_id",
                        "claim_id",
                        "consumer",
                        "claimed_at",
                        "lease_until",
                        "times_claimed",
                    ],
                    select(
                        free.c.key,
                        literal(handle.buffer_id),
                        claim_id,
                        consumer,
                        now,
                        lease_until,
                        literal(1),
                    ),
                )
                .on_conflict_do_nothing(index_elements=[_C.key])
                .returning(_C.key, _C.claimed_at)
                .cte("new")
            )
            # Rows released, or whose lease ran out: their entry changes hands.
            again = (
                update(consumption)
                .where(_C.key.in_(select(free.c.key)), _held_entry(now))
                .values(
                    {
                        _C.claim_id: claim_id,
                        _C.consumer: consumer,
                        _C.claimed_at: now,
                        _C.lease_until: lease_until,
                        _C.times_claimed: _C.times_claimed + 1,
                    }
                )
                .returning(_C.key, _C.claimed_at)
                .cte("again")
            )
            nothing = cast(null(), Double)
            parts = [
                select(
                    candidates.c.key.label("key"), nothing.label("at"), literal(0).label("kind")
                ),
                select(new.c.key, new.c.claimed_at, literal(1)),
                select(again.c.key, again.c.claimed_at, literal(2)),
                select(begin.c.start, nothing, literal(3)),
            ]
            if guard is None or columns is None:
                return union_all(*parts)
            ok = case((guard.c.ok, literal(1, BigInteger)), else_=literal(0, BigInteger))
            found = union_all(*parts, select(ok, now, literal(4))).subquery("found")
            # The rows taken, read by the same statement (its snapshot holds them).
            taken = and_(rows.c.key == found.c.key, found.c.kind.between(1, 2))
            return select(found.c.key, found.c.at, found.c.kind, *columns).select_from(
                found.outerjoin(rows, taken)
            )

        shape = None if columns is None else tuple(str(c) for c in columns)
        return handle.statement(("claim oldest", scope.key, reopen, shape), build)

    def _guard(self) -> Any:
        """What a claim that commits on its own (:meth:`_claim_at_once`) checks, as a
        SELECT of one row, ``ok``: the buffer's row is still the handle's (its name and
        ``created_at``, bound as ``name`` and ``created_at``), the buffer has no rate limit
        and no admission bound, and the consumer bound as ``consumer`` is at the generation
        bound as ``generation`` (its row held shared until the statement ends, as a claim's
        transaction holds it). Where any fails the claim takes nothing: its transaction
        finds out which, and acts on it."""
        handle = self._handle
        buffer_id = bindparam("buffer_id", type_=Integer)
        same = (
            select(buffers.c.id)
            .where(
                buffers.c.id == buffer_id,
                buffers.c.name == bindparam("name", type_=String),
                buffers.c.created_at == bindparam("created_at", type_=Double),
            )
            .exists()
        )
        generation = func.coalesce(current_generation(handle, shared=True), -1)
        return select(
            and_(
                same,
                limited_flag(buffer_id) == 0,
                ~has_admission(buffer_id),
                generation == bindparam("generation", type_=Integer),
            ).label("ok")
        )

    def _oldest(self, conn: Connection, scope: Scope) -> int | None:
        """The oldest fresh version of a scope with max_staleness now (-1 while the buffer
        has no version: every row fresh); None without max_staleness."""
        if scope.max_staleness is None:
            return None
        this = buffers.c.id == self._handle.buffer_id
        current = conn.execute(select(buffers.c.policy_version).where(this)).scalar_one()
        oldest = oldest_fresh(None if current is None else int(current), scope.max_staleness)
        return -1 if oldest is None else oldest

    def _start(self, conn: Connection, scope: Scope, oldest: int | None) -> int:
        """Where a FIFO scan for the condition starts: this handle's floor for it, or lower
        where a row below it became claimable again (released, lease ran out) or came
        back into scope (the version forced back below where it was)."""
        handle = self._handle
        floor = self._floors.get(scope.key)
        if floor is None or not floor.key:
            return 0
        if oldest is not None and (floor.oldest is None or oldest < floor.oldest):
            return 0
        start = floor.key
        # The few unacked entries below the floor, through the (buffer_id, acked_at,
        # lease_until) index; then which of their rows match the condition.
        reopened = handle.statement(
            ("reopened below",),
            lambda: select(_C.key).where(
                _C.buffer_id == bindparam("buffer_id", type_=Integer),
                _held_entry(handle.dialect.now()),
                _C.key < bindparam("start", type_=BigInteger),
            ),
        )
        found_keys = reopened.run(conn, buffer_id=handle.buffer_id, start=start)
        keys = [int(k) for (k,) in found_keys]
        if not keys:
            return start
        # By key alone (the keys are the buffer's): with buffer_id too, Postgres walks the
        # buffer's (buffer_id, key) index filtering by the key list.
        matching = select(rows.c.key).where(*scope.matching(handle), handle.dialect.key_in())
        found = list(conn.execute(matching, {"keys": handle.dialect.key_set(keys)}).scalars())
        return int(min([start, *found]))

    def _claim_drawn(
        self,
        conn: Connection,
        n: int,
        scope: Scope,
        now: Now,
        entry: dict[str, Any],
        stamps: list[float],
        candidates: Callable[[int], np.ndarray],
    ) -> list[int]:
        handle = self._handle
        where = scope.where(handle)
        taken: list[int] = []
        seen: set[int] = set()
        for _ in range(_DRAW_ROUNDS):
            want = n - len(taken)
            if want <= 0:
                break
            fresh = dict.fromkeys(int(k) for k in candidates(2 * want))
            drawn = [k for k in fresh if k not in seen]
            seen.update(drawn)
            if not drawn:
                continue
            open_ = set(
                conn.execute(
                    select(rows.c.key).where(*where, rows.c.key.in_(drawn), unblocked(now))
                ).scalars()
            )
            open_drawn = [k for k in drawn if k in open_][:want]
            taken.extend(self._take(conn, open_drawn, entry, stamps))
        if len(taken) < n:
            # Few claimable rows left among those the sampler draws: the rest at random
            # among every claimable row.
            rest = (
                select(rows.c.key)
                .where(*where, unblocked(now), rows.c.key.not_in(taken or [-1]))
                .order_by(func.random())
                .limit(n - len(taken))
            )
            chosen = [int(k) for k in conn.execute(rest).scalars()]
            taken.extend(self._take(conn, chosen, entry, stamps))
        return taken

    # -- finishing -----------------------------------------------------------------------
    def _own_entries(self, conn: Connection, claim: Claimed, action: str) -> list[Any]:
        """The claim's entries, locked; the typed error when they are not the claim's to
        finish any more."""
        handle = self._handle

        def build() -> Any:
            mine = select(_C.key, _C.consumer, _C.acked_at).where(
                _C.claim_id == bindparam("claim_id", type_=String)
            )
            # Locked in key order, as claims lock them (else the two can deadlock on
            # Postgres).
            return handle.dialect.locked(mine.order_by(_C.key))

        statement = handle.statement(("own entries",), build)
        found = statement.run(conn, claim_id=claim.claim_id)
        held = [_Entry(int(k), c, a) for k, c, a in found]
        self._check_own(conn, claim, action, held)
        return held

    def _check_own(self, conn: Connection, claim: Claimed, action: str, held: list[Any]) -> None:
        """The typed error when the claim's entries ``held`` (locked) are not the claim's
        to finish any more."""
        handle = self._handle
        if any(e.consumer != claim.consumer for e in held):
            raise ClaimOwnerError(
                f"claim {claim.claim_id} belongs to consumer {held[0].consumer!r}, not "
                f"{claim.consumer!r}; {action} it as that consumer. Nothing was changed"
            )
        if any(e.acked_at is not None for e in held):
            raise ClaimFinishedError(
                f"claim {claim.claim_id} was already acked; nothing was changed"
            )
        missing = sorted(set(claim.keys.tolist()) - {int(e.key) for e in held})
        reclaimed = 0
        if missing:
            others = select(func.count()).where(handle.dialect.key_in(_C.key))
            bound = {"keys": handle.dialect.key_set(missing)}
            reclaimed = int(conn.execute(others, bound).scalar_one())
        if reclaimed:
            raise LeaseExpiredError(
                f"claim {claim.claim_id}'s lease ran out and {reclaimed} of its "
                f"{len(claim.keys)} rows were claimed again (or released) since; another "
                f"consumer has them now. Nothing was changed; {action} a new claim, and use "
                "a longer lease_s (or claim.renew()) for work that takes longer"
            )

    def _finish(
        self,
        claim: Claimed,
        action: str,
        body: Callable[[Connection], _T],
        retention: AckRetention | None = None,
        *,
        entries: bool = False,
    ) -> _T:
        """``body(conn)`` in a transaction of its own, once the claim's incarnation is
        found to be its consumer's current one (holding the consumer's row). ``retention``:
        an ack's (see :mod:`expstore.claims.lease_retention`), whose buffer lock comes
        first, as writers take it. ``entries``: the claim's entries are also locked and
        found to be the claim's to finish before ``body`` runs (an ack that stores rows:
        one retried after its commit is told so before its rows meet their stored ids)."""
        handle = self._handle

        def write() -> _T:
            with handle.errors(f"{action} a claim"), handle.write() as conn:
                if retention is not None and self._stale_seen:
                    retention.hold_buffer(conn)  # the buffer's row locked: the ack may evict
                    self._stale_seen = retention.stale
                    hold_generation(handle, conn, claim.consumer, claim.generation, action)
                    if entries:
                        self._own_entries(conn, claim, action)
                else:
                    # One statement: still the handle's buffer (and what the ack clears),
                    # and the consumer's generation, its row locked (then, with ``entries``,
                    # the claim's entries). The buffer's row is not locked: an ack that
                    # finds it may evict starts again, locking it first (the lock order:
                    # the buffer's row, then the consumer's).
                    current, held = self._finish_head(
                        conn, claim.consumer, retention, claim.claim_id if entries else None
                    )
                    if retention is not None and retention.stale:
                        self._stale_seen = True
                        raise _StaleFound  # rolled back before anything was written
                    check_generation(
                        handle, conn, claim.consumer, claim.generation, action, current
                    )
                    if held is not None:
                        self._check_own(conn, claim, action, held)
                    elif entries:  # (SQLite) by a statement of their own
                        self._own_entries(conn, claim, action)
                return body(conn)

        def again() -> _T:
            try:
                return write()
            except _StaleFound:
                return write()

        # A deadlock with a claim taking the rows over (Postgres) rolls it back: again.
        return retried(again)

    def _finish_at_once(
        self, claim: Claimed, action: str, values: dict[str, Any], *, acking: bool
    ) -> bool:
        """Set ``values`` on every entry of ``claim`` by one statement that commits on its
        own (Postgres; see :meth:`_at_once_statement`), where nothing needs the ack's or
        release's transaction: the buffer's row is still the handle's, the consumer is at
        the claim's generation, and every entry is the claim's, none acked; for an ack also
        every row still stored, the buffer's eviction not ``"stale"`` and none of the rows
        the first of a ready group (its saved progress goes in the same statement, and the
        rows are counted to the consumer). Returns whether it did; where it did not it
        changed nothing, and the transaction of :meth:`_finish` finds out why."""
        handle = self._handle
        keys = sorted({int(k) for k in claim.keys.tolist()})
        if not handle.dialect.modifying_ctes or not keys:
            return False
        names = tuple(sorted(values))
        statement = self._at_once_statement(names, values, acking)
        params = {f"v_{name}": value for name, value in values.items() if _bound(value)}

        def run() -> int:
            with handle.errors(f"{action} a claim"), handle.single() as conn:
                found = statement.run(
                    conn,
                    buffer_id=handle.buffer_id,
                    name=handle.name,
                    created_at=handle.created_at,
                    consumer=claim.consumer,
                    generation=claim.generation,
                    claim_id=claim.claim_id,
                    keys=handle.dialect.key_set(keys),
                    n=len(keys),
                    **params,
                )
            return int(found[0][0])

        # A deadlock with a claim taking the rows over rolls it back: again.
        return retried(run) == len(keys)

    def _at_once_statement(
        self, names: tuple[str, ...], values: dict[str, Any], acking: bool
    ) -> Any:
        """The statement of :meth:`_finish_at_once`, compiled once per handle and shape.
        Its locks are taken in the order of :meth:`_finish`'s: the consumer's row (by the
        guard, read before anything else), then for an ack the claim's rows ``FOR KEY
        SHARE``, then the entries; it writes only if every check holds. Its one row: how
        many entries it set."""
        handle = self._handle

        def build() -> Any:
            dialect = handle.dialect
            buffer_id = bindparam("buffer_id", type_=Integer)
            claim_id = bindparam("claim_id", type_=String)
            consumer = bindparam("consumer", type_=String)
            n = bindparam("n", type_=Integer)
            same = [
                buffers.c.id == buffer_id,
                buffers.c.name == bindparam("name", type_=String),
                buffers.c.created_at == bindparam("created_at", type_=Double),
            ]
            checks = []
            if acking:  # nothing of retention, progress kept or ready groups to settle
                same.append(buffers.c.eviction.is_distinct_from("stale"))
                checks.append(
                    ~select(ready_groups.c.first_key)
                    .where(dialect.key_in(ready_groups.c.first_key))
                    .exists()
                )
            generation = func.coalesce(current_generation(handle), -1)
            guard = select(
                and_(
                    select(buffers.c.id).where(*same).exists(),
                    *checks,
                    generation == bindparam("generation", type_=Integer),
                ).label("ok")
            ).cte("guard")
            ok = select(guard.c.ok).scalar_subquery()
            mine = and_(_C.claim_id == claim_id, ok)
            # For an ack the rows held against deletion before their entries.
            kept, held = _held_ctes(dialect, mine, [ok] if acking else None)
            wrong = or_(held.c.consumer != consumer, held.c.acked_at.is_not(None))
            fine = [
                func.count() == n,
                func.count().filter(wrong) == 0,
            ]
            if kept is not None:
                fine.append(select(func.count()).select_from(kept).scalar_subquery() == n)
            verdict = select(and_(*fine).label("yes")).select_from(held).cte("verdict")
            yes = select(verdict.c.yes).scalar_subquery()
            setting = _setting(names, values)
            done = (
                update(consumption)
                .where(_C.claim_id == claim_id, yes)
                .values(setting)
                .returning(_C.key)
                .cte("done")
            )
            stmt = select(func.count()).select_from(done)
            if acking:
                counted = (
                    update(consumers)
                    .where(
                        consumers.c.buffer_id == buffer_id,
                        consumers.c.consumer == consumer,
                        yes,
                    )
                    .values(
                        acked=consumers.c.acked
                        + select(func.count()).select_from(done).scalar_subquery()
                    )
                    .returning(consumers.c.acked)
                    .cte("counted")
                )
                # The work is done: its saved progress goes.
                saved = (
                    delete(progress)
                    .where(dialect.key_in(progress.c.key), yes)
                    .returning(progress.c.key)
                    .cte("saved")
                )
                stmt = stmt.add_cte(counted).add_cte(saved)
            return stmt

        return handle.statement(("finish at once", names, acking), build)

    def _finish_head(
        self,
        conn: Connection,
        consumer: str,
        retention: AckRetention | None,
        claim_id: str | None = None,
    ) -> tuple[Any, list[_Entry] | None]:
        """:meth:`_send_finish_head`, its result read at once."""
        return self._send_finish_head(conn, consumer, retention, claim_id)()

    def _send_finish_head(
        self,
        conn: Connection,
        consumer: str,
        retention: AckRetention | None,
        claim_id: str | None = None,
    ) -> Callable[[], tuple[Any, list[_Entry] | None]]:
        """The first statement of an ack, release or renewal: checks the buffer's row is
        still the handle's buffer, reads what an ack's ``retention`` needs of it, and
        returns the consumer's generation (None: no row yet), its row locked until the
        transaction ends. With ``claim_id`` (Postgres), the same statement then locks the
        claim's entries in key order and returns them too (else None). Compiled once per
        handle and shape. Sent now; what it returns is read (and checked) by the call of
        the function returned."""
        handle = self._handle
        extra = () if retention is None else retention.columns()
        with_entries = claim_id is not None and handle.dialect.modifying_ctes

        def build() -> Any:
            buffer_id = bindparam("buffer_id", type_=Integer)
            head = select(
                buffers.c.name, buffers.c.created_at, *extra, current_generation(handle)
            ).where(buffers.c.id == buffer_id)
            if not with_entries:
                return head
            first = head.cte("head")
            # Joined to the head's row, so the consumer's row is locked (by the head)
            # before any entry is (the entries are locked above the sort, in key order).
            held = (
                select(_C.key, _C.consumer, _C.acked_at)
                .select_from(consumption.join(first, true()))
                .where(_C.claim_id == bindparam("claim_id", type_=String))
                .order_by(_C.key)
                .with_for_update(of=consumption)
                .cte("held")
            )
            return (
                select(first, held.c.key, held.c.consumer, held.c.acked_at)
                .select_from(first.outerjoin(held, true()))
                .order_by(held.c.key)
            )

        params: dict[str, Any] = {"buffer_id": handle.buffer_id, "consumer": consumer}
        if retention is not None:
            params["keys"] = retention.handle_keys()
        if with_entries:
            params["claim_id"] = claim_id
        key = ("finish head", retention is not None, with_entries)
        sent = handle.statement(key, build).send(conn, **params)

        def read() -> tuple[Any, list[_Entry] | None]:
            found = sent.rows()
            if not found:
                raise handle.recreated(None)
            held: list[_Entry] | None = None
            if with_entries:
                held = [_Entry(int(r[-3]), r[-2], r[-1]) for r in found if r[-3] is not None]
                found = [r[:-3] for r in found]
            name, created_at, *values, current = found[0]
            handle.check_row(name, float(created_at))
            if retention is not None:
                retention.take(tuple(values))
            return current, held

        return read

    def finish_in(
        self, conn: Connection, claim: Claimed, action: str, values: dict[str, Any]
    ) -> int:
        """In the caller's transaction (which holds the consumer's row, its generation checked):
        check the claim is the consumer's to ``action``, then set ``values`` on its
        entries; returns how many."""
        return self._finish_entries(conn, claim, action, values)()[0]

    def _finish_entries(
        self,
        conn: Connection,
        claim: Claimed,
        action: str,
        values: dict[str, Any],
        acking: _Acking | None = None,
    ) -> Callable[[], tuple[int, bool, dict[int, int] | None]]:
        """:meth:`finish_in`, for an ack with what ``acking`` says (see :class:`_Acking`);
        on Postgres its statement is sent now and read (the entries checked) by the call
        of the function returned, which returns how many entries, whether they were
        counted as acked by the same statement (and then their saved progress deleted,
        with ``drop_progress``), and, with ``completions``, what the targets needed
        before (key -> completions; else None)."""
        if not self._handle.dialect.modifying_ctes:
            held = self._own_entries(conn, claim, action)
            if held:
                stmt = update(consumption).where(_C.claim_id == claim.claim_id).values(**values)
                conn.execute(stmt)
            return lambda: (len(held), False, None)
        count_acked, hold_rows, drop_progress, checkpoint_state, completions = acking or _Acking(
            False
        )
        # One statement: the entries locked in key order (as claims lock them), checked
        # below; set only when all are the consumer's and none acked (the check raises,
        # rolling the transaction back, otherwise).
        rows_too = hold_rows is not None
        checkpoint = checkpoint_state is not None and count_acked
        counting = completions is not None and rows_too
        statement = self._finish_statement(
            tuple(sorted(values)),
            values,
            count_acked,
            rows_too,
            drop_progress and rows_too,
            checkpoint,
            counting,
        )
        params = {f"v_{name}": value for name, value in values.items() if _bound(value)}
        if checkpoint:
            params["state"] = checkpoint_state
        if hold_rows is not None:
            params["keys"] = self._handle.dialect.key_set(hold_rows)
        if counting:
            assert hold_rows is not None and completions is not None
            params.update(self._handle.dialect.key_value_params(hold_rows, completions))
        sent = statement.send(
            conn,
            claim_id=claim.claim_id,
            consumer=claim.consumer,
            buffer_id=self._handle.buffer_id,
            **params,
        )

        def read() -> tuple[int, bool, dict[int, int] | None]:
            found = sent.rows()
            left: dict[int, int] | None = None
            if not counting:
                held = [_Entry(int(k), c, a) for k, c, a in found]
            else:  # the entries (need NULL), then the targets as they were
                held = [_Entry(int(k), c, a) for k, c, a, need in found if need is None]
                left = {int(k): int(need) for k, _, _, need in found if need is not None}
            self._check_own(conn, claim, action, held)
            return len(held), count_acked, left

        return read

    def _finish_statement(
        self,
        names: tuple[str, ...],
        values: dict[str, Any],
        count_acked: bool,
        rows_too: bool,
        drop_progress: bool = False,
        checkpoint: bool = False,
        counting: bool = False,
    ) -> Any:
        """The statement of :meth:`_finish_entries` on Postgres, compiled once per handle
        and shape: ``values`` that are SQL (the database's clock) are written in, the rest
        bound as ``v_<name>``. ``rows_too``: the rows of the keys bound as ``keys`` are
        locked ``FOR KEY SHARE`` in key order before any entry is (the entries' scan
        waits on the count of them, which Postgres evaluates once, before its first row
        is locked). ``drop_progress`` (with ``count_acked`` and ``rows_too``): the saved
        progress of those keys deleted once the entries are set. ``checkpoint`` (with
        ``count_acked``): the state bound as ``state`` stored as the consumer's next
        checkpoint (its number read from the consumer's row, which the transaction holds),
        the entries acked with that number, and the row's count and number updated once.
        ``counting`` (with ``rows_too``): the completions bound as ``values`` added to the
        targets of ``keys`` (see :func:`~expstore.claims.prompts.completions_added`), the
        statement's rows followed by those targets as they were (a fourth column, NULL for
        the entries)."""
        handle = self._handle

        def build() -> Any:
            claim_id = bindparam("claim_id", type_=String)
            consumer = bindparam("consumer", type_=String)
            mine = _C.claim_id == claim_id
            _, held = _held_ctes(handle.dialect, mine, [] if rows_too else None)
            wrong = (
                select(func.count())
                .select_from(held)
                .where(or_(held.c.consumer != consumer, held.c.acked_at.is_not(None)))
                .scalar_subquery()
            )
            setting = _setting(names, values)
            buffer_id = bindparam("buffer_id", type_=Integer)
            theirs = and_(consumers.c.buffer_id == buffer_id, consumers.c.consumer == consumer)
            seq = None
            if checkpoint and count_acked:
                seq = select((consumers.c.last_seq + 1).label("seq")).where(theirs).cte("next_seq")
                setting[_C.checkpoint_seq] = select(seq.c.seq).scalar_subquery()
            # The count reads every entry of held (locking them all) before any is set.
            done = (
                update(consumption)
                .where(_C.claim_id == claim_id, wrong == 0)
                .values(setting)
                .returning(_C.key)
                .cte("done")
            )
            stmt: Any = select(held.c.key, held.c.consumer, held.c.acked_at)
            if counting:
                added, needs = completions_added(handle)
                stmt = union_all(
                    stmt.add_columns(null().label("need")),
                    select(needs.c.key, null(), null(), needs.c.need),
                ).add_cte(added)
            stmt = stmt.add_cte(done)
            if count_acked:
                counts: dict[Any, Any] = {
                    "acked": consumers.c.acked
                    + select(func.count()).select_from(done).scalar_subquery()
                }
                if seq is not None:
                    counts["last_seq"] = select(seq.c.seq).scalar_subquery()
                bump = (
                    update(consumers)
                    .where(theirs)
                    .values(counts)
                    .returning(consumers.c.acked)
                    .cte("counted")
                )
                stmt = stmt.add_cte(bump)
                if seq is not None:
                    stored = _stored_checkpoint(handle.dialect, buffer_id, consumer, seq.c.seq)
                    stmt = stmt.add_cte(stored)
                if drop_progress:  # the work is done: its saved progress goes
                    saved = (
                        delete(progress)
                        .where(
                            handle.dialect.key_in(progress.c.key),
                            select(done.c.key).exists(),
                        )
                        .returning(progress.c.key)
                        .cte("saved")
                    )
                    stmt = stmt.add_cte(saved)
            return stmt if counting else stmt.order_by(held.c.key)

        key = (
            "finish",
            names,
            count_acked,
            rows_too,
            drop_progress and count_acked,
            checkpoint and count_acked,
            counting and rows_too,
        )
        return handle.statement(key, build)

    def ack_in(
        self,
        conn: Connection,
        claim: Claimed,
        now: Now,
        checkpoint_seq: int | None = None,
        retention: AckRetention | None = None,
        made: Mapping[int, int] | None = None,
        checkpoint_state: str | None = None,
    ) -> tuple[int, list[int]]:
        """Mark the claim's rows consumed in the caller's transaction (see
        :meth:`finish_in`), with the number of the checkpoint stored with them; returns how
        many rows were acked and the keys of the prompts released again (see ``made``).
        Rows evicted or deleted meanwhile raise RowsEvictedError
        (see :mod:`expstore.claims.lease_retention`; ``retention`` holds what this ack
        allows, its buffer lock taken already). ``made``: the completions the ack stored,
        by prompt key: prompts still short of their completion target are released
        instead (their keys returned; see
        :mod:`expstore.claims.prompts`). ``checkpoint_state`` (where
        :meth:`_checkpoint_at_ack`): the consumer's new checkpoint, stored and numbered by
        the statement that acks the entries, in place of ``checkpoint_seq``."""
        if retention is None:
            retention = self.retention(claim, allow_evicted=False)
            retention.hold_buffer(conn)
        at_once = self._handle.dialect.modifying_ctes
        if not at_once:
            retention.hold_rows(conn)  # else by the statement that acks the entries
        done: dict[str, Any] = {"acked_at": now, "lease_until": None}
        if checkpoint_seq is not None:
            done["checkpoint_seq"] = checkpoint_seq
        again: list[int] = []
        completions = None
        if not at_once:
            again = count_completions(self._handle, conn, claim.keys.tolist(), made, claim.claim_id)
        elif made is not None:  # added to the targets by the statement that acks
            completions = [int(made.get(k, 0)) for k in retention.keys]
        # On Postgres one statement acks the entries, counts them as acked and deletes their
        # saved progress (and adds the completions to the targets, and stores the checkpoint).
        present, counted, left = self._finish_entries(
            conn,
            claim,
            "ack",
            done,
            _Acking(
                True,
                retention.keys if at_once else None,
                retention.saved,
                checkpoint_state,
                completions,
            ),
        )()
        return self._after_finish(conn, claim, retention, made, present, counted, left, again)

    def _after_finish(
        self,
        conn: Connection,
        claim: Claimed,
        retention: AckRetention,
        made: Mapping[int, int] | None,
        present: int,
        counted: bool,
        left: dict[int, int] | None,
        again: list[int],
    ) -> tuple[int, list[int]]:
        """The rest of :meth:`ack_in` once the statement that acks the entries has run
        (``present``, ``counted``, ``left``: what it returned; ``again``: the prompts
        found short already, SQLite)."""
        if made is not None and left is not None:
            again = short_of(made, left, claim.claim_id)
        retention.settle(conn, present)
        if again:  # short of their targets: claimable again for what they still need
            dialect = self._handle.dialect
            conn.execute(
                update(consumption)
                .where(dialect.key_in(_C.key), _C.claim_id == claim.claim_id)
                .values(acked_at=None, checkpoint_seq=None, **_RELEASED),
                {"keys": dialect.key_set(again)},
            )
        acked = present - len(again)
        # Counted for a prompt queue's admission (the consumer's row is held): by the
        # statement that acked (all its entries: those released again come off here).
        change = acked if not counted else -len(again)
        if change:
            conn.execute(
                update(consumers)
                .where(
                    consumers.c.buffer_id == self._handle.buffer_id,
                    consumers.c.consumer == claim.consumer,
                )
                .values(acked=consumers.c.acked + change)
            )
        if present and retention.saved and not counted:  # the work is done: its progress goes
            dialect = self._handle.dialect
            conn.execute(
                delete(progress).where(dialect.key_in(progress.c.key)),
                {"keys": dialect.key_set(claim.keys.tolist())},
            )
        # The groups whose first row this ack consumed leave the ready-group index.
        if retention.grouped:
            consumed = [k for k in claim.keys.tolist() if k not in again]
            forget_consumed(self._handle, conn, consumed)
        return acked, again

    def retention(self, claim: Claimed, *, allow_evicted: bool) -> AckRetention:
        """The retention side of an ack of ``claim``."""
        return AckRetention(self._handle, claim.claim_id, claim.keys, allow_evicted)

    def ack(
        self,
        claim: Claimed,
        checkpoint: Any = None,
        *,
        with_checkpoint: bool,
        allow_evicted: bool = False,
        produce: _Produce | None = None,
        made: Mapping[int, int] | None = None,
        produce_state: BufferHandle | None = None,
    ) -> Acked:
        """Mark the claim's rows consumed, storing ``checkpoint`` for its consumer in the
        same transaction (see :class:`Acked` for what it returns). Rows evicted or deleted
        meanwhile raise RowsEvictedError and change nothing, unless ``allow_evicted``
        (then the rows left are acked and counted); see
        :mod:`expstore.claims.lease_retention`. ``produce(conn)``: writes the claim's
        output (rows into another buffer of the database) in the ack's transaction and
        returns how many rows it stored per prompt key (None: the claim did not say) and
        a report of its own; prompts left short of their completion targets are released.
        A transaction retried runs ``produce`` again: what is returned is the committed
        attempt's. ``made``: what ``produce`` stores per prompt key, where it is known
        before it runs (each of its rows is stored, or the ack fails); then, on Postgres,
        the ack goes in two round trips (see :meth:`_ack_batched`) and ``produce`` is
        given the transaction, to send its last statements with the COMMIT, and the state
        of ``produce_state`` (the buffer it writes into), read with the ack's first
        statements, without its row."""
        state = check_checkpoint(checkpoint) if with_checkpoint else None
        now = self._handle.dialect.now()
        if produce is None and state is None and not self._stale_seen:
            done = {"acked_at": now, "lease_until": None}
            if self._finish_at_once(claim, "ack", done, acking=True):
                return Acked(len(claim.keys), [], None)
        retention = self.retention(claim, allow_evicted=allow_evicted)
        if (
            produce is not None
            and made is not None
            and state is None
            and not self._stale_seen
            and batches(self._handle.connections.engine.dialect)
        ):
            acked = self._ack_batched(claim, retention, made, produce, produce_state)
            if acked is not None:
                return acked

        def body(conn: Connection) -> Acked:
            made, report = None, None
            if produce is not None:  # what the claim's work made, in the same commit
                # (its entries checked already: see _finish's entries)
                made, report = produce(conn, None, None)
            if state is not None and produce is None and self._checkpoint_at_ack(claim):
                # Stored by the statement that acks the entries (the consumer's row, held
                # since the transaction's first statement, is written once).
                acked, short = self.ack_in(conn, claim, now, None, retention, None, state)
            else:
                seq = (
                    None
                    if state is None
                    else self.store_checkpoint(conn, claim.consumer, state, now)
                )
                acked, short = self.ack_in(conn, claim, now, seq, retention, made)
            return Acked(acked, short, report)

        return self._finish(claim, "ack", body, retention, entries=produce is not None)

    def _ack_batched(
        self,
        claim: Claimed,
        retention: AckRetention,
        made: Mapping[int, int],
        produce: _Produce,
        into: BufferHandle | None = None,
    ) -> Acked | None:
        """An ack with ``produce`` (Postgres, pipeline mode; see
        :mod:`expstore.db.pipeline`) in two round trips: BEGIN, the head (the buffer,
        the consumer's generation, the claim's entries locked), the statement that acks
        the entries (with the completions ``made`` added to their targets and the saved
        progress deleted) and the state of ``into``, the buffer ``produce`` writes into,
        read without its row, in one; then ``produce``'s: its rows encoded, and, where
        nothing of that buffer needs its row before the insert, the row taken, its
        settings checked unchanged (:func:`~expstore.lifecycle.hooks.hold_unchanged`),
        the rows inserted and counted, their lineage and the COMMIT, in the last. The
        target's row is then held only by the server, for those statements and the
        commit, not across a round trip. The checks are those of :meth:`_finish` (the
        statement that acks sets nothing unless the entries are the consumer's; whatever
        the head finds wrong raises, rolling back both). None where the buffer's eviction
        is ``"stale"`` or the target's settings changed since they were read (rolled back:
        the caller acks as :meth:`_finish` does)."""
        handle = self._handle
        now = handle.dialect.now()
        completions = [int(made.get(k, 0)) for k in retention.keys]

        def write() -> Acked:
            with handle.errors("ack a claim"), handle.single() as conn, batched(conn) as tx:
                with tx.batch():
                    head = self._send_finish_head(conn, claim.consumer, retention, claim.claim_id)
                    finish = self._finish_entries(
                        conn,
                        claim,
                        "ack",
                        {"acked_at": now, "lease_until": None},
                        _Acking(True, retention.keys, True, None, completions),
                    )
                    state = (
                        None
                        if into is None
                        else send_state(into, conn, locked=False, fingerprint=True)
                    )
                current, held = head()
                if retention.stale:
                    raise _StaleFound  # rolled back before anything was kept
                check_generation(handle, conn, claim.consumer, claim.generation, "ack", current)
                assert held is not None
                self._check_own(conn, claim, "ack", held)
                present, counted, left = finish()
                acked, short = self._after_finish(
                    conn, claim, retention, made, present, counted, left, []
                )
                _, report = produce(conn, tx, None if state is None else state())
            return Acked(acked, short, report)

        def attempt() -> Acked:
            try:
                return write()
            except StorageError as exc:
                if changed_since_read(exc):
                    raise StateChanged() from exc  # (rolled back)
                raise

        try:
            # A deadlock with a claim taking the rows over rolls it back: again.
            return retried(attempt)
        except _StaleFound:
            self._stale_seen = True
            return None
        except StateChanged:
            return None  # the caller acks again, holding the target's row in turn

    def release(self, claim: Claimed) -> int:
        """Return the claim's rows to the queue; returns how many."""
        if self._finish_at_once(claim, "release", _RELEASED, acking=False):
            return len(claim.keys)
        return self._finish(
            claim, "release", lambda c: self.finish_in(c, claim, "release", _RELEASED)
        )

    def renew(self, claim: Claimed, lease_s: float) -> float:
        """Extend the claim's lease to ``lease_s`` from now; returns when it ends."""

        def body(conn: Connection) -> float:
            now = float(conn.execute(select(self._handle.dialect.now())).scalar_one())
            self.finish_in(conn, claim, "renew", {"lease_until": now + lease_s})
            return now + lease_s

        return self._finish(claim, "renew", body)

    # -- consumers and their generations (expstore.claims.generations) ------------------------
    def open_consumer(self, consumer: str, *, takeover: bool) -> tuple[int, int]:
        """Open a new incarnation of ``consumer``: ``(its generation, how many rows it took back)``.
        With ``takeover`` the claims its predecessors still hold are released in the same
        transaction, so their rows are claimable at once."""
        handle = self._handle

        def write() -> tuple[int, int]:
            with handle.errors("open a consumer"), handle.write() as conn:
                buffer_row(handle, conn)  # still the handle's buffer
                generation = next_generation(handle, conn, consumer)
                taken = self.release_consumer_in(conn, consumer) if takeover else 0
            return generation, taken

        return retried(write)

    def release_consumer_in(self, conn: Connection, consumer: str) -> int:
        """Release every unacked claim of ``consumer`` in the caller's transaction (which
        holds the consumer's row); returns how many rows came back."""
        handle = self._handle
        held = select(_C.key).where(
            _C.buffer_id == handle.buffer_id,
            _C.acked_at.is_(None),
            _C.claim_id.is_not(None),
            _C.consumer == consumer,
        )
        # Locked in key order, as claims lock them (else the two can deadlock on Postgres).
        keys = [
            int(k) for k in conn.execute(handle.dialect.locked(held.order_by(_C.key))).scalars()
        ]
        if not keys:
            return 0
        freed = (
            update(consumption)
            .where(handle.dialect.key_in(_C.key), _C.consumer == consumer, _C.acked_at.is_(None))
            .values(**_RELEASED)
        )
        return int(conn.execute(freed, {"keys": handle.dialect.key_set(keys)}).rowcount)

    def _checkpoint_at_ack(self, claim: Claimed) -> bool:
        """Whether an ack of ``claim`` stores its checkpoint with the statement that acks
        the entries (Postgres): a consumer's incarnation (generation above 0) has its row, which
        the ack holds from its first statement, so the checkpoint's number is read from it."""
        return self._handle.dialect.modifying_ctes and claim.generation > 0

    def store_checkpoint(self, conn: Connection, consumer: str, state: str, now: Now) -> int:
        """Store ``state`` (checked JSON text) as ``consumer``'s newest checkpoint in the
        caller's transaction; returns its number."""
        handle = self._handle
        if handle.dialect.modifying_ctes:  # one statement: the number, then the checkpoint
            numbered = handle.statement(("store checkpoint",), self._checkpoint_statement)
            found = numbered.run(conn, buffer_id=handle.buffer_id, consumer=consumer, state=state)
            return int(found[0][0])
        insert = handle.dialect.upsert(consumers)
        seq = conn.execute(
            insert.values(buffer_id=handle.buffer_id, consumer=consumer, last_seq=1)
            .on_conflict_do_update(
                index_elements=[consumers.c.buffer_id, consumers.c.consumer],
                set_={"last_seq": consumers.c.last_seq + 1},
            )
            .returning(consumers.c.last_seq)
        ).scalar_one()
        conn.execute(
            checkpoints.insert().values(
                buffer_id=handle.buffer_id,
                consumer=consumer,
                seq=seq,
                state=state,
                created_at=now,
            )
        )
        return int(seq)

    def _checkpoint_statement(self) -> Any:
        """:meth:`store_checkpoint` as one statement (Postgres): the consumer's next
        checkpoint number, and the checkpoint stored under it; returns the number."""
        dialect = self._handle.dialect
        buffer_id = bindparam("buffer_id", type_=Integer)
        consumer = bindparam("consumer", type_=String)
        insert = dialect.upsert(consumers)
        numbered = (
            insert.values(buffer_id=buffer_id, consumer=consumer, last_seq=1)
            .on_conflict_do_update(
                index_elements=[consumers.c.buffer_id, consumers.c.consumer],
                set_={"last_seq": consumers.c.last_seq + 1},
            )
            .returning(consumers.c.last_seq)
            .cte("numbered")
        )
        stored = _stored_checkpoint(dialect, buffer_id, consumer, numbered.c.last_seq)
        return select(stored.c.seq)

    # -- progress --------------------------------------------------------------------------
    def save_progress(self, claim: Claimed, keys: list[int], state: str) -> None:
        """Store ``state`` (JSON text) as the progress of the rows ``keys`` of ``claim``, in
        one statement that writes only while the claim still holds them (not acked, not
        released, its lease not run out); LeaseExpiredError, saving nothing, otherwise."""
        handle = self._handle
        dialect = handle.dialect

        def build() -> Any:
            now = dialect.now()
            claim_id = bindparam("claim_id", type_=String)
            text = bindparam("state", type_=Text)
            held = select(_C.key, _C.buffer_id, _C.claim_id, text, now).where(
                dialect.key_in(_C.key),
                _C.claim_id == claim_id,
                _C.acked_at.is_(None),
                _C.lease_until >= now,
            )
            insert = dialect.upsert(progress).from_select(
                ["key", "buffer_id", "claim_id", "state", "saved_at"], held
            )
            return insert.on_conflict_do_update(
                index_elements=[progress.c.key],
                set_={
                    "claim_id": insert.excluded.claim_id,
                    "state": insert.excluded.state,
                    "saved_at": insert.excluded.saved_at,
                },
            )  # its row count: the rows saved (each inserted or updated once)

        stmt = handle.write_statement("save progress", build)

        def write() -> int:
            # One statement that commits on its own: no BEGIN or COMMIT round trips.
            with handle.errors("save progress"), handle.single() as conn:
                return stmt.execute(
                    conn, keys=dialect.key_set(keys), claim_id=claim.claim_id, state=state
                )

        if retried(write) < len(keys):
            raise LeaseExpiredError(
                f"claim {claim.claim_id} no longer holds its rows (acked, released, or its "
                "lease ran out and they may be claimed by another); nothing was saved. "
                "Renew the lease (claim.renew()) before it runs out while you work"
            )

    def progress_of(self, keys: Sequence[int]) -> dict[int, Any]:
        """The saved progress of the rows of ``keys`` that have some, by key."""
        if not len(keys):
            return {}
        handle = self._handle
        dialect = handle.dialect
        stmt = select(progress.c.key, progress.c.state).where(dialect.key_in(progress.c.key))
        # From the primary: a replica behind it could miss progress just saved.
        with handle.errors("read progress"), handle.single() as conn:
            found = conn.execute(stmt, {"keys": dialect.key_set(list(keys))}).all()
        return {int(k): checkpoint_value(state) for k, state in found}

    def ids_of(self, keys: Sequence[int]) -> dict[int, str]:
        """The ids of the stored rows among ``keys``, by key (from the primary)."""
        handle = self._handle
        stmt = select(rows.c.key, rows.c.id).where(handle.dialect.key_in())
        with handle.errors("read row ids"), handle.single() as conn:
            found = conn.execute(stmt, {"keys": handle.dialect.key_set(list(keys))})
            return {int(k): str(i) for k, i in found}

    def needs(self, keys: Sequence[int]) -> dict[int, int]:
        """How many completions each row of ``keys`` with a target still needs, by key."""
        handle = self._handle
        with handle.errors("read completion targets"), handle.single() as conn:
            return needs_of(handle, conn, keys)

    # -- reading -------------------------------------------------------------------------
    def checkpoint(self, consumer: str) -> tuple[int, Any]:
        """``(seq, state)`` of the consumer's last checkpoint; UnknownConsumerError if it
        has none."""
        handle = self._handle
        stmt = (
            select(checkpoints.c.seq, checkpoints.c.state)
            .where(checkpoints.c.buffer_id == handle.buffer_id, checkpoints.c.consumer == consumer)
            .order_by(checkpoints.c.seq.desc())
            .limit(1)
        )
        with handle.errors("read a checkpoint"), handle.read() as conn:
            found = conn.execute(stmt).first()
        if found is None:
            raise UnknownConsumerError(
                f"consumer {consumer!r} has no checkpoint in buffer {handle.name!r}: it has "
                "never acked with checkpoint=... . Start it from scratch, or pass default= "
                "to get a starting state instead of this error"
            )
        return int(found.seq), checkpoint_value(found.state)

    def count(self, scope: Scope, upto: int, *, claimable: bool) -> int:
        """How many matching rows there are (``claimable``: that can be claimed now),
        counting no further than ``upto``, so a poll costs the same whatever the buffer's
        size."""
        handle = self._handle
        with handle.errors("count rows"), handle.read() as conn:
            some = select(rows.c.key).where(*scope.where(handle)).limit(upto)
            if claimable:
                now = float(conn.execute(select(handle.dialect.now())).scalar_one())
                start = self._start(conn, scope, self._oldest(conn, scope))
                some = some.where(rows.c.key >= start, unblocked(now))
            counted = select(func.count()).select_from(some.subquery())
            return int(conn.execute(counted).scalar_one())

    def stats(self, query_condition: QueryCondition) -> QueueStats:
        """Queue depth: matching rows by claim state, and per consumer."""
        return queue_stats(self._handle, query_condition)

    def lineage(self, ids: Sequence[str]) -> dict[str, Lineage]:
        """The consumption record of each stored row of ``ids`` (rows never claimed:
        ``unclaimed``; ids not stored are left out)."""
        return row_lineage(self._handle, ids)
