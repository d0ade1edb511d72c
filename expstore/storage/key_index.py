"""The key index: the matching rows' keys and a few columns as numpy arrays, which samplers
choose from, cached per (condition, columns) and brought up to date cheaply.

Whether a cached index is current is told by the buffer's :class:`Signature`, read in one
round trip: rows added raise the largest key (writers hand keys out in commit order, see
:mod:`expstore.storage.writer`), FIFO eviction (which deletes only the oldest rows) raises
the smallest, a priority update bumps the priority version, any other change (a delete,
another eviction policy, a clear) bumps the version. So a cached index

- at the same signature is returned as it is (the very same array objects);
- after inserts fetches only the rows above its largest key;
- after FIFO eviction drops its front;
- after priority updates by any process patches its priorities from the priority log
  (:mod:`expstore.priorities`), or reloads when the log does not reach back;
- after any other change reloads.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import BigInteger, Boolean, Connection, Double, Integer, Row, select
from sqlalchemy.sql.elements import ColumnElement

from ..codec import PartDecoder
from ..db.dialects import Dialect
from ..db.handle import BufferHandle
from ..db.schema import priorities, rows
from ..errors import CodecError
from ..lifecycle.reader_state import Signature, State, moved_on, read_state
from ..priorities import logged_priorities
from ..query import QueryCondition, condition_key
from ..query.fields import resolve_field

__all__ = ["KeyIndex", "with_priorities"]

Arrays = dict[str, np.ndarray]


class Entry(NamedTuple):
    """One cached index: the arrays as they were at ``signature``."""

    signature: Signature
    arrays: Arrays


def _array_dtype(column: Any) -> Any:
    if isinstance(column.type, Double):
        return np.float64  # NULL becomes NaN
    if isinstance(column.type, BigInteger | Integer) and column.nullable:
        return np.float64  # policy_version: NULL becomes NaN (exact below 2**53)
    if isinstance(column.type, Boolean):
        return bool
    if isinstance(column.type, BigInteger | Integer):
        return np.int64
    return object


#: The numpy dtype of each column, from the schema's column types.
_DTYPES = {c.name: _array_dtype(c) for c in rows.c if c.name not in ("data", "tensors")}


class _Column(NamedTuple):
    """What the index selects for a requested name, and how its values become an array."""

    name: str
    selected: ColumnElement[Any]
    dtype: Any  # None for JSON text, decoded value by value


def _column(name: str, dialect: Dialect) -> _Column:
    """A requested column: ``priority``, a column by its bare or full name, or the JSON text
    at a payload path (by the path grammar of :mod:`expstore.model.paths`)."""
    if name == "priority":  # the row's entry in the narrow table, NULL when it has none
        stored = select(priorities.c.priority).where(priorities.c.key == rows.c.key)
        return _Column(name, stored.scalar_subquery(), np.float64)
    path = resolve_field(name)
    if path.column is not None:
        column = rows.c[path.column.name]
        return _Column(name, column, _DTYPES[column.name])
    return _Column(name, dialect.json_text(path), None)


class KeyIndex:
    """The cached key indexes of one buffer, least recently used first.

    :meth:`get` is what a storage's ``key_indexes`` does; :meth:`read` brings one index to
    a signature the caller gives, which lets a test stand at any moment of the buffer.
    """

    #: How many (condition, columns) indexes are kept.
    CAPACITY = 8

    def __init__(self, handle: BufferHandle) -> None:
        self.handle = handle
        self.entries: OrderedDict[tuple[str, tuple[str, ...]], Entry] = OrderedDict()
        #: Rows fetched from the database so far, to see what refreshing costs.
        self.rows_read = 0
        #: Told at each freshness check whether the buffer has a rate limit (read in the
        #: same round trip; see :mod:`expstore.limits.counters`).
        self.on_limit: Callable[[bool], None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "entries": OrderedDict(),
        }

    def clear(self) -> None:
        self.entries.clear()

    def signature(self, conn: Connection) -> Signature:
        """The buffer's signature now."""
        return self.state(conn)[0]

    def state_now(self) -> State:
        """:meth:`state` on a connection of its own."""
        with self.handle.errors("read the buffer's state"), self.handle.read() as conn:
            return self.state(conn)

    def state(self, conn: Connection) -> State:
        """The buffer's signature, its current policy version and its row count, in one
        round trip (:func:`~expstore.lifecycle.reader_state.read_state`), telling
        :attr:`on_limit` whether the buffer has a rate limit."""
        return read_state(self.handle, conn, self.on_limit)

    def get(self, requests: Sequence[tuple[QueryCondition, Sequence[str]]]) -> list[dict[str, Any]]:
        """The index for each ``(condition, columns)``, all at one signature, read in one
        connection. An index with ``policy_version`` also holds ``"current_version"``: the
        buffer's current policy version (None: never set), read in the same round trip."""
        dialect = self.handle.dialect
        plans = []
        for query_condition, names in requests:
            names = tuple(names)
            plans.append((query_condition, names, [_column(n, dialect) for n in names]))
        with self.handle.errors("index rows"), self.handle.read() as conn:
            signature, current, _ = self.state(conn)
            found = [self._read(conn, signature, *plan) for plan in plans]
        return [
            {**arrays, "current_version": current} if "policy_version" in plan[1] else arrays
            for arrays, plan in zip(found, plans, strict=True)
        ]

    def read(
        self,
        conn: Connection,
        signature: Signature,
        query_condition: QueryCondition,
        columns: Sequence[str],
    ) -> Arrays:
        """One index as it is at ``signature``: cached, brought up to date, or read."""
        dialect = self.handle.dialect
        names = tuple(columns)
        return self._read(
            conn, signature, query_condition, names, [_column(n, dialect) for n in names]
        )

    def _read(
        self,
        conn: Connection,
        signature: Signature,
        query_condition: QueryCondition,
        names: tuple[str, ...],
        selected: list[_Column],
    ) -> Arrays:
        cache_key = (condition_key(query_condition), names)
        cached = self.entries.get(cache_key)
        if cached is not None:
            self.entries.move_to_end(cache_key)
            if cached.signature == signature:
                return cached.arrays
        since, kept = None, None
        if cached is not None and moved_on(cached.signature, signature):
            # The same version: since then rows were only added (keys above the cached
            # max key) or evicted oldest first (every key below the buffer's min key).
            since, kept = cached.signature.max_key, cached.arrays
            start = int(np.searchsorted(kept["key"], signature.min_key))
            if start:
                kept = {k: v[start:] for k, v in kept.items()}
            if (
                cached.signature.priority_version != signature.priority_version
                and "priority" in kept
            ):
                # Priorities updated since (by any process): patch them from the log, or
                # read everything again if the log no longer reaches back that far.
                logged = logged_priorities(
                    self.handle, conn, cached.signature.priority_version, signature.priority_version
                )
                if logged is None:
                    since, kept = None, None
                else:
                    kept = with_priorities(kept, *logged)
        fetched: Sequence[Any] = ()
        if since is None or signature.max_key > since:
            # Up to the signature's max key only: rows committed after the signature was
            # read are left to the next call, so the cached arrays are exactly what the
            # signature describes (and a row is never fetched twice).
            stmt = select(rows.c.key, *(c.selected for c in selected))
            stmt = stmt.where(*self.handle.where(query_condition), rows.c.key <= signature.max_key)
            if since is not None:
                stmt = stmt.where(rows.c.key > since)
            fetched = conn.execute(stmt.order_by(rows.c.key)).all()
            self.rows_read += len(fetched)
        arrays = _to_arrays(fetched, selected)
        if kept is not None:
            arrays = {k: np.concatenate([kept[k], arrays[k]]) for k in arrays}
        for a in arrays.values():
            a.flags.writeable = False
        self.entries[cache_key] = Entry(signature, arrays)
        while len(self.entries) > self.CAPACITY:
            self.entries.popitem(last=False)
        return arrays

    def patch_priorities(self, seq: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Carry indexes that were current just before this process's priority update
        (priority version ``seq - 1``) over to ``seq``, with the new priorities."""
        for cache_key, (signature, arrays) in list(self.entries.items()):
            if signature.priority_version == seq - 1:
                moved = signature._replace(priority_version=seq)
                self.entries[cache_key] = Entry(moved, with_priorities(arrays, keys, values))


def with_priorities(arrays: Arrays, keys: np.ndarray, values: np.ndarray) -> Arrays:
    """``arrays`` with ``priority`` set to ``values`` at ``keys`` (those it holds); arrays
    without priorities as they are."""
    if "priority" not in arrays or not len(arrays["key"]):
        return arrays
    positions = np.searchsorted(arrays["key"], keys)
    inside = positions < len(arrays["key"])
    hit = inside.copy()
    hit[inside] = arrays["key"][positions[inside]] == keys[inside]
    priority = arrays["priority"].copy()
    priority[positions[hit]] = values[hit]
    priority.flags.writeable = False
    return {**arrays, "priority": priority}


def _to_arrays(fetched: Sequence[Row[Any]], columns: list[_Column]) -> Arrays:
    # zip(*rows) transposes in C: no Python-level loop per row, even at millions of rows.
    transposed = list(zip(*fetched, strict=True)) if fetched else [()] * (len(columns) + 1)
    out: Arrays = {"key": np.array(transposed[0], dtype=np.int64)}
    for column, values in zip(columns, transposed[1:], strict=True):
        if column.dtype is None:
            out[column.name] = _json_values(values)
            continue
        try:
            out[column.name] = np.array(values, dtype=column.dtype)
        except (TypeError, ValueError):  # SQLite holds text in a numeric column
            raise _damaged(column.name, out["key"], values) from None
    return out


def _damaged(name: str, keys: np.ndarray, values: Sequence[Any]) -> CodecError:
    """The error for a column whose values are not all of its type (damaged rows)."""
    pairs = zip(keys.tolist(), values, strict=True)
    key, value = next(
        ((k, v) for k, v in pairs if isinstance(v, (str, bytes)) or v is ...),
        (int(keys[0]), values[0]),
    )
    return CodecError(
        f"the row with key {key} holds {value!r} in column {name}, which is not a number; "
        "the stored row is damaged: delete it (buffer.delete(...)) and re-store it"
    )


def _json_value(text: str) -> Any:
    """A stored JSON part as the codec decodes it (NaN, escaped dicts); a tensor, which
    needs its row's blob, stays its placeholder."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise CodecError(
            f"a stored document holds {text[:40]!r}..., which is not JSON; the row is damaged: "
            "delete it and re-store it"
        ) from None
    try:
        return PartDecoder(None, "").decode_part(value, "value")
    except CodecError:
        return value


def _json_values(texts: Sequence[str | None]) -> np.ndarray:
    """The decoded values of JSON texts (None for SQL NULL and JSON null), each distinct
    text parsed once."""
    parsed: dict[str | None, Any] = {None: None}
    for text in set(texts):
        if text not in parsed:
            parsed[text] = _json_value(text)  # type: ignore[arg-type]
    return np.fromiter(map(parsed.__getitem__, texts), dtype=object, count=len(texts))
