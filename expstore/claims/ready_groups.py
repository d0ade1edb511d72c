"""The ready-group index: which groups a group claim can take, kept in the database.

A group claim (``buffer.claim(n, order=GroupSampler(...))``) must find complete groups
whose rows are all claimable. Summarising every group of the buffer for that made a claim
cost what the whole history costs, consumed groups included. Instead each (buffer,
condition, group spec, staleness limit) that claims take groups by has an index of its
own, in two tables (see :mod:`expstore.db.schema`):

- ``expstore_group_specs``: the index's row. ``scanned_to``: every group with a matching
  row at or below this key has been summarised; ``seen_version``: the buffer's change
  counter then (a delete or an eviction other than FIFO moves it); ``oldest``: the oldest
  fresh version when its stale groups were last dropped; ``filtered`` and ``stale``: how
  many complete groups it left out for good.
- ``expstore_ready_groups``: its groups not consumed yet: *ready* (complete, passing the
  group condition, fresh when they completed) and *waiting* (fewer rows than the group
  size so far), each with its first key, oldest policy version and rows' keys.

Every claim brings the index up to date in its own transaction, under the index row's
lock (so concurrent claimers of one spec take turns and never summarise a row twice),
from what changed since:

- rows written since ``scanned_to``: only the groups they belong to are summarised
  (through the group column's index); a group whose ``size``-th row is among them is
  complete *now*: it becomes ready, or, failing the group condition or already stale, is
  counted as left out (its rows can never be drawn by this spec: the rate limit counts
  them as discarded). Rows keep committing in key order per buffer (every write holds
  the buffer's row), so no row below ``scanned_to`` can appear later;
- the version moving on: groups now stale are dropped by the ``(spec_id, version)``
  index; the version forced back below ``oldest`` rebuilds the index;
- the buffer's change counter moving (deletes, evictions other than FIFO): the entries
  that lost a row are summarised again; FIFO eviction and deletes of a group's first row
  take its entry with them (a foreign key, ON DELETE CASCADE).

An ack removes the entries of the groups it consumed, in its transaction. A group held by
a live claim keeps its entry, so it comes back by itself when the claim is released or
its lease runs out. So a claim costs what the rows written since the last one and the
groups it takes cost, whatever was consumed before; the first claim of a spec over an
existing buffer builds its index once (about a second per million rows).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    false,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from ..db.dialects import chunked
from ..db.handle import BufferHandle
from ..db.schema import (
    buffers,
    consumption,
    group_specs,
    newest_first,
    oldest_first,
    ready_groups,
    rows,
)
from ..errors import QueryError
from ..group_summaries import GroupSpec, group_column, summarise
from ..policy_versions import fresh, oldest_fresh
from ..query import QueryCondition, condition_key
from ..query.conditions import Comparison
from ..query.fields import resolve_field
from ..samplers.group import GroupOrder

__all__ = ["GroupTally", "ReadyGroups", "Synced", "forget_consumed", "ready_groups_of"]

_E = ready_groups.c
_S = group_specs.c
_C = consumption.c
_KEYS = ready_groups.c["keys"]  # not _E.keys, which is the collection's keys()
#: Group values per statement when summarising the groups new rows touched.
_CHUNK = 2000


class Synced(NamedTuple):
    """An index brought up to date in a transaction: its id, the oldest fresh version it
    applies (None: no limit), and how many rows this update left out for good (groups that
    completed failing the group condition, or stale), which the rate limit discards."""

    spec_id: int
    oldest: int | None
    #: The keys of the rows this update found can never be drawn by this index's claims.
    discarded: list[int]


class GroupTally(NamedTuple):
    """The groups of an index now: ready to claim (complete, passing, fresh, no row held),
    held (ready but claimed and not acked yet), waiting for rows, and left out for good
    since the index was built (filtered out by the group condition, stale)."""

    ready: int
    held: int
    waiting: int
    filtered: int
    stale: int


def _spec_text(query_condition: QueryCondition, spec: GroupSpec, staleness: int | None) -> str:
    return f"{condition_key(query_condition)}|{spec.key}|{staleness}"


def _digest(text: str) -> str:
    """The index row's ``digest`` of a spec's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def _first_free(now: Any) -> ColumnElement[bool]:
    """The entry's first row holds no acked entry and no live lease (its group, claimed
    whole, is claimable)."""
    blocked = (
        select(or_(_C.acked_at.is_not(None), _C.lease_until >= now))
        .where(_C.key == _E.first_key)
        .scalar_subquery()
    )
    return blocked.is_not(true())


def forget_consumed(handle: BufferHandle, conn: Connection, keys: Sequence[int]) -> None:
    """Remove the ready-group entries whose first row is among ``keys``, acked in this
    transaction: their groups are consumed (by a group claim, or a row claim that took a
    group's first row)."""
    if len(keys):
        dialect = handle.dialect
        conn.execute(
            delete(ready_groups).where(
                _E.buffer_id == handle.buffer_id, dialect.key_in(_E.first_key)
            ),
            {"keys": dialect.key_set([int(k) for k in keys])},
        )


def ready_groups_of(handle: BufferHandle) -> ReadyGroups:
    """The ready-group indexes of ``handle``'s buffer: one per handle, made on first use."""
    return handle.part(ReadyGroups)


class ReadyGroups:
    """The ready-group indexes of one buffer, as one handle uses them."""

    def __init__(self, handle: BufferHandle) -> None:
        self.handle = handle
        #: Groups summarised so far by this handle's updates, to see what they cost.
        self.groups_read = 0

    # -- bringing an index up to date ----------------------------------------------------
    def sync(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        staleness: int | None,
    ) -> Synced:
        """Bring the index of (condition, spec, staleness) up to date in ``conn``'s write
        transaction, holding its row until the transaction ends; creates it if new."""
        handle = self.handle
        spec_row = self._spec_row(conn, _spec_text(query_condition, spec, staleness))
        spec_id = int(spec_row.id)
        version, current, max_key, min_key = _buffer_state(handle, conn)
        oldest = oldest_fresh(current, staleness)
        scanned_to = int(spec_row.scanned_to)
        changes: dict[str, Any] = {}
        counts = {"filtered": 0, "stale": 0}
        discarded: list[int] = []
        went_back = spec_row.oldest is not None and (
            oldest is None or oldest < int(spec_row.oldest)
        )
        if went_back:  # the version forced back: stale groups dropped are fresh again
            conn.execute(delete(ready_groups).where(_E.spec_id == spec_id))
            scanned_to = 0
        elif int(spec_row.seen_version) != int(version) and scanned_to:
            discarded += self._recheck(
                conn, query_condition, spec, spec_id, oldest, min(scanned_to, max_key), counts
            )
        elif min_key > 0:  # FIFO eviction takes the oldest rows: their groups' entries
            gone = and_(_E.spec_id == spec_id, _E.first_key < min_key)
            conn.execute(delete(ready_groups).where(gone))
        if oldest is not None and (
            went_back or spec_row.oldest is None or oldest > spec_row.oldest
        ):
            discarded += self._drop_stale(conn, spec_id, oldest, counts)
        if max_key > scanned_to:
            discarded += self._catch_up(
                conn, query_condition, spec, spec_id, oldest, scanned_to, max_key, counts
            )
            changes["scanned_to"] = max_key
        changes.update(seen_version=int(version), oldest=oldest)
        for name in ("filtered", "stale"):
            if went_back:  # counted again from nothing
                changes[name] = counts[name]
            elif counts[name]:
                changes[name] = _S[name] + counts[name]
        conn.execute(update(group_specs).where(_S.id == spec_id).values(**changes))
        return Synced(spec_id, oldest, discarded)

    def _spec_row(self, conn: Connection, text: str) -> Any:
        handle = self.handle
        digest = _digest(text)
        mine = select(group_specs).where(_S.buffer_id == handle.buffer_id, _S.digest == digest)
        found = conn.execute(handle.dialect.locked(mine)).first()
        if found is None:
            conn.execute(
                handle.dialect.upsert(group_specs)
                .values(buffer_id=handle.buffer_id, digest=digest, spec=text)
                .on_conflict_do_nothing(index_elements=[_S.buffer_id, _S.digest])
            )
            found = conn.execute(handle.dialect.locked(mine)).one()
        return found

    def _catch_up(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        spec_id: int,
        oldest: int | None,
        scanned_to: int,
        max_key: int,
        counts: dict[str, int],
    ) -> list[int]:
        """Summarise the groups of the matching rows written after ``scanned_to`` (up to
        ``max_key``); returns the rows of groups left out for good."""
        handle = self.handle
        group = group_column(handle, spec)
        if not scanned_to:  # a new index: every group, in one statement
            found = summarise(handle, conn, query_condition, spec, rows.c.key <= max_key)
            return self._enter(conn, spec, spec_id, oldest, found, 0, max_key, counts)
        # The rows written since, by key range: with the buffer as an equality the
        # planners walked the group column's index over the whole buffer (54 ms at 1M).
        touched = (
            select(group)
            .distinct()
            .where(
                rows.c.key > scanned_to,
                rows.c.key <= max_key,
                rows.c.buffer_id + 0 == handle.buffer_id,
                *handle.matching(query_condition),
                group.is_not(None),
            )
        )
        values = list(conn.execute(touched).scalars())
        discarded: list[int] = []
        for chunk in chunked(values, _CHUNK):
            of = _groups_in(handle, spec, list(chunk))
            found = summarise(handle, conn, query_condition, spec, *of, by_group=True)
            discarded += self._enter(
                conn, spec, spec_id, oldest, found, scanned_to, max_key, counts
            )
        return discarded

    def _enter(
        self,
        conn: Connection,
        spec: GroupSpec,
        spec_id: int,
        oldest: int | None,
        found: Sequence[Any],
        scanned_to: int,
        max_key: int,
        counts: dict[str, int],
    ) -> list[int]:
        """Enter the summaries ``found``: a group whose last row (of its first ``size``) is
        above ``scanned_to`` changed since the index saw it. Groups with a row past
        ``max_key`` (committed since this update began) are left to the next one."""
        self.groups_read += len(found)
        size = spec.size
        waiting: list[dict[str, Any]] = []
        complete: list[tuple[Any, ...]] = []
        for g, n, version, passes, _first, keys_text in found:
            keys = sorted(int(k) for k in keys_text.split(","))
            if keys[-1] > max_key or keys[-1] <= scanned_to:
                continue
            if n < size:
                waiting.append(_entry(spec_id, self.handle.buffer_id, g, keys, version, False))
            else:
                complete.append((g, keys, version, bool(passes)))
        consumed = self._consumed(conn, [keys[0] for _, keys, _, _ in complete])
        entries = list(waiting)
        left_out: list[int] = []
        discarded: list[int] = []
        for g, keys, version, passes in complete:
            if keys[0] in consumed:
                continue
            stale = oldest is not None and version is not None and int(version) < oldest
            if not passes or stale:
                counts["filtered" if not passes else "stale"] += 1
                discarded += keys
                left_out.append(keys[0])
            else:
                entries.append(_entry(spec_id, self.handle.buffer_id, g, keys, version, True))
        self._upsert(conn, entries)
        if left_out:  # their waiting entries, if any
            dialect = self.handle.dialect
            conn.execute(
                delete(ready_groups).where(_E.spec_id == spec_id, dialect.key_in(_E.first_key)),
                {"keys": dialect.key_set(left_out)},
            )
        return discarded

    def _consumed(self, conn: Connection, firsts: list[int]) -> set[int]:
        """Which of these first keys have an acked entry (their group was consumed)."""
        dialect = self.handle.dialect
        acked: set[int] = set()
        for chunk in chunked(firsts, _CHUNK):
            stmt = select(_C.key).where(dialect.key_in(_C.key), _C.acked_at.is_not(None))
            acked.update(conn.execute(stmt, {"keys": dialect.key_set(list(chunk))}).scalars())
        return acked

    def _upsert(self, conn: Connection, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        insert = self.handle.dialect.upsert(ready_groups)
        stmt = insert.on_conflict_do_update(
            index_elements=[_E.spec_id, _E.first_key],
            set_={
                name: insert.excluded[name]
                for name in ("value", "size", "ready", "version", "keys")
            },
        )
        for chunk in chunked(entries, 500):
            conn.execute(stmt, list(chunk))

    def _drop_stale(
        self, conn: Connection, spec_id: int, oldest: int, counts: dict[str, int]
    ) -> list[int]:
        """Drop the groups older than ``oldest``; returns the keys of the ready ones no
        claim held (a held group's rows are counted as sampled when its claim is acked)."""
        now = self.handle.dialect.now()
        stale = and_(_E.spec_id == spec_id, _E.version < oldest)
        held = select(_E.ready, _KEYS.label("key_list"), _first_free(now).label("free"))
        found = list(conn.execute(held.where(stale)).all())
        if not found:
            return []
        conn.execute(delete(ready_groups).where(stale))
        ready = [f for f in found if f.ready]
        counts["stale"] += len(ready)
        return [int(k) for f in ready if f.free for k in f.key_list.split(",")]

    def _recheck(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        spec_id: int,
        oldest: int | None,
        max_key: int,
        counts: dict[str, int],
    ) -> list[int]:
        """After deletes: summarise again the entries that lost a row (their groups may
        have other rows now, or none)."""
        dialect = self.handle.dialect
        entries = list(
            conn.execute(
                select(_E.first_key, _E.value, _KEYS.label("key_list")).where(_E.spec_id == spec_id)
            )
        )
        if not entries:
            return []
        wanted = {int(k) for e in entries for k in e.key_list.split(",")}
        present: set[int] = set()
        for chunk in chunked(sorted(wanted), _CHUNK):
            stmt = select(rows.c.key).where(dialect.key_in())
            present.update(conn.execute(stmt, {"keys": dialect.key_set(list(chunk))}).scalars())
        broken = [e for e in entries if any(int(k) not in present for k in e.key_list.split(","))]
        if not broken:
            return []
        firsts = [int(e.first_key) for e in broken]
        conn.execute(
            delete(ready_groups).where(_E.spec_id == spec_id, dialect.key_in(_E.first_key)),
            {"keys": dialect.key_set(firsts)},
        )
        discarded: list[int] = []
        for chunk in chunked([e.value for e in broken], _CHUNK):
            of = _groups_in(self.handle, spec, list(chunk))
            found = summarise(self.handle, conn, query_condition, spec, *of, by_group=True)
            discarded += self._enter(conn, spec, spec_id, oldest, found, 0, max_key, counts)
        return discarded

    def forget_spent(self, conn: Connection, synced: Synced, keys: Sequence[int]) -> None:
        """Remove the index's entries of the groups of which a row among ``keys`` has an
        acked entry: consumed in part (by a row claim, or a group claim of another
        index), such a group can never be claimed whole."""
        dialect = self.handle.dialect
        spent = select(_C.key).where(dialect.key_in(_C.key), _C.acked_at.is_not(None))
        acked = set(conn.execute(spent, {"keys": dialect.key_set(list(keys))}).scalars())
        if not acked:
            return
        entries = select(_E.first_key, _KEYS.label("key_list")).where(
            _E.spec_id == synced.spec_id,
            dialect.key_in(_E.first_key),
        )
        firsts = sorted({int(k) for k in keys})
        found = conn.execute(entries, {"keys": dialect.key_set(firsts)}).all()
        gone = [
            int(e.first_key) for e in found if any(int(k) in acked for k in e.key_list.split(","))
        ]
        if gone:
            conn.execute(
                delete(ready_groups).where(
                    _E.spec_id == synced.spec_id, dialect.key_in(_E.first_key)
                ),
                {"keys": dialect.key_set(gone)},
            )

    # -- reading an index ----------------------------------------------------------------
    def candidates(
        self,
        conn: Connection,
        synced: Synced,
        now: Any,
        limit: int,
        skip: Iterable[int] = (),
        order: GroupOrder = "oldest",
    ) -> list[tuple[int, np.ndarray]]:
        """Up to ``limit`` ready groups whose first row is claimable now, none of those
        whose first key is in ``skip``, in ``order``: (first key, the group's keys)."""
        stmt = select(_E.first_key, _KEYS).where(*self._ready(synced, now))
        skipped = sorted(skip)
        if skipped:
            stmt = stmt.where(_E.first_key.not_in(bindparam("skip", skipped, expanding=True)))
        stmt = stmt.order_by(_E.first_key if order == "oldest" else func.random()).limit(limit)
        return [
            (int(first), np.array(keys.split(","), dtype=np.int64))
            for first, keys in conn.execute(stmt)
        ]

    def _ready(self, synced: Synced, now: Any) -> list[ColumnElement[bool]]:
        clauses = [_E.spec_id == synced.spec_id, _E.ready == true(), _first_free(now)]
        if synced.oldest is not None:
            clauses.append(fresh(_E.version, synced.oldest))
        return clauses

    def tally(
        self, conn: Connection, synced: Synced, now: Any, upto: int | None = None
    ) -> GroupTally:
        """How the index's groups stand now (``upto``: count ready groups no further, so a
        poll costs the same whatever the backlog)."""
        ready_rows = select(_E.first_key).where(*self._ready(synced, now))
        if upto is not None:
            ready_rows = ready_rows.limit(upto)
        mine = _E.spec_id == synced.spec_id
        held = select(func.count()).where(mine, _E.ready == true(), ~_first_free(now))
        waiting = select(func.count()).where(mine, _E.ready == false())
        spec = _S.id == synced.spec_id
        counts = conn.execute(
            select(
                select(func.count()).select_from(ready_rows.subquery()).scalar_subquery(),
                held.scalar_subquery(),
                waiting.scalar_subquery(),
                select(_S.filtered).where(spec).scalar_subquery(),
                select(_S.stale).where(spec).scalar_subquery(),
            )
        ).one()
        return GroupTally(*(int(c) for c in counts))

    def in_sync(
        self,
        conn: Connection,
        query_condition: QueryCondition,
        spec: GroupSpec,
        staleness: int | None,
    ) -> Synced | None:
        """The index, if nothing changed since it was last brought up to date (a read: no
        lock); None when it must be (or does not exist yet)."""
        handle = self.handle
        digest = _digest(_spec_text(query_condition, spec, staleness))
        spec_row = conn.execute(
            select(group_specs).where(_S.buffer_id == handle.buffer_id, _S.digest == digest)
        ).first()
        if spec_row is None:
            return None
        version, current, max_key, _ = _buffer_state(handle, conn)
        oldest = oldest_fresh(current, staleness)
        if (
            int(spec_row.scanned_to) < max_key
            or int(spec_row.seen_version) != int(version)
            or spec_row.oldest != oldest
        ):
            return None
        return Synced(int(spec_row.id), oldest, [])


def _groups_in(
    handle: BufferHandle, spec: GroupSpec, values: list[Any]
) -> list[ColumnElement[bool]]:
    """The clauses that select the rows of the groups ``values``. Groups by a payload path
    are compared as JSON text; the same groups are also asked for as an ``in`` condition on
    the path, which a path index (``buffer.create_index(path)``) serves, so only their rows
    are read (values of mixed kinds, or not plain strings and numbers, keep the text
    comparison alone, which reads every matching row)."""
    group = group_column(handle, spec)
    clauses: list[ColumnElement[bool]] = [group.in_(bindparam("groups", values, expanding=True))]
    if resolve_field(spec.group_by).column is None:
        try:
            plain = [json.loads(v) for v in values]
            if all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in plain):
                clauses += handle.matching(Comparison(spec.group_by, "in", tuple(plain)))
        except (ValueError, QueryError):
            pass
    return clauses


def _buffer_state(handle: BufferHandle, conn: Connection) -> tuple[int, int | None, int, int]:
    """The buffer's change counter, policy version, and largest and smallest key (0: no
    rows), in one round trip."""
    this = buffers.c.id == handle.buffer_id
    key = select(rows.c.key)
    max_key = newest_first(key, handle.buffer_id).limit(1).scalar_subquery()
    min_key = oldest_first(key, handle.buffer_id).limit(1).scalar_subquery()
    version, current, largest, smallest = conn.execute(
        select(
            select(buffers.c.version).where(this).scalar_subquery(),
            select(buffers.c.policy_version).where(this).scalar_subquery(),
            max_key,
            min_key,
        )
    ).one()
    current = None if current is None else int(current)
    return int(version), current, int(largest or 0), int(smallest or 0)


def _entry(
    spec_id: int, buffer_id: int, value: Any, keys: list[int], version: Any, ready: bool
) -> dict[str, Any]:
    return {
        "spec_id": spec_id,
        "first_key": keys[0],
        "buffer_id": buffer_id,
        "value": value,
        "size": len(keys),
        "ready": ready,
        "version": None if version is None else int(version),
        "keys": ",".join(str(k) for k in keys),
    }
