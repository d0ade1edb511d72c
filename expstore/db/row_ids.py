"""Rows by key, and row ids to keys: the one way calls by id (priority updates, acks by id,
the duplicate check) find their rows.

An id is looked up in the ``(buffer_id, id)`` unique index, a random read per id that at
tens of millions of rows is a read from disk. Ids a process read lately come with their
keys (:meth:`BufferHandle.remember_keys`, fed by every fetch of whole rows or fields), so a
call by id soon after, such as a priority update of the batch just drawn, first checks
those keys by primary key, on pages the fetch has just read. Keys are never handed out
twice (Postgres takes them from a sequence; SQLite from ``expstore_counters``), so a
remembered key names its row or none (its id is checked anyway: a database made anew
under a running process hands keys out again): an id whose remembered key is gone is
looked up by id again (the row may have been stored anew under a new key).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select

from .handle import BufferHandle
from .schema import rows

__all__ = ["by_keys", "ids_to_keys"]

#: Ids per statement (drivers cap bound parameters).
_CHUNK = 5000


def ids_to_keys(handle: BufferHandle, conn: Connection, ids: Sequence[str]) -> dict[str, int]:
    """The keys of the buffer's rows with these ids (unknown ids left out)."""
    unique = list(dict.fromkeys(ids))
    found = _remembered(handle, conn, unique)
    rest = [i for i in unique if i not in found] if found else unique
    for start in range(0, len(rest), _CHUNK):
        stmt = handle.dialect.ids_statement(handle.buffer_id, rest[start : start + _CHUNK])
        found.update((row_id, key) for row_id, key in conn.execute(stmt))
    return found


def _remembered(handle: BufferHandle, conn: Connection, ids: list[str]) -> dict[str, int]:
    """The ids among ``ids`` whose remembered key still names a row of the buffer."""
    guessed = handle.remembered_keys(ids)
    if not guessed:
        return {}
    keys = list(set(guessed.values()))
    # The id is checked too: keys repeat when the database was made anew under this handle.
    present = {(r[0], r[1]) for r in by_keys(handle, conn, keys, [rows.c.key, rows.c.id])}
    return {i: k for i, k in guessed.items() if (k, i) in present}


def by_keys(
    handle: BufferHandle, conn: Connection, keys: list[int], columns: Sequence[Any]
) -> list[Any]:
    """``columns`` (``columns[0]`` the key) and then ``buffer_id`` of the buffer's rows
    among the distinct ``keys``, in no particular order, 5,000 keys per statement, on
    ``conn``."""
    # Keys are unique across buffers. The buffer is checked here rather than in the WHERE
    # clause, where it would lead SQLite to look each key up through the (buffer_id, key)
    # index and then the table, instead of the table alone.
    statement = handle.statement(
        ("by keys", *columns),
        lambda: select(*columns, rows.c.buffer_id).where(handle.dialect.key_in()),
    )
    buffer_id = handle.buffer_id
    fetched: list[Any] = []
    for start in range(0, len(keys), 5000):
        chunk = handle.dialect.key_set(keys[start : start + 5000])
        fetched += [r for r in statement.run(conn, keys=chunk) if r[-1] == buffer_id]
    return fetched
