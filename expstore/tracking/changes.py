"""Tracked paths: ``buffer.track_changes("exp_data.state.screenshot")`` keeps, per row, the
digest of the value at the path and whether it equals the previous and the next step's of
the same trajectory, so that ``changed(path)`` tests a bit of a column of the row through
an index instead of probing each row's neighbour.

The previous step of a row is the buffer's row of the same task_id with the largest step
below its own (ties by key); the next, the smallest step above (ties by key); a row whose
neighbour is missing, or whose value or the neighbour's is missing (digest NULL), is
``changed``. These are the semantics of the correlated probe the compiler uses for a path
no one tracks (see :meth:`expstore.query.compiler._Compiler.changed`), with digests of the
values in place of their JSON text: a small array in the row's blob compares by content
too (see :mod:`expstore.codec.tracked`).

Where it is kept:

- ``expstore_tracked_paths``: each tracked path with its ``slot`` (0 to
  :data:`MAX_TRACKED` - 1, the lowest free when it is tracked);
- ``expstore_changes``: the digest of each row at each tracked path, from which the flags
  are set again whenever a neighbour comes or goes;
- ``expstore_rows.change_flags``: the flags, bit ``2 * slot`` set when the row's value
  equals the previous step's, bit ``2 * slot + 1`` when it equals the next step's (0: changed
  both ways, or not tracked). ``changed(path)`` is ``change_flags & bit = 0``, which the
  ``(buffer_id, change_flags)`` index answers alone (a count) or with the row it has read
  already (a sampler's probe of a chosen key).

The flags stay exact in the transaction of the rows: a write computes each new row's flags
before inserting it (its digests from the rows it just encoded, its neighbours among them
and the stored rows of their tasks) and rewrites the stored rows of those tasks whose flags
it changes; a removal (``delete``, eviction of any policy, retention) sets the flags of the
rows left in the tasks it touched, after them (their digests go with them, ON DELETE
CASCADE); ``clear`` leaves nothing to fix; untracking clears the path's bits. Writers and
removals of a buffer take turns on its row, and ``track_changes`` fills the digests and
flags of every stored row in one transaction holding it, so a process killed at any point
leaves the flags of the last committed transaction.

Cost: a write reads the digests of the tasks it touches (every step of each: one indexed
read per 500 tasks and tracked path) and rewrites the stored rows whose flags change (the
last step of a trajectory that a new step extends, unchanged); trajectories of thousands of
steps written a step at a time pay for their length on each write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, insert, select, text, update

from ..codec.decode import PartDecoder
from ..codec.tracked import column_digest, node_at, value_digest
from ..db.dialects import WRITE_COLUMNS
from ..db.handle import BufferHandle, TrackedPath, flag_bit, read_tracked
from ..db.schema import changes, rows, tracked_paths
from ..errors import CodecError, InvalidArgumentError, QueryError
from ..lifecycle.hooks import RemoveContext, RowFeature, WriteContext, register
from ..model.paths import FieldPath
from ..query.fields import resolve_field

__all__ = [
    "MAX_TRACKED",
    "Pending",
    "after_insert",
    "before_insert",
    "check_path",
    "refresh",
    "tasks_of",
    "track",
    "untrack",
]

#: How many paths a buffer can track at once: two bits each of a 64-bit ``change_flags``
#: (the sign bit left alone).
MAX_TRACKED = 31

_CHUNK = 500
_ID_AT = WRITE_COLUMNS.index("id")
_TASK_AT = WRITE_COLUMNS.index("task_id")
_STEP_AT = WRITE_COLUMNS.index("step")
_DATA_AT = WRITE_COLUMNS.index("data")
_BLOB_AT = WRITE_COLUMNS.index("tensors")
_FLAGS_AT = WRITE_COLUMNS.index("change_flags")

#: (task_id, step, key, digest) of a row at one tracked path.
_Entry = tuple[Any, Any, int, "str | None"]


def check_path(path: Any) -> FieldPath:
    """The field ``path`` names, or InvalidArgumentError saying which paths can be tracked."""
    try:
        field = resolve_field(path)
    except QueryError as exc:
        raise InvalidArgumentError(
            f"cannot track changes of {path!r}: {exc}. Nothing was changed"
        ) from None
    return field


def _mask(slot: int) -> int:
    """Both bits of ``slot``."""
    return flag_bit(slot, False) | flag_bit(slot, True)


def digest_of(field: FieldPath, values: Sequence[Any], row_id: str) -> str | None:
    """The digest at ``field`` of one encoded row (WRITE_COLUMNS order; its document as
    JSON text or already parsed)."""
    if field.column is not None:
        return _column_digest(field, values[WRITE_COLUMNS.index(field.column.name)])
    return _payload_digest(field, values[_DATA_AT], values[_BLOB_AT], row_id)


def _column_digest(field: FieldPath, value: Any) -> str | None:
    """A column's digest, its value as the column's type (an int in a float column, as
    a write may hand it over, reads back as a float)."""
    assert field.column is not None
    if value is not None and field.column.python is float and type(value) is not float:
        value = float(value)
    return column_digest(value)


def _payload_digest(field: FieldPath, doc: Any, blob: Any, row_id: str) -> str | None:
    if type(doc) is not dict:
        doc = json.loads(doc)
    node = node_at(doc, str(field.top), field.steps)
    part = None if blob is None else PartDecoder(blob, row_id)
    try:
        return value_digest(node, part, field.canonical)
    except CodecError as exc:
        raise CodecError(f"tracking {field.canonical}: {exc}") from exc


def _bits(found: list[_Entry], slot: int) -> dict[int, int]:
    """The bits of ``slot`` of every row of ``found`` (rows of whole tasks, none without a
    task): a row's previous step is the last row (by key) of the step group before its own
    in its task, its next the first row of the group after."""
    found.sort(key=lambda r: (r[0], r[1], r[2]))
    groups: list[tuple[Any, int, int]] = []  # (task_id, start, stop) of each step group
    start, n = 0, len(found)
    while start < n:
        task, step = found[start][0], found[start][1]
        stop = start + 1
        while stop < n and found[stop][1] == step and found[stop][0] == task:
            stop += 1
        groups.append((task, start, stop))
        start = stop
    previous, following = flag_bit(slot, False), flag_bit(slot, True)
    bits: dict[int, int] = {}
    for g, (task, start, stop) in enumerate(groups):
        before = after = None
        if g and groups[g - 1][0] == task:
            before = found[groups[g - 1][2] - 1][3]
        if g + 1 < len(groups) and groups[g + 1][0] == task:
            after = found[groups[g + 1][1]][3]
        for i in range(start, stop):
            digest = found[i][3]
            value = 0
            if digest is not None:
                if digest == before:
                    value |= previous
                if digest == after:
                    value |= following
            bits[found[i][2]] = value
    return bits


def _stored(
    conn: Connection, buffer_id: int, path_id: int, tasks: list[Any]
) -> tuple[list[_Entry], dict[int, int]]:
    """The entries of the stored rows of ``tasks`` at the tracked path, and their
    ``change_flags`` by key."""
    joined = rows.join(changes, and_(changes.c.key == rows.c.key, changes.c.path_id == path_id))
    base = (
        select(rows.c.task_id, rows.c.step, rows.c.key, changes.c.digest, rows.c.change_flags)
        .select_from(joined)
        .where(rows.c.buffer_id == buffer_id, rows.c.task_id.is_not(None))
    )
    parts = [base.where(rows.c.task_id.in_(tasks[i : i + _CHUNK]))
             for i in range(0, len(tasks), _CHUNK)]  # fmt: skip
    entries: list[_Entry] = []
    flags: dict[int, int] = {}
    for part in parts:
        for task, step, key, digest, value in conn.execute(part):
            entries.append((task, step, int(key), digest))
            flags[int(key)] = int(value)
    return entries, flags


def refresh(
    conn: Connection,
    buffer_id: int,
    paths: Iterable[TrackedPath],
    tasks: Iterable[Any],
    new: Mapping[int, list[_Entry]] | None = None,
) -> dict[int, int]:
    """Set the flags at ``paths`` of the stored rows of ``tasks`` from the digests stored
    (after a removal: of the tasks of the rows it removed), with the rows about to be
    inserted (``new``: their entries by path id, under keys above every stored one) as
    their neighbours; rewrites the stored rows whose flags change and returns the new
    rows' flags by key."""
    tasks = sorted(tasks)
    stored_flags: dict[int, int] = {}
    computed: dict[int, int] = {}
    mask = 0
    for path in paths:
        entries, flags = _stored(conn, buffer_id, path.id, tasks)
        stored_flags.update(flags)
        if new is not None:
            entries += new.get(path.id, [])
        mask |= _mask(path.slot)
        for key, bits in _bits(entries, path.slot).items():
            computed[key] = computed.get(key, 0) | bits
    changed = {}
    for key, old in stored_flags.items():
        value = (old & ~mask) | computed.get(key, 0)
        if value != old:
            changed[key] = value
    _rewrite(conn, changed)
    return {key: value for key, value in computed.items() if key not in stored_flags}


#: Postgres: rows' flags in one statement of two arrays (an executemany sends a statement a
#: row).
_REWRITE = text(
    "UPDATE expstore_rows SET change_flags = t.v "
    "FROM unnest(CAST(:keys AS BIGINT[]), CAST(:values AS BIGINT[])) AS t(k, v) "
    "WHERE expstore_rows.key = t.k"
)


def _rewrite(conn: Connection, flags: dict[int, int]) -> None:
    """Set these rows' ``change_flags`` (by key)."""
    if not flags:
        return
    pairs = sorted(flags.items())
    if conn.dialect.name != "postgresql":
        stmt = update(rows).where(rows.c.key == bindparam("k")).values(change_flags=bindparam("v"))
        conn.execute(stmt, [{"k": k, "v": v} for k, v in pairs])
        return
    for i in range(0, len(pairs), _CHUNK * 20):
        part = pairs[i : i + _CHUNK * 20]
        conn.execute(_REWRITE, {"keys": [k for k, _ in part], "values": [v for _, v in part]})


@dataclass
class Pending:
    """A write's new rows as :func:`before_insert` left them: each row's id, task and
    digest at each tracked path (in the order of ``paths``), for :func:`after_insert`."""

    paths: list[TrackedPath]
    noted: list[tuple[str, Any, list[str | None]]] = field(default_factory=list)
    tasks: set[Any] = field(default_factory=set)


def before_insert(
    conn: Connection,
    buffer_id: int,
    found: dict[str, TrackedPath],
    chunks: Iterable[list[tuple[Any, ...]]],
    newest: int,
) -> tuple[list[list[tuple[Any, ...]]], Pending]:
    """The encoded ``chunks`` of a write with each row's ``change_flags`` set at the tracked
    paths ``found``, in the caller's transaction (which holds the buffer's row; ``newest``
    is the buffer's largest key, below the keys the rows will get, in their order); the
    stored rows of their tasks whose flags change are rewritten. The chunks are read whole:
    a row's next step may come in a later one."""
    fields = [check_path(path) for path in found]
    pending = Pending(list(found.values()))
    entries: dict[int, list[_Entry]] = {path.id: [] for path in pending.paths}
    out = [list(chunk) for chunk in chunks]
    key = newest
    for chunk in out:
        for values in chunk:
            key += 1
            row_id, task = values[_ID_AT], values[_TASK_AT]
            digests = [digest_of(f, values, row_id) for f in fields]
            pending.noted.append((row_id, task, digests))
            if task is None:
                continue
            pending.tasks.add(task)
            for path, digest in zip(pending.paths, digests, strict=True):
                entries[path.id].append((task, values[_STEP_AT], key, digest))
    flags = refresh(conn, buffer_id, pending.paths, pending.tasks, entries)
    key = newest
    for chunk in out:
        for at, values in enumerate(chunk):
            key += 1
            value = flags.get(key, 0)
            if value:
                chunk[at] = (*values[:_FLAGS_AT], value, *values[_FLAGS_AT + 1 :])
    return out, pending


def after_insert(conn: Connection, buffer_id: int, pending: Pending, keys: dict[str, int]) -> None:
    """The digests of the rows just inserted (``keys``: their keys by id) at the tracked
    paths, in the caller's transaction. Their flags went in with them, computed for keys
    in the order they were written in; should the database have handed keys out in
    another order (or left a row out), the flags of their tasks are set again."""
    inserted = [keys.get(row_id, -1) for row_id, _, _ in pending.noted]
    for at, path in enumerate(pending.paths):
        fresh = [(key, digests[at]) for key, (_, _, digests) in zip(inserted, pending.noted,
                 strict=True) if key >= 0]  # fmt: skip
        _insert(conn, path.id, fresh)
    # Keys are positive: a row left out (-1) is out of order too.
    in_order = all(a < b for a, b in zip([0, *inserted], inserted, strict=False))
    if not in_order:
        refresh(conn, buffer_id, pending.paths, pending.tasks)


def tasks_of(conn: Connection, handle: BufferHandle, keys: Sequence[int]) -> set[Any]:
    """The task ids of the rows with these keys (a removal's, before it)."""
    stmt = select(rows.c.task_id).where(handle.dialect.key_in(rows.c.key)).distinct()
    found = conn.execute(stmt, {"keys": handle.dialect.key_set(list(keys))}).scalars()
    return {t for t in found if t is not None}


#: Postgres: new rows' digests in one statement of two arrays.
_UNNEST = text(
    "INSERT INTO expstore_changes (path_id, key, digest) "
    "SELECT :path_id, k, d FROM unnest(CAST(:keys AS BIGINT[]), CAST(:digests AS VARCHAR[])) "
    "AS t(k, d)"
)


def _insert(conn: Connection, path_id: int, fresh: list[tuple[int, str | None]]) -> None:
    if not fresh:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(
            insert(changes).values(path_id=path_id),
            [{"key": key, "digest": digest} for key, digest in fresh],
        )
        return
    for i in range(0, len(fresh), _CHUNK * 20):
        part = fresh[i : i + _CHUNK * 20]
        conn.execute(
            _UNNEST,
            {"path_id": path_id, "keys": [k for k, _ in part], "digests": [d for _, d in part]},
        )


def track(handle: BufferHandle, conn: Connection, path: Any) -> bool:
    """Track ``path`` in the caller's transaction (which holds the buffer's row): the
    digests and flags of every stored row; whether it was not tracked already."""
    field = check_path(path)
    buffer_id = handle.buffer_id
    found = read_tracked(conn, buffer_id)
    if field.canonical in found:
        return False
    taken = {p.slot for p in found.values()}
    free = [slot for slot in range(MAX_TRACKED) if slot not in taken]
    if not free:
        raise InvalidArgumentError(
            f"cannot track changes of {field.canonical}: the buffer tracks {MAX_TRACKED} "
            f"paths already, the most it can ({', '.join(sorted(found))}); untrack_changes "
            "one it no longer needs first. Nothing was changed"
        )
    conn.execute(
        insert(tracked_paths).values(buffer_id=buffer_id, path=field.canonical, slot=free[0])
    )
    mine = read_tracked(conn, buffer_id)[field.canonical]
    read = [rows.c.key, rows.c.id]
    if field.column is not None:
        read.append(rows.c[field.column.name])
    else:
        read += [rows.c.data, rows.c.tensors]
    after = None
    while True:  # every row's digest, a page at a time
        stmt = select(*read).where(rows.c.buffer_id == buffer_id)
        if after is not None:
            stmt = stmt.where(rows.c.key > after)
        got = conn.execute(stmt.order_by(rows.c.key).limit(_CHUNK * 2)).all()
        if not got:
            break
        after = got[-1][0]
        fresh = []
        for r in got:
            if field.column is not None:
                digest = _column_digest(field, r[2])
            else:
                digest = _payload_digest(field, r[2], r[3], r[1])
            fresh.append((int(r[0]), digest))
        _insert(conn, mine.id, fresh)
    for tasks in _task_pages(conn, buffer_id):  # the flags, a page of tasks at a time
        refresh(conn, buffer_id, [mine], tasks)
    return True


def _task_pages(conn: Connection, buffer_id: int) -> Iterator[list[Any]]:
    """The buffer's task ids in order, :data:`_CHUNK` at a time (by the ``(buffer_id,
    task_id, step)`` index), so that setting every row's flags holds one page's rows in
    memory, not the buffer's."""
    after: Any = None
    while True:
        stmt = select(rows.c.task_id).where(rows.c.buffer_id == buffer_id)
        stmt = stmt.where(rows.c.task_id.is_not(None) if after is None else rows.c.task_id > after)
        page = list(conn.execute(stmt.distinct().order_by(rows.c.task_id).limit(_CHUNK)).scalars())
        if not page:
            return
        yield page
        after = page[-1]


def untrack(handle: BufferHandle, conn: Connection, path: Any) -> bool:
    """Stop tracking ``path``: its bits of every row are cleared (its slot may be given to
    another path) and its digests go (ON DELETE CASCADE); whether it was tracked."""
    field = check_path(path)
    found = read_tracked(conn, handle.buffer_id).get(field.canonical)
    if found is None:
        return False
    mask = _mask(found.slot)
    flagged = rows.c.change_flags.op("&")(bindparam("mask", mask)) != 0
    conn.execute(
        update(rows)
        .where(rows.c.buffer_id == handle.buffer_id, flagged)
        .values(change_flags=rows.c.change_flags.op("&")(bindparam("keep", ~mask)))
    )
    conn.execute(delete(tracked_paths).where(tracked_paths.c.id == found.id))
    return True


class _TrackingFeature(RowFeature):
    """Tracked paths: a write sets its rows' change flags as they go in and notes their
    digests; a removal sets the flags of the tasks it touched again."""

    name = "tracking"
    order = 50

    def columns(self, buffer_id: Any) -> list[Any]:
        mine = tracked_paths.c.buffer_id == buffer_id
        return [select(tracked_paths.c.id).where(mine).exists()]

    def setting(self, values: Sequence[Any]) -> Any:
        return True if values[0] else None

    def before_insert(self, ctx: WriteContext, setting: Any) -> None:
        tracked = read_tracked(ctx.conn, ctx.handle.buffer_id)
        if not tracked or not ctx.stored:
            return
        flagged, pending = before_insert(
            ctx.conn, ctx.handle.buffer_id, tracked, ctx.chunks, ctx.state.newest
        )
        ctx.chunks = iter(flagged)
        ctx.notes[self.name] = pending

    def after_insert(self, ctx: WriteContext, setting: Any) -> None:
        pending = ctx.notes.get(self.name)
        if pending is not None:
            after_insert(ctx.conn, ctx.handle.buffer_id, pending, ctx.new_keys())

    def before_remove(self, ctx: RemoveContext, setting: Any) -> None:
        tracked = read_tracked(ctx.conn, ctx.handle.buffer_id)
        if tracked:
            ctx.notes[self.name] = (tracked, tasks_of(ctx.conn, ctx.handle, ctx.keys))

    def after_remove(self, ctx: RemoveContext, setting: Any) -> None:
        found = ctx.notes.get(self.name)
        if found is not None:  # their digests went with them: their tasks' flags anew
            tracked, touched = found
            refresh(ctx.conn, ctx.handle.buffer_id, tracked.values(), touched)


register(_TrackingFeature())
