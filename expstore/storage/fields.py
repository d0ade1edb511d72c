"""Reading a few fields of chosen rows (``SqlStorage.fetch_fields``): which columns and
which parts of the JSON document to select, and how a fetched row becomes the values at the
paths.

A path into the payload (``exp_data.state.image_features``) is extracted by the database as
deep as it safely can (``data -> '$."state"."image_features"'`` on SQLite 3.38+,
``data #> '{state,image_features}'`` on Postgres), as JSON text, so Python parses only that
part: for a tensor, just its placeholder, whose checked spec the codec keeps by its text.
The rest of the path (list indexes, say) is walked in Python.

The database cannot see through the codec's escapes: a row whose deep part comes back NULL
(nothing there, or a dict on the way that the codec escaped) is read again by its whole
payload field, which gives exactly what decoding the whole row would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Text, cast, literal, type_coerce
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import ColumnElement

from ..codec import RESERVED_KEYS, PartDecoder, decode_text
from ..paths import MISSING, compile_path, step_into
from .schema import SCALAR_COLUMNS, rows

__all__ = ["FieldPlan", "field_plans"]

# SQLite's -> operator (JSON text of a part, NULL where there is none) came in 3.38.
_SQLITE_ARROW = sqlite3.sqlite_version_info >= (3, 38, 0)


class _Part(NamedTuple):
    kind: str  # "id", "column" or "json"
    at: int  # where its value is in a fetched row
    rest: tuple[str | int, ...]  # steps walked in Python after what the database gave
    label: str  # the path the database extracted, for error messages


class FieldPlan:
    """The columns to select for ``paths`` and how to read a fetched row.

    ``columns[0]`` is the key, ``columns[1]`` the row id. With ``deep=False`` every payload
    path is extracted by its top-level field only, which never needs a second look.
    """

    def __init__(
        self, paths: Sequence[str], dialect: str, *, deep: bool, writable: bool = True
    ) -> None:
        self.columns: list[ColumnElement[Any]] = [rows.c.key, rows.c.id]
        self.writable = writable
        self.parts: list[_Part] = []
        self.deep = deep
        self._tensors_at = -1
        placed: dict[tuple[str, ...], int] = {}
        columns_at: dict[str, int] = {}
        for head, steps in (compile_path(p) for p in paths):
            if head == "id":
                self.parts.append(_Part("id", 1, (), "id"))
                continue
            field = str(steps[0])
            if head == "exp_meta" or field in SCALAR_COLUMNS:
                if field not in columns_at:
                    columns_at[field] = self._add(rows.c[field])
                self.parts.append(_Part("column", columns_at[field], steps[1:], field))
                continue
            prefix = _sql_prefix(steps, dialect) if deep else (field,)
            if prefix not in placed:
                placed[prefix] = self._add(_json_part(prefix, dialect))
            if self._tensors_at < 0:
                self._tensors_at = self._add(rows.c.tensors)
            self.parts.append(_Part("json", placed[prefix], steps[len(prefix) :], ".".join(prefix)))

        # One extracted part per row: decoded without a PartDecoder (see codec.decode_text).
        self._one_part = len(placed) == 1
        if len(self.parts) == 1 and self.parts[0].kind == "json" and not self.parts[0].rest:
            self.read = self._read_one  # type: ignore[method-assign]  # the common case

    def _read_one(self, r: Sequence[Any]) -> tuple[Any, ...] | None:
        """:meth:`read` for a plan of one path that the database extracts whole."""
        text = r[2]
        if text is None:
            return None if self.deep else (r[1], None)
        label = self.parts[0].label
        return (r[1], decode_text(text, r[3], r[1], label, writable=self.writable))

    def _add(self, column: ColumnElement[Any]) -> int:
        self.columns.append(column)
        return len(self.columns) - 1

    def read(self, r: Sequence[Any]) -> tuple[Any, ...] | None:
        """``(id, value per path)`` of one fetched row; MISSING where the row has nothing at
        a path. None when a deep part came back NULL: read the row again by whole fields."""
        row_id = r[1]
        decoder: PartDecoder | None = None
        decoded: dict[int, Any] = {}  # each extracted part is decoded once per row
        out: list[Any] = [row_id]
        for kind, at, rest, label in self.parts:
            if kind == "json":
                if at in decoded:
                    value = decoded[at]
                else:
                    text = r[at]
                    if text is not None:
                        if self._one_part:
                            blob = r[self._tensors_at]
                            value = decode_text(text, blob, row_id, label, writable=self.writable)
                        else:
                            if decoder is None:
                                decoder = PartDecoder(r[self._tensors_at], row_id)
                            value = decoder.decode_text(text, label)
                    elif self.deep:
                        return None
                    else:
                        value = None  # a whole field that is not there: as decoding gives
                    decoded[at] = value
            elif kind == "column":
                value = r[at]
            else:
                value = row_id
            for step in rest:
                value = step_into(value, step)
                if value is MISSING:
                    break
            out.append(value)
        return tuple(out)


def field_plans(
    paths: Sequence[str], dialect: str, *, writable: bool = True
) -> tuple[FieldPlan, FieldPlan | None]:
    """The plan for ``paths`` and, when it extracts deep parts, the whole-field plan that
    reads rows it could not. ``writable=False`` lets arrays be read-only views of the
    fetched bytes."""
    deep = dialect == "postgresql" or _SQLITE_ARROW
    plan = FieldPlan(paths, dialect, deep=deep, writable=writable)
    if not deep:
        return plan, None
    return plan, FieldPlan(paths, dialect, deep=False)


def _sql_prefix(steps: tuple[str | int, ...], dialect: str) -> tuple[str, ...]:
    """The leading steps the database can follow: dict keys, stopping at a list index (a
    digit step may be either, which only the decoded value tells), a reserved key, a key
    the path syntax would need escapes for, and on Postgres a key that ``#>`` would read
    as an array subscript when it meets a list (``01``, ``-1``, ``+1``)."""
    prefix = [str(steps[0])]
    for step in steps[1:]:
        if type(step) is not str or step in RESERVED_KEYS or '"' in step or "\\" in step:
            break
        if dialect == "postgresql" and step.strip().lstrip("+-").isdigit():
            break
        prefix.append(step)
    return tuple(prefix)


def _json_part(prefix: tuple[str, ...], dialect: str) -> ColumnElement[Any]:
    """The JSON text of the document's part at ``prefix`` (NULL where there is none, for
    deep prefixes); every key is a bound parameter."""
    if dialect == "postgresql":
        # The path bound as a real text[] (not an array literal, whose syntax would split
        # or trim keys holding commas, braces or spaces).
        path_array = literal(list(prefix), ARRAY(Text))
        return cast(rows.c.data.op("#>", return_type=JSONB)(path_array), Text)
    if len(prefix) == 1 and not _SQLITE_ARROW:
        return type_coerce(rows.c.data[prefix[0]], Text)
    path = "$" + "".join(f'."{key}"' for key in prefix)
    return type_coerce(rows.c.data.op("->")(literal(path, Text)), Text)
