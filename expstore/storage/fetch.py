"""Reading a few fields of chosen rows (``storage.fetch_columns``): which columns and
which parts of the JSON document to select, and how fetched rows become the values at the
paths, column by column.

A path into the payload (``exp_data.state.image_features``) is extracted by the database as
deep as it can address it, by the same SQL as conditions and key indexes use
(:func:`expstore.query.compiler.json_text`), as JSON text, so Python parses only that part:
for a tensor, just its placeholder, whose checked spec the codec keeps by its text. The rest
of the path (below a key SQL cannot spell, say) is walked in Python.

The database cannot see through the codec's escapes: a row whose deep part comes back NULL
(nothing there, or a dict on the way that the codec escaped) is read again by its whole
payload field, which gives exactly what decoding the whole row would.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy.sql.elements import ColumnElement

from ..codec import RESERVED_KEYS, BatchDecoder
from ..codec.decode import Arrays
from ..codec.encode import dump_document
from ..codec.format import MALFORMED
from ..db.dialects import WRITE_COLUMNS, Dialect
from ..db.schema import rows
from ..errors import CodecError, StorageError
from ..lifecycle.hooks import Fresh
from ..model.layout import COLUMNS_BY_NAME
from ..model.paths import FieldPath, parse_path, walk
from .base import Values
from .reader import RowReader, key_list

__all__ = ["FieldFetcher", "FieldPlan"]

#: Where each column is in a row as written (its encoded tuple).
_WRITTEN_AT = {name: i for i, name in enumerate(WRITE_COLUMNS)}


class _Part(NamedTuple):
    kind: str  # "column" or "json"
    at: int  # where its value is in a fetched row
    rest: tuple[str | int, ...]  # steps walked in Python after what the database gave
    label: str  # the path the database extracted, for error messages


class FieldPlan:
    """The columns to select for ``paths`` and how to read a fetched row.

    ``columns[0]`` is the key, ``columns[1]`` the row id. With ``deep=False`` every payload
    path is extracted by its top-level field only, which never needs a second look.
    """

    def __init__(
        self, paths: Sequence[str], dialect: Dialect, *, deep: bool, writable: bool = True
    ) -> None:
        self.columns: list[ColumnElement[Any]] = [rows.c.key, rows.c.id]
        #: Where each column's value is in a row as written (:data:`WRITE_COLUMNS`: a
        #: position; a part of the document: its payload field and the steps below it;
        #: None: the key), for :meth:`as_fetched`.
        self._written: list[int | tuple[str, tuple[str | int, ...]] | None] = [
            None,
            _WRITTEN_AT["id"],
        ]
        self.writable = writable
        self._dialect = dialect
        #: Documents seen by :meth:`as_fetched` and their parts' texts (rows of a kind
        #: often share their document's text: only their blobs differ).
        self._parts_of: dict[str, tuple[Any, ...]] = {}
        self.parts: list[_Part] = []
        self.deep = deep
        self._tensors_at = -1
        placed: dict[tuple[Any, ...], int] = {}
        columns_at: dict[str, int] = {"id": 1}
        for path in map(parse_path, paths):
            column = path.column
            if column is not None:
                if column.name not in columns_at:
                    columns_at[column.name] = self._add(
                        rows.c[column.name], _WRITTEN_AT[column.name]
                    )
                self.parts.append(_Part("column", columns_at[column.name], (), column.name))
                continue
            steps = _sql_steps(path.steps) if deep else ()
            assert path.top is not None  # (a payload path: not a column's)
            where = (path.top, steps)
            if where not in placed:
                part = FieldPath(path.text, None, path.top, steps)
                placed[where] = self._add(dialect.json_text(part), where)
            if self._tensors_at < 0:
                self._tensors_at = self._add(rows.c.tensors, _WRITTEN_AT["tensors"])
            label = ".".join([str(path.top), *map(str, steps)])
            self.parts.append(_Part("json", placed[where], path.steps[len(steps) :], label))

        self._json_at = sorted(set(placed.values()))

    def _add(
        self, column: ColumnElement[Any], written: int | tuple[str, tuple[str | int, ...]]
    ) -> int:
        self.columns.append(column)
        self._written.append(written)
        return len(self.columns) - 1

    def as_fetched(self, fresh: Fresh) -> list[tuple[Any, ...]] | None:
        """Rows just written (``fresh``: as encoded, with their keys) as a fetch by
        :attr:`columns` would give them, without the database: the columns' values as
        stored, each part of the document as JSON text, found by the steps the database's
        path follows (keys in objects, indexes from 0 in lists); :meth:`read_all` then
        decodes them as it decodes a fetch. None where a part is not there in some row
        (or an index counts from the end): the database's answer is left to a read."""
        sources = self._written
        data_at = _WRITTEN_AT["data"]
        parts_of = self._parts_of
        column_as_stored = self._dialect.column_as_stored
        out: list[tuple[Any, ...]] = []
        for key, row in zip(fresh.keys, fresh.rows, strict=True):
            text = row[data_at]
            parts = parts_of.get(text)
            if parts is None:
                parts = self._parts(text)
                if len(text) <= _TEXT_KEPT_CHARS:  # (a long text: a transcript, unique)
                    if len(parts_of) >= _TEXTS_KEPT:
                        parts_of.clear()
                    parts_of[text] = parts
            if _ABSENT in parts:
                return None
            found = iter(parts)
            out.append(
                tuple(
                    key
                    if at is None
                    else column_as_stored(row[at])
                    if type(at) is int
                    else next(found)
                    for at in sources
                )
            )
        return out

    def _parts(self, text: str) -> tuple[Any, ...]:
        """The JSON text of each part of a document (:data:`_ABSENT`: not there), in the
        order of :attr:`columns`."""
        doc: dict[str, Any] = json.loads(text)
        parts: list[Any] = []
        as_stored = self._dialect.as_stored
        for at in self._written:
            if type(at) is tuple:
                value = _part(doc, *at)
                parts.append(value if value is _ABSENT else dump_document(as_stored(value)))
        return tuple(parts)

    @property
    def texts_at(self) -> list[int]:
        """Where the extracted JSON parts are in a fetched row (what may refer to arrays
        stored by digest)."""
        return self._json_at

    def read_all(
        self,
        fetched: Sequence[Sequence[Any]],
        decoder: BatchDecoder,
        arrays: Arrays | None = None,
    ) -> tuple[list[int], list[str], list[Values], list[int]]:
        """``(keys, ids, values per path, keys to read again)`` for rows fetched by
        :attr:`columns`; MISSING where a row has nothing at a path. A path's values are a
        list, or for a tensor field (one dtype and shape in every row) one read-only array
        whose first axis runs over the rows. A row whose deep part came back NULL is left
        out and its key listed last: read it by whole fields.

        Works column by column: each extracted part is decoded for all rows in one call of
        ``decoder.decode_texts``, and a row's blob is checked once.
        """
        none: list[Values] = [[] for _ in self.parts]
        if not fetched:
            return [], [], none, []
        columns = list(zip(*fetched, strict=True))
        unread: list[int] = []
        if self.deep:
            nulls = {
                i
                for at in self._json_at
                if None in columns[at]
                for i, text in enumerate(columns[at])
                if text is None
            }
            if nulls:
                unread = [columns[0][i] for i in sorted(nulls)]
                kept = [r for i, r in enumerate(fetched) if i not in nulls]
                if not kept:
                    return [], [], none, unread
                columns = list(zip(*kept, strict=True))
        ids: tuple[str, ...] = columns[1]
        checked: set[int] | None = set() if len(self._json_at) > 1 else None
        decoded: dict[int, Values] = {}
        out: list[Values] = []
        for kind, at, rest, label in self.parts:
            values: Values
            if kind == "json":
                values = decoded.get(at)  # type: ignore[assignment]
                if values is None:
                    values = decoded[at] = decoder.decode_texts(
                        columns[at],
                        columns[self._tensors_at],
                        ids,
                        label,
                        writable=self.writable,
                        checked=checked,
                        stack=not rest,
                        arrays=arrays,
                    )
            else:
                values = list(columns[at])
                _check_column(label, values, ids)
            if rest:
                values = [walk(value, rest) for value in values]
            out.append(values)
        return list(columns[0]), list(ids), out, unread


class FieldFetcher:
    """Fetches fields of chosen rows of one buffer; keeps a plan per set of paths and one
    :class:`~expstore.codec.BatchDecoder` for the placeholders it meets."""

    PLANS = 8

    def __init__(self, reader: RowReader) -> None:
        self.reader = reader
        self.decoder = BatchDecoder()
        self._plans: dict[tuple[tuple[str, ...], bool], tuple[FieldPlan, FieldPlan | None]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plans": {}}

    def plans(self, paths: Sequence[str], writable: bool) -> tuple[FieldPlan, FieldPlan | None]:
        """The plan for ``paths`` and, when it extracts deep parts, the whole-field plan
        that reads rows it could not."""
        key = (tuple(paths), writable)
        plans = self._plans.get(key)
        if plans is None:
            dialect = self.reader.handle.dialect
            deep = dialect.extracts_json
            plan = FieldPlan(paths, dialect, deep=deep, writable=writable)
            plans = (plan, FieldPlan(paths, dialect, deep=False) if deep else None)
            if len(self._plans) >= self.PLANS:
                self._plans.clear()
            self._plans[key] = plans
        return plans

    def written_columns(
        self, fresh: Fresh, paths: Sequence[str]
    ) -> tuple[list[str], list[Values]] | None:
        """What :meth:`fetch_columns` of ``paths`` would give for rows just written
        (``fresh``, in their order), decoded from the rows as encoded: no read (None where
        only a read can tell: see :meth:`FieldPlan.as_fetched`)."""
        plan, _ = self.plans(paths, True)
        fetched = plan.as_fetched(fresh)
        if fetched is None:
            return None
        _, ids, values, _ = plan.read_all(fetched, self.decoder)
        return ids, values

    def fetch_columns(
        self, keys: Sequence[int] | np.ndarray, paths: Sequence[str], *, writable: bool = True
    ) -> tuple[list[str], list[Values]]:
        """The ids of the rows found (in the order given, repeats allowed, vanished keys
        skipped) and each path's values over them: a list, or for a tensor field (one dtype
        and shape in every row) one array whose first axis runs over the rows."""
        plan, whole = self.plans(paths, writable)
        wanted = key_list(keys)
        fetch = self.reader.rows_with_arrays
        distinct = list(dict.fromkeys(wanted))
        try:
            fetched, held = fetch(distinct, plan.columns, plan.texts_at)
        except StorageError:
            self.reader.raise_damaged(distinct)  # the database could not read a document
            raise
        found, ids, values, unread = plan.read_all(fetched, self.decoder, held)
        if unread and whole is not None:
            fetched, held = fetch(unread, whole.columns, whole.texts_at)
            again, more_ids, more, _ = whole.read_all(fetched, self.decoder, held)
            found, ids = found + again, ids + more_ids
            # A stacked array is a read-only view of the fetched bytes: its rows are copied.
            values = [
                [*(a.copy() if isinstance(a, np.ndarray) else a), *b]
                for a, b in zip(values, more, strict=True)
            ]
        at = {key: i for i, key in enumerate(found)}
        positions = [at[k] for k in wanted if k in at]
        order = np.array(positions, dtype=np.intp)
        return [ids[i] for i in positions], [
            v[order] if isinstance(v, np.ndarray) else [v[i] for i in positions] for v in values
        ]


#: A part of a document that is not there.
_ABSENT = object()
#: Documents whose parts a plan keeps (:meth:`FieldPlan.as_fetched`), each of at most
#: this many characters.
_TEXTS_KEPT = 1024
_TEXT_KEPT_CHARS = 4096


def _part(doc: dict[str, Any], top: str, steps: tuple[str | int, ...]) -> Any:
    """The value at ``top`` and ``steps`` of a parsed document, as a JSON path reaches it
    (a key must meet an object, an index from 0 a list), or :data:`_ABSENT`."""
    value = doc.get(top, _ABSENT)
    for step in steps:
        if type(step) is int:
            if type(value) is not list or not 0 <= step < len(value):
                return _ABSENT
        elif type(value) is not dict or step not in value:
            return _ABSENT
        value = value[step]
    return value


def _check_column(name: str, values: list[Any], ids: Sequence[str]) -> None:
    """CodecError naming the row if a typed column holds a value of another type (SQLite's
    columns take any); one C-speed pass over the types when all is well."""
    spec = COLUMNS_BY_NAME.get(name)
    if spec is None:
        return
    allowed = set(spec.stored_types)
    if set(map(type, values)) <= allowed:
        return
    for row_id, value in zip(ids, values, strict=True):
        if type(value) not in allowed:
            raise CodecError(
                f"row {row_id}: column {name} holds {value!r}, not a "
                f"{spec.python.__name__}; {MALFORMED}"
            )


def _sql_steps(steps: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """The leading steps the database follows: up to a reserved key (the codec's
    placeholders) or a key a JSON path cannot spell (a ``"`` or ``\\``)."""
    for i, step in enumerate(steps):
        if type(step) is str and (step in RESERVED_KEYS or '"' in step or "\\" in step):
            return steps[:i]
    return steps
