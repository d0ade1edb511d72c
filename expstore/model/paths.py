"""Field paths: the one grammar that names a value inside a row.

Queries, converters, field fetches, stratification, key indexes and the CLI all read paths
with :func:`parse_path`, so a path means the same thing everywhere:

- ``id``; a column, as ``exp_meta.<field>`` (``exp_meta.step``), ``exp_data.<scalar>``
  (``exp_data.reward_t``) or bare (``step``, ``reward_t``); a column holds one value, with
  no path inside it;
- a payload field (``exp_data.state``, or bare ``state``) followed by steps into it:
  ``exp_data.state.url``, ``exp_data.actions.0.name``.

A step made of ASCII decimal digits without a leading zero (``0``, ``12``) is a list index
and only ever reads a list (or an array); any other step (``01``, ``١``, ``-1``, ``url``)
is a dict key and only ever reads a dict. So a dict key made only of such digits cannot be
addressed. Indexes go up to 2**31 - 1 (Postgres' ``jsonb -> int``).

>>> parse_path("exp_data.actions.0.name").steps
(0, 'name')
>>> parse_path("step").column.path
'exp_meta.step'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import BaseModel

from ..codec import text_problem
from ..errors import QueryError
from .layout import COLUMNS, COLUMNS_BY_NAME, ID_COLUMN, PAYLOAD_FIELDS, ColumnSpec
from .rows import DataRow

__all__ = ["MISSING", "FieldPath", "parse_path", "read_path", "step_into", "walk"]


class _Missing:
    """The marker for a path that leads nowhere in a row."""

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


#: What :func:`read_path` returns when a row has nothing at the path.
MISSING: Any = _Missing()

#: Postgres' ``jsonb -> integer`` takes an int4.
MAX_INDEX = 2**31 - 1
_INDEX = re.compile(r"0|[1-9][0-9]*")
_OWNERS = {"exp_meta": {c.name for c in COLUMNS if c.owner == "exp_meta"}}
_EXP_DATA = {*(c.name for c in COLUMNS if c.owner == "exp_data"), *PAYLOAD_FIELDS}


@dataclass(frozen=True)
class FieldPath:
    """A parsed field path: a column, or a payload field and the steps into it."""

    text: str
    #: The column the path names, or None for a path into the payload.
    column: ColumnSpec | None
    #: The payload field (``state``, ``actions``...), or None for a column.
    top: str | None = None
    #: Steps below the payload field: dict keys (str) and list indexes (int).
    steps: tuple[str | int, ...] = ()

    @property
    def is_column(self) -> bool:
        return self.column is not None

    @property
    def canonical(self) -> str:
        """The full spelling: ``exp_meta.step``, ``exp_data.state.url``, ``id``."""
        if self.column is not None:
            return self.column.path
        return ".".join(["exp_data", str(self.top), *map(str, self.steps)])


def _fields() -> str:
    columns = ", ".join(c.path for c in (ID_COLUMN, *COLUMNS))
    payload = ", ".join(f"exp_data.{name}" for name in PAYLOAD_FIELDS)
    return (
        f"the valid fields are {columns} (or their bare names, such as task_id), and paths into "
        f"{payload}, such as exp_data.state.url or exp_data.actions.0.name"
    )


def _step(part: str, text: str) -> str | int:
    if not _INDEX.fullmatch(part):
        return part
    index = int(part)
    if index > MAX_INDEX:
        raise QueryError(
            f"field {text!r}: list index {part} is too large; the largest is {MAX_INDEX}"
        )
    return index


def parse_path(text: str) -> FieldPath:
    """The column or payload path ``text`` names; :class:`~expstore.QueryError` (a
    ValueError) saying what is wrong otherwise."""
    if not isinstance(text, str):
        raise QueryError(
            f"a field name must be a string such as 'exp_meta.task_id' or "
            f"'exp_data.state.url'; got {text!r} ({type(text).__name__})"
        )
    return _parse(text)


@lru_cache(maxsize=1024)
def _parse(text: str) -> FieldPath:
    problem = text_problem(text)
    if problem:
        raise QueryError(f"field {text!r}: {problem}")
    parts = text.split(".")
    if any(not part for part in parts):
        raise QueryError(
            f"field {text!r} has an empty path segment; separate keys with single dots, "
            "as in exp_data.state.url"
        )
    head = parts[0]
    if head == "id" and len(parts) == 1:
        return FieldPath(text, ID_COLUMN)
    if head in ("exp_meta", "exp_data"):
        if len(parts) == 1:
            raise QueryError(f"field {text!r} needs a field after {head!r}; {_fields()}")
        name, rest = parts[1], parts[2:]
        known = _OWNERS["exp_meta"] if head == "exp_meta" else _EXP_DATA
        if name not in known:
            raise QueryError(f"unknown field {text!r}; {_fields()}")
    elif head in COLUMNS_BY_NAME or head in PAYLOAD_FIELDS:
        name, rest = head, parts[1:]
    else:
        raise QueryError(f"unknown field {text!r}; {_fields()}")
    column = COLUMNS_BY_NAME.get(name)
    if column is not None:
        if rest:
            raise QueryError(
                f"field {text!r}: {column.path} is a column holding a single {column.kind}, "
                f"with no path inside it; use {column.path} itself"
            )
        return FieldPath(text, column)
    return FieldPath(text, None, name, tuple(_step(part, text) for part in rest))


def step_into(value: Any, step: str | int) -> Any:
    """``value`` one step down by the path rules (an index reads only a list, tuple or
    array; a key only a dict or a pydantic model's field), or :data:`MISSING`."""
    if type(step) is int:
        if isinstance(value, (list, tuple, np.ndarray)) and step < len(value):
            return value[step]
        return MISSING
    if isinstance(value, dict):
        return value.get(step, MISSING)
    if isinstance(value, BaseModel) and step in type(value).model_fields:
        return getattr(value, step)
    return MISSING


def walk(value: Any, steps: tuple[str | int, ...]) -> Any:
    """``value`` after every step of ``steps``, or :data:`MISSING` where one leads nowhere."""
    for step in steps:
        value = step_into(value, step)
        if value is MISSING:
            break
    return value


def read_path(row: DataRow, path: FieldPath | str) -> Any:
    """The value at ``path`` in ``row``, or :data:`MISSING`."""
    if isinstance(path, str):
        path = parse_path(path)
    column = path.column
    if column is not None:
        owner = row if column.owner == "row" else getattr(row, column.owner)
        return getattr(owner, column.name)
    return walk(getattr(row.exp_data, str(path.top)), path.steps)
