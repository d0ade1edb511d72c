"""Reading whole rows: by id, by key, by condition (streamed), by page and by task.

A stored row becomes a :class:`~expstore.DataRow` again without validating it a second
time (it was validated when it was stored); its payload goes through the codec.
"""

from __future__ import annotations

import base64
import gc
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import Connection, Integer, Row, Select, Text, bindparam, cast, func, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from .._args import check_int
from ..arrays.stored_once import digests_in, fetch_arrays
from ..codec import decode_payload, plain_document
from ..codec.decode import Arrays
from ..codec.documents import DocumentDecoder
from ..codec.format import MALFORMED
from ..db.handle import BufferHandle
from ..db.row_ids import by_keys
from ..db.schema import buffers, rows
from ..errors import CodecError, InvalidArgumentError, UnsupportedTypeError
from ..lifecycle.registry import buffer_row
from ..model.layout import (
    COLUMNS,
    COLUMNS_BY_NAME,
    META_COLUMNS,
    ORDERABLE,
    PAYLOAD_FIELDS,
    SCALAR_COLUMNS,
)
from ..model.rows import DataRow, Experience, ExpMeta, trusted_many
from ..query import QueryCondition

__all__ = ["CHUNK", "ROW_COLUMNS", "ReadAlready", "RowReader", "key_list"]

#: Rows fetched per round trip when streaming a query.
CHUNK = 1000

#: What a whole-row read selects: every column a DataRow needs, the key first. The document
#: comes as JSON text, parsed in :func:`decode_row`, so a damaged one is reported with its
#: row's id (Postgres would parse JSONB in the driver, SQLite in SQLAlchemy, without it).
ROW_COLUMNS: list[Any] = [
    rows.c.key,
    *(
        cast(c, Text).label("data") if c.name == "data" else c
        for c in rows.c
        if c.name not in ("key", "buffer_id", "content_hash", "change_flags")
    ),
]
_NAMES = [c.name for c in ROW_COLUMNS]
_AT_ID, _AT_DATA, _AT_TENSORS = (_NAMES.index(n) for n in ("id", "data", "tensors"))
_meta_values = itemgetter(*(_NAMES.index(c) for c in META_COLUMNS))
_scalar_values = itemgetter(*(_NAMES.index(c) for c in SCALAR_COLUMNS))
_EXPERIENCE_FIELDS = tuple(Experience.model_fields)
_payload_values = itemgetter(*PAYLOAD_FIELDS)
#: The experience's fields in model order, out of (payload fields..., scalar columns...).
_experience_values = itemgetter(
    *((*PAYLOAD_FIELDS, *SCALAR_COLUMNS).index(name) for name in _EXPERIENCE_FIELDS)
)
_text, _blob, _row_id = itemgetter(_AT_DATA), itemgetter(_AT_TENSORS), itemgetter(_AT_ID)
_task_of = itemgetter(_NAMES.index("task_id"))
_TEXT = (_AT_DATA,)
#: (position, column, the types its values may have) of every typed column, to tell a
#: value SQLite let through in the wrong type (its columns take any) from a good one.
_TYPED = tuple((_NAMES.index(spec.name), spec.name, spec.stored_types) for spec in COLUMNS)
_TYPED_SETS = tuple((at, frozenset(kinds)) for at, _, kinds in _TYPED)


def key_list(keys: Sequence[int] | np.ndarray) -> list[int]:
    """Keys as a flat list of Python ints."""
    return np.asarray(keys, dtype=np.int64).reshape(-1).tolist()


def decode_rows(
    fetched: Sequence[Row[Any] | Sequence[Any]],
    documents: DocumentDecoder,
    arrays: Arrays | None = None,
) -> list[DataRow]:
    """:func:`decode_row` of many rows, done over the batch rather than row by row: the
    typed columns checked column by column, the rows of each learned document text decoded
    together (:meth:`DocumentDecoder.decode_many`), each model's objects made at once
    (:func:`~expstore.model.rows.trusted_many`), and Python's cyclic garbage collector paused
    meanwhile (the rows hold no cycles; a batch of 256 rows otherwise triggers several
    collections). ``arrays``: the stored arrays the rows refer to by digest (fetched in
    the same read, :func:`arrays_of`)."""
    checked = all(
        set(map(type, map(itemgetter(at), fetched))) <= kinds for at, kinds in _TYPED_SETS
    )
    with collector_paused():
        payloads = documents.decode_many(
            list(map(_text, fetched)), list(map(_blob, fetched)), list(map(_row_id, fetched))
        )
        values = [
            _values(r, payload, checked, arrays)
            for r, payload in zip(fetched, payloads, strict=True)
        ]
        metas = trusted_many(
            ExpMeta, map(dict, map(zip, repeat(META_COLUMNS), map(_meta_values, fetched)))
        )
        data = trusted_many(
            Experience,
            map(dict, map(zip, repeat(_EXPERIENCE_FIELDS), map(_experience_values, values))),
        )
        ids = map(_row_id, fetched)
        return trusted_many(
            DataRow,
            [
                {"exp_meta": meta, "exp_data": datum, "id": row_id}
                for meta, datum, row_id in zip(metas, data, ids, strict=True)
            ],
        )


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, if it was on (a batch of rows
    holds no cycles; the objects are freed by reference counting as always)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def decode_row(
    r: Row[Any] | Sequence[Any],
    documents: DocumentDecoder | None = None,
    arrays: Arrays | None = None,
) -> DataRow:
    """The DataRow a whole-row read (:data:`ROW_COLUMNS`) fetched; CodecError naming the
    row when what is stored is damaged. ``documents`` remembers document texts that repeat
    (see :mod:`expstore.codec.documents`)."""
    return decode_rows([r], DocumentDecoder() if documents is None else documents, arrays)[0]


def arrays_of(
    conn: Connection, buffer_id: int, fetched: Sequence[Sequence[Any]], at: Sequence[int]
) -> dict[str, bytes]:
    """The stored arrays that the JSON texts at positions ``at`` of the fetched rows refer
    to by digest, read on ``conn`` (the same read as the rows: one snapshot)."""
    if not fetched or not at:
        return {}
    digests = digests_in(r[i] for r in fetched for i in at)
    return fetch_arrays(conn, buffer_id, digests) if digests else {}


def _values(
    r: Row[Any] | Sequence[Any],
    payload: dict[str, Any] | None,
    checked: bool,
    arrays: Arrays | None = None,
) -> tuple[Any, ...]:
    """The row's payload fields, then its scalar columns (the experience's values, see
    ``_experience_values``); ``payload``: the document decoded already, else None (parsed
    and decoded here); ``checked``: the typed columns' values were checked already.
    CodecError naming the row when what is stored is damaged."""
    row_id = r[_AT_ID]
    if payload is None:
        try:
            doc = json.loads(r[_AT_DATA])
        except (ValueError, TypeError, RecursionError) as exc:
            raise CodecError(
                f"row {row_id}: the stored document is not readable JSON "
                f"({type(exc).__name__}); {MALFORMED}"
            ) from None
        if type(doc) is dict and plain_document(r[_AT_DATA], r[_AT_TENSORS]):
            payload = doc  # nothing in it to decode
        else:
            payload = decode_payload(doc, r[_AT_TENSORS], row_id=row_id, arrays=arrays)
    try:
        values: tuple[Any, ...] = _payload_values(payload) + _scalar_values(r)
    except KeyError:
        missing = [name for name in PAYLOAD_FIELDS if name not in payload]
        raise CodecError(
            f"row {row_id}: the stored document lacks {missing}; {MALFORMED}"
        ) from None
    for at, name, kinds in () if checked else _TYPED:
        value = r[at]
        if type(value) not in kinds:
            raise CodecError(
                f"row {row_id}: column {name} holds {value!r}, not a {kinds[0].__name__}; "
                f"{MALFORMED}"
            )
    return values


#: The most rows one page may hold.
MAX_PAGE = 10_000


class RowsPage(NamedTuple):
    """A page of rows (see :meth:`expstore.ReplayBuffer.page`): the rows, the cursor of
    the next page (None after the last) and the rows' keys (insertion order)."""

    rows: list[DataRow]
    next: str | None
    keys: list[int]


#: The longest cursor :func:`_position` reads (a position holds a key and one column's value).
_MAX_CURSOR = 16 * 1024


def _cursor(position: tuple[Any, ...]) -> str:
    """An opaque, URL-safe cursor for a keyset position."""
    text = json.dumps(list(position), separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _position(cursor: Any, column_name: str) -> tuple[Any, ...]:
    """The keyset position of a cursor made by :func:`_cursor` for ``column_name``;
    InvalidArgumentError for anything else."""
    want = 1 if column_name == "key" else 2
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode()).decode()
        # (longer than any position, or a list nested thousands deep: never a cursor)
        position: Any = json.loads(text) if len(cursor) <= _MAX_CURSOR else None
    except (TypeError, ValueError, UnicodeError, AttributeError, RecursionError):
        position = None
    kinds = {
        "number": (int, float),
        "string": (str,),
        "bool": (bool,),
    }
    column = None if column_name == "key" else COLUMNS_BY_NAME.get(column_name)
    ok = (
        isinstance(position, list)
        and len(position) == want
        and type(position[-1]) is int
        and -(2**63) <= position[-1] < 2**63
        and (
            want == 1
            or (
                column is not None
                and isinstance(position[0], kinds[column.kind])
                and (column.kind == "bool" or type(position[0]) is not bool)
                and (not isinstance(position[0], int) or -(2**63) <= position[0] < 2**63)
            )
        )
    )
    if not ok:
        raise InvalidArgumentError(
            f"page cursor {str(cursor)[:40]!r} is not one this buffer gave for order_by "
            f"{column_name!r}; start from the first page (after=None)"
        )
    return tuple(position)


def _ordering(order_by: Any) -> tuple[str, bool]:
    """``(column, descending)`` of an ``order_by`` (``"step"``, ``"-key"``...)."""
    if not isinstance(order_by, str):
        raise UnsupportedTypeError(f"order_by must be a column name, got {order_by!r}")
    column_name = order_by.lstrip("-")
    if column_name not in ORDERABLE:
        raise InvalidArgumentError(
            f"order_by must be one of {ORDERABLE} (optionally with '-'), got {order_by!r}"
        )
    return column_name, order_by.startswith("-")


class ReadAlready:
    """Whole rows as another statement read them (:data:`ROW_COLUMNS`: a claim's own,
    which reads the rows it takes), as a :class:`~expstore.storage.cache.RawRows` source:
    those rows are served as read, other keys read by ``reader``."""

    def __init__(self, reader: RowReader, read: Sequence[Sequence[Any]]) -> None:
        self._reader = reader
        self._read = {int(r[0]): tuple(r) for r in read}
        if self._read:  # a call by id soon after finds these rows by key
            reader.handle.remember_keys(list(self._read.values()), _AT_ID)

    def read_raw(self, keys: list[int]) -> tuple[list[tuple[Any, ...]], dict[str, bytes]]:
        here = [self._read[k] for k in keys if k in self._read]
        rest = [k for k in keys if k not in self._read]
        found: dict[str, bytes] = {}
        if rest:
            more, found = self._reader.read_raw(rest)
            here += map(tuple, more)
        digests = digests_in(r[_AT_DATA] for r in here)
        if digests - found.keys():  # arrays stored once, which the rows refer to
            handle = self._reader.handle
            with handle.errors("fetch rows"), handle.read() as conn:
                found = {**found, **fetch_arrays(conn, handle.buffer_id, digests)}
        return here, found

    def decode_raw(self, raw: Sequence[tuple[Any, ...]], arrays: dict[str, bytes]) -> list[DataRow]:
        return self._reader.decode_raw(raw, arrays)

    def digests_of(self, raw: tuple[Any, ...]) -> list[str]:
        return self._reader.digests_of(raw)


class RowReader:
    """Whole rows of one buffer."""

    def __init__(self, handle: BufferHandle) -> None:
        self.handle = handle
        self.documents = DocumentDecoder()

    def _select(self, query_condition: QueryCondition = None) -> Select[Any]:
        return select(*ROW_COLUMNS).where(*self.handle.where(query_condition))

    def rows_by_keys(self, keys: list[int], columns: Sequence[Any]) -> list[Any]:
        """``columns`` (``columns[0]`` the key) of the buffer's rows among the distinct
        ``keys``, in no particular order (see :func:`by_keys`)."""
        return self.rows_with_arrays(keys, columns, ())[0]

    def rows_with_arrays(
        self, keys: list[int], columns: Sequence[Any], texts_at: Sequence[int]
    ) -> tuple[list[Any], dict[str, bytes]]:
        """:meth:`rows_by_keys`, and in the same read the stored arrays the JSON texts at
        positions ``texts_at`` refer to by digest."""
        handle = self.handle
        with handle.errors("fetch rows"), handle.read() as conn:
            fetched = by_keys(handle, conn, keys, columns)
            found = arrays_of(conn, handle.buffer_id, fetched, texts_at)
        at_id = next((i for i, c in enumerate(columns) if c is rows.c.id), None)
        if at_id is not None:  # a call by id soon after finds these rows by key
            handle.remember_keys(fetched, at_id)
        return fetched, found

    def read_raw(self, keys: list[int]) -> tuple[list[tuple[Any, ...]], dict[str, bytes]]:
        """The whole rows among the distinct ``keys`` as read (:data:`ROW_COLUMNS`, the key
        first, the id second), in no particular order, and the stored arrays they refer to
        by digest (what the row cache keeps, :mod:`expstore.storage.cache`)."""
        return self.rows_with_arrays(keys, ROW_COLUMNS, (_AT_DATA,))

    def decode_raw(self, raw: Sequence[tuple[Any, ...]], arrays: dict[str, bytes]) -> list[DataRow]:
        """The rows as :meth:`read_raw` read them, decoded (new objects every call)."""
        return decode_rows(raw, self.documents, arrays)

    def digests_of(self, raw: tuple[Any, ...]) -> list[str]:
        """The digests of the stored arrays a row as read refers to."""
        return sorted(digests_in([raw[_AT_DATA]]))

    def fetch_keys(self, keys: Sequence[int] | np.ndarray) -> list[DataRow]:
        """The rows with these keys in the given order (repeats allowed; vanished keys
        skipped)."""
        wanted = key_list(keys)
        fetched, found_arrays = self.rows_with_arrays(
            list(dict.fromkeys(wanted)), ROW_COLUMNS, (_AT_DATA,)
        )
        decoded = decode_rows(
            fetched, self.documents, found_arrays
        )  # (the collector paused, not over
        # the round trip, which may wait on a lock or a replica)
        found = dict(zip(map(itemgetter(0), fetched), decoded, strict=True))
        return [found[k] for k in wanted if k in found]

    def raise_damaged(self, keys: list[int]) -> None:
        """CodecError naming the rows among ``keys`` whose stored document is not valid
        JSON (only SQLite can hold one); nothing if none is."""
        handle = self.handle
        if handle.dialect.name != "sqlite":
            return
        stmt = select(rows.c.id).where(
            handle.dialect.key_in(),
            rows.c.buffer_id == handle.buffer_id,
            ~func.json_valid(rows.c.data),
        )
        with handle.errors("find damaged rows"), handle.read() as conn:
            damaged = list(conn.execute(stmt, {"keys": handle.dialect.key_set(keys)}).scalars())
        if damaged:
            raise CodecError(
                f"row {damaged[0]}: the stored document is not valid JSON"
                f"{f' (and {len(damaged) - 1} more rows)' if len(damaged) > 1 else ''}; "
                f"{MALFORMED}"
            )

    def get(self, row_id: str) -> DataRow | None:
        with self.handle.errors("read a row"), self.handle.read() as conn:
            found = conn.execute(self._select().where(rows.c.id == row_id)).first()
            held = {} if found is None else arrays_of(conn, self.handle.buffer_id, [found], _TEXT)
        return None if found is None else decode_row(found, None, held)

    def count(self, query_condition: QueryCondition = None) -> int:
        """The matching rows; every row of the buffer by its row count, not counted."""
        with self.handle.errors("count rows"), self.handle.read() as conn:
            if query_condition is None:
                return int(buffer_row(self.handle, conn, buffers.c.row_count)[0])
            where = self.handle.where(query_condition)
            counted = select(func.count()).select_from(rows).where(*where)
            return int(conn.execute(counted).scalar_one())

    def query(
        self, query_condition: QueryCondition, *, limit: int | None, offset: int, order_by: str
    ) -> Iterator[DataRow]:
        """Stream matching rows, ``CHUNK`` at a time, in ``order_by`` order (a column of
        :data:`~expstore.model.layout.ORDERABLE`, ``key`` being insertion order, with a leading
        ``-`` for descending). Each chunk is fetched in its own short read by keyset
        pagination, so the table is never loaded whole and no connection is held between
        chunks: the loop body may write to the buffer."""
        column_name, descending = _ordering(order_by)
        check_int("limit", limit, minimum=0, optional=True)
        check_int("offset", offset, minimum=0)
        where = self.handle.where(query_condition)  # compile now: errors surface at the call
        return self._stream(where, column_name, descending, limit, offset)

    def _stream(
        self,
        where: list[ColumnElement[bool]],
        column_name: str,
        descending: bool,
        limit: int | None,
        offset: int = 0,
    ) -> Iterator[DataRow]:
        position: tuple[Any, ...] | None = None
        remaining = limit
        while remaining is None or remaining > 0:
            size = CHUNK if remaining is None else min(CHUNK, remaining)
            chunk, held, position = self._chunk(
                where, column_name, descending, size, position, skip=offset
            )
            offset = 0  # the next chunks follow the last row read
            yield from decode_rows(chunk, self.documents, held)
            if position is None:
                return
            if remaining is not None:
                remaining -= len(chunk)

    def _chunk(
        self,
        where: list[ColumnElement[bool]],
        column_name: str,
        descending: bool,
        size: int,
        after: tuple[Any, ...] | None,
        whole: bool = True,
        skip: int = 0,
    ) -> tuple[list[Any], dict[str, bytes], tuple[Any, ...] | None]:
        """Up to ``size`` matching rows (undecoded; without ``whole``, only their keys and the
        order's column) after the position ``after`` in the order (and ``skip`` more),
        the arrays they refer to (read in the same snapshot, :func:`arrays_of`), and the
        position of the last (None when no row follows it)."""
        column = rows.c[column_name]
        keys = (column, rows.c.key) if column_name != "key" else (rows.c.key,)
        order = [k.desc() if descending else k.asc() for k in keys]
        if column_name == "key":  # the (buffer_id, key) index, sought on both
            handle = self.handle
            where = [handle.dialect.in_key_order(handle.buffer_id), *where[1:]]
            by_buffer = rows.c.buffer_id.desc() if descending else rows.c.buffer_id.asc()
            order = [by_buffer, *order]
        shown = ROW_COLUMNS if whole else keys
        stmt = select(*shown).where(*where).order_by(*order).limit(size)
        if skip:
            stmt = stmt.offset(skip)
        if after is not None:
            cursor = tuple_(*keys)
            stmt = stmt.where(cursor < tuple_(*after) if descending else cursor > tuple_(*after))
        with self.handle.errors("query rows"), self.handle.read() as conn:
            if after is None:
                buffer_row(self.handle, conn)  # still the handle's buffer
            chunk = list(conn.execute(stmt).all())
            held = arrays_of(conn, self.handle.buffer_id, chunk, _TEXT) if whole else {}
        if len(chunk) < size:
            return chunk, held, None
        last = chunk[-1]._mapping
        return chunk, held, tuple(last[k.name] for k in keys)

    def rows_after(
        self, query_condition: QueryCondition, *, after: str | None, limit: int, order_by: str
    ) -> RowsPage:
        """One page of matching rows by keyset: up to ``limit`` after the cursor ``after``
        (None: from the first) in ``order_by`` order, and the cursor of the next page
        (None after the last). Each page costs the same wherever it is: an index range,
        never an OFFSET walk."""
        column_name, descending = _ordering(order_by)
        check_int("limit", limit, minimum=1, maximum=MAX_PAGE)
        where = self.handle.where(query_condition)
        position = None if after is None else _position(after, column_name)
        chunk, held, last = self._chunk(where, column_name, descending, limit, position)
        keys = [int(r._mapping["key"]) for r in chunk]
        rows_ = decode_rows(chunk, self.documents, held)
        return RowsPage(rows_, None if last is None else _cursor(last), keys)

    def keys_after(
        self, query_condition: QueryCondition, *, after: str | None, limit: int, order_by: str
    ) -> tuple[list[int], str | None]:
        """:meth:`rows_after` without the rows: the page's keys and the next cursor, read
        from the indexes alone (for a reader that fetches only the fields it shows)."""
        column_name, descending = _ordering(order_by)
        check_int("limit", limit, minimum=1, maximum=MAX_PAGE)
        where = self.handle.where(query_condition)
        position = None if after is None else _position(after, column_name)
        chunk, _, last = self._chunk(where, column_name, descending, limit, position, False)
        keys = [int(r._mapping["key"]) for r in chunk]
        return keys, None if last is None else _cursor(last)

    def task_rows(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """Every row of each task, ordered by step, then execute_time, then insertion."""
        wanted = list(dict.fromkeys(task_ids))
        grouped: dict[str, list[DataRow]] = {t: [] for t in wanted}
        handle, dialect = self.handle, self.handle.dialect

        def build() -> Select[Any]:
            order = (rows.c.task_id, rows.c.step, rows.c.execute_time, rows.c.key)
            mine = rows.c.buffer_id == bindparam("buffer_id", type_=Integer)
            chosen = select(*ROW_COLUMNS).where(mine, dialect.text_in(rows.c.task_id, "tasks"))
            return chosen.order_by(*order)

        # compiled once, the task ids bound as one parameter, the rows decoded together
        compiled = handle.statement(("task rows",), build)
        with handle.errors("read tasks"), handle.read() as conn:
            for start in range(0, len(wanted), 500):
                part = dialect.text_set(wanted[start : start + 500])
                fetched = compiled.run(conn, buffer_id=handle.buffer_id, tasks=part)
                held = arrays_of(conn, handle.buffer_id, fetched, _TEXT)
                decoded = decode_rows(fetched, self.documents, held)
                for task, row in zip(map(_task_of, fetched), decoded, strict=True):
                    grouped[task].append(row)
        return grouped

    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        stmt = (
            select(rows.c.task_id)
            .where(*self.handle.where(query_condition))
            .group_by(rows.c.task_id)
            .order_by(func.min(rows.c.key))
        )
        with self.handle.errors("list tasks"), self.handle.read() as conn:
            return list(conn.execute(stmt).scalars())
