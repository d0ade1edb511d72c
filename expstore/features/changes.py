"""Tracked paths: ``buffer.track_changes("exp_data.state.screenshot")`` keeps, per row, the
digest of the value at the path and whether it equals the previous and the next step's of
the same trajectory, so that ``changed(path)`` reads two flags through an index instead of
probing each row's neighbour.

The previous step of a row is the buffer's row of the same task_id with the largest step
below its own (ties by key); the next, the smallest step above (ties by key); a row whose
neighbour is missing, or whose value or the neighbour's is missing (digest NULL), is
``changed``. These are the semantics of the correlated probe the compiler uses for a path
no one tracks (see :meth:`expstore.query.compiler._Compiler.changed`), with digests of the
values in place of their JSON text: a small array in the row's blob compares by content
too (see :mod:`expstore.codec.tracked`).

The flags stay exact in the transaction of the rows: a write inserts each new row's digest
(computed from the rows it just encoded), then sets the flags of every row of the tasks it
touched; a removal (``delete``, eviction of any policy, retention) sets them again for the
tasks of the rows it removed, after them (their flags go with them, ON DELETE CASCADE), and
``clear`` leaves nothing to fix. Writers and removals of a buffer take turns on its row, and
``track_changes`` fills the flags of every stored row in one transaction holding it, so a
process killed at any point leaves the flags of the last committed transaction.

Cost: a write reads the digests of the tasks it touches (every step of each: one indexed
read per 500 tasks) and rewrites the flags that changed; trajectories of thousands of steps
written a step at a time pay for their length on each write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, insert, select, text, update

from ..codec.decode import PartDecoder
from ..codec.tracked import column_digest, node_at, value_digest
from ..db.dialects import WRITE_COLUMNS
from ..db.handle import BufferHandle
from ..db.schema import changes, rows, tracked_paths
from ..errors import CodecError, InvalidArgumentError, QueryError
from ..model.paths import FieldPath
from ..query.fields import resolve_field

__all__ = [
    "Noted",
    "after_insert",
    "check_path",
    "keys_above",
    "note",
    "refresh",
    "tasks_of",
    "track",
    "tracked",
    "untrack",
]

_CHUNK = 500
_ID_AT = WRITE_COLUMNS.index("id")
_TASK_AT = WRITE_COLUMNS.index("task_id")
_STEP_AT = WRITE_COLUMNS.index("step")
_DATA_AT = WRITE_COLUMNS.index("data")
_BLOB_AT = WRITE_COLUMNS.index("tensors")

#: Per new row: (id, task_id, step, the digest at each tracked path in order).
Noted = list[tuple[str, Any, Any, list[str | None]]]


def check_path(path: Any) -> FieldPath:
    """The field ``path`` names, or InvalidArgumentError saying which paths can be tracked."""
    try:
        field = resolve_field(path)
    except QueryError as exc:
        raise InvalidArgumentError(
            f"cannot track changes of {path!r}: {exc}. Nothing was changed"
        ) from None
    return field


def tracked(conn: Connection, buffer_id: int) -> dict[str, int]:
    """The buffer's tracked paths (canonical spelling) and their ids."""
    stmt = select(tracked_paths.c.path, tracked_paths.c.id).where(
        tracked_paths.c.buffer_id == buffer_id
    )
    return {str(path): int(i) for path, i in conn.execute(stmt)}


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


def note(
    chunks: Iterable[list[tuple[Any, ...]]], fields: Sequence[FieldPath], noted: Noted
) -> Iterator[list[tuple[Any, ...]]]:
    """``chunks`` as they are, noting each row's digests at ``fields`` on the way."""
    for chunk in chunks:
        for values in chunk:
            row_id = values[_ID_AT]
            noted.append(
                (
                    row_id,
                    values[_TASK_AT],
                    values[_STEP_AT],
                    [digest_of(f, values, row_id) for f in fields],
                )
            )
        yield chunk


def after_insert(
    conn: Connection, buffer_id: int, ids: Sequence[int], noted: Noted, keys: dict[str, int]
) -> None:
    """The digests and flags of rows just inserted (``keys``: their keys by id; rows not
    inserted left out) at the tracked paths ``ids`` (in the order of their digests in
    ``noted``), and the flags of the rows of their tasks they change, in the caller's
    transaction. Each new row is inserted with its flags final (no update of it)."""
    new = [(task, step, keys[row_id], digests) for row_id, task, step, digests in noted
           if row_id in keys]  # fmt: skip
    tasks = {task for task, _, _, _ in new if task is not None}
    for at, path_id in enumerate(ids):
        mine = [(task, step, key, digests[at], None, None) for task, step, key, digests in new]
        stored = _stored(conn, buffer_id, path_id, tasks)
        _set_flags(conn, path_id, stored + mine)


def keys_above(conn: Connection, buffer_id: int, newest: int) -> dict[str, int]:
    """The keys of the buffer's rows above ``newest`` by id: a write's own rows, when
    ``newest`` is the largest key before it (writers of a buffer take turns)."""
    stmt = select(rows.c.id, rows.c.key).where(rows.c.buffer_id == buffer_id, rows.c.key > newest)
    return {str(i): int(k) for i, k in conn.execute(stmt)}


def tasks_of(conn: Connection, handle: BufferHandle, keys: Sequence[int]) -> set[Any]:
    """The task ids of the rows with these keys (a removal's, before it)."""
    stmt = select(rows.c.task_id).where(handle.dialect.key_in(rows.c.key)).distinct()
    found = conn.execute(stmt, {"keys": handle.dialect.key_set(list(keys))}).scalars()
    return {t for t in found if t is not None}


def refresh(conn: Connection, buffer_id: int, path_id: int, tasks: Iterable[Any] | None) -> int:
    """Set the flags of every row of ``tasks`` (None: of the whole buffer) at the tracked
    path ``path_id`` from the digests stored; returns how many changed."""
    return _set_flags(conn, path_id, _stored(conn, buffer_id, path_id, tasks))


def _stored(
    conn: Connection, buffer_id: int, path_id: int, tasks: Iterable[Any] | None
) -> list[tuple[Any, ...]]:
    """(task_id, step, key, digest, same_previous, same_next) of the stored rows of
    ``tasks`` (None: every task) at the tracked path."""
    joined = rows.join(changes, and_(changes.c.key == rows.c.key, changes.c.path_id == path_id))
    base = (
        select(
            rows.c.task_id,
            rows.c.step,
            rows.c.key,
            changes.c.digest,
            changes.c.same_previous,
            changes.c.same_next,
        )  # fmt: skip
        .select_from(joined)
        .where(rows.c.buffer_id == buffer_id, rows.c.task_id.is_not(None))
    )
    if tasks is None:
        return [tuple(r) for r in conn.execute(base)]
    wanted = sorted(tasks)
    found: list[tuple[Any, ...]] = []
    for i in range(0, len(wanted), _CHUNK):
        part = base.where(rows.c.task_id.in_(wanted[i : i + _CHUNK]))
        found += [tuple(r) for r in conn.execute(part)]
    return found


def _set_flags(conn: Connection, path_id: int, found: list[tuple[Any, ...]]) -> int:
    """The flags of rows (task_id, step, key, digest, same_previous, same_next) of whole
    tasks: a row's previous step is the last row of the step group before its own in its
    task, its next the first row of the group after. Rows whose flags are None are new
    (inserted with theirs; a NULL task_id has no neighbour); stored rows whose flags differ
    are updated. Returns how many were written."""
    found.sort(key=lambda r: (r[0] is None, r[0] or "", r[1], r[2]))
    groups: list[tuple[Any, int, int]] = []  # (task_id, start, stop) of each step group
    start, n = 0, len(found)
    while start < n:
        task, step = found[start][0], found[start][1]
        stop = start + 1
        while stop < n and found[stop][1] == step and found[stop][0] == task:
            stop += 1
        groups.append((task, start, stop))
        start = stop
    wrong: list[dict[str, Any]] = []
    fresh: list[dict[str, Any]] = []
    for g, (task, start, stop) in enumerate(groups):
        before = after = None
        if task is not None:
            if g and groups[g - 1][0] == task:
                before = found[groups[g - 1][2] - 1][3]
            if g + 1 < len(groups) and groups[g + 1][0] == task:
                after = found[groups[g + 1][1]][3]
        for i in range(start, stop):
            _, _, key, digest, same_previous, same_next = found[i]
            sp = digest is not None and digest == before
            sn = digest is not None and digest == after
            if same_previous is None:
                fresh.append({"key": key, "digest": digest, "same_previous": sp, "same_next": sn})
            elif bool(same_previous) != sp or bool(same_next) != sn:
                wrong.append({"k": key, "sp": sp, "sn": sn})
    _insert(conn, path_id, fresh)
    if wrong:
        stmt = (
            update(changes)
            .where(changes.c.path_id == path_id, changes.c.key == bindparam("k"))
            .values(same_previous=bindparam("sp"), same_next=bindparam("sn"))
        )
        conn.execute(stmt, wrong)
    return len(wrong) + len(fresh)


#: Postgres: new rows' flags in one statement of four arrays (an executemany sends a
#: statement a row).
_UNNEST = text(
    "INSERT INTO expstore_changes (path_id, key, digest, same_previous, same_next) "
    "SELECT :path_id, k, d, p, n FROM unnest(CAST(:keys AS BIGINT[]), "
    "CAST(:digests AS VARCHAR[]), CAST(:previous AS BOOLEAN[]), CAST(:next AS BOOLEAN[])) "
    "AS t(k, d, p, n)"
)


def _insert(conn: Connection, path_id: int, fresh: list[dict[str, Any]]) -> None:
    if not fresh:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(insert(changes).values(path_id=path_id), fresh)
        return
    for i in range(0, len(fresh), _CHUNK * 20):
        part = fresh[i : i + _CHUNK * 20]
        conn.execute(
            _UNNEST,
            {
                "path_id": path_id,
                "keys": [f["key"] for f in part],
                "digests": [f["digest"] for f in part],
                "previous": [f["same_previous"] for f in part],
                "next": [f["same_next"] for f in part],
            },
        )


def track(handle: BufferHandle, conn: Connection, path: Any) -> bool:
    """Track ``path`` in the caller's transaction (which holds the buffer's row): the
    digests and flags of every stored row; whether it was not tracked already."""
    field = check_path(path)
    buffer_id = handle.buffer_id
    if field.canonical in tracked(conn, buffer_id):
        return False
    conn.execute(insert(tracked_paths).values(buffer_id=buffer_id, path=field.canonical))
    path_id = tracked(conn, buffer_id)[field.canonical]
    read = [rows.c.key, rows.c.id, rows.c.task_id, rows.c.step]
    if field.column is not None:
        read.append(rows.c[field.column.name])
    else:
        read += [rows.c.data, rows.c.tensors]
    found: list[tuple[Any, ...]] = []
    after = None
    while True:  # every row's digest (in memory: about 200 bytes a row), then the flags
        stmt = select(*read).where(rows.c.buffer_id == buffer_id)
        if after is not None:
            stmt = stmt.where(rows.c.key > after)
        got = conn.execute(stmt.order_by(rows.c.key).limit(_CHUNK)).all()
        if not got:
            break
        after = got[-1][0]
        for r in got:
            if field.column is not None:
                digest = _column_digest(field, r[4])
            else:
                digest = _payload_digest(field, r[4], r[5], r[1])
            found.append((r[2], r[3], r[0], digest, None, None))
    _set_flags(conn, path_id, found)
    return True


def untrack(handle: BufferHandle, conn: Connection, path: Any) -> bool:
    """Stop tracking ``path`` (its flags go, ON DELETE CASCADE); whether it was tracked."""
    field = check_path(path)
    stmt = delete(tracked_paths).where(
        tracked_paths.c.buffer_id == handle.buffer_id, tracked_paths.c.path == field.canonical
    )
    return bool(conn.execute(stmt).rowcount)
