"""Field names in conditions: which column or JSON path each one means, and what it holds.

A field is one of

- a column: ``id``, ``exp_meta.<name>`` for the ExpMeta fields, ``exp_data.reward_t``,
  ``exp_data.adv_t``, ``exp_data.v_t``, ``exp_data.done``, or any of these bare
  (``task_id``, ``step``, ``reward_t``, ...);
- a path into the experience's JSON: ``exp_data.<payload field>`` followed by dict keys
  and list indexes, such as ``exp_data.state.url`` or ``exp_data.actions.0.name``.

In a path, a segment of decimal digits without a leading zero (``0``, ``12``) indexes a
list; any other segment is a dict key. So a dict key made only of digits, and a key holding
a ``.`` or a ``"``, cannot be addressed (SQLite before 3.45 cannot spell a ``"`` in a path).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..errors import QueryError

__all__ = [
    "COLUMN_FIELDS",
    "ColumnField",
    "JsonField",
    "Kind",
    "PAYLOAD_FIELDS",
    "check_text",
    "resolve_field",
]

#: What a value is, as far as comparisons care: the Python type of a condition's value
#: decides which stored values it can match.
Kind = Literal["string", "number", "bool"]

#: The Experience fields stored as JSON (the same tuple as ``expstore.models.PAYLOAD_FIELDS``).
PAYLOAD_FIELDS = ("state", "actions", "messages", "next_state", "ext_info")

# Postgres' ``jsonb -> integer`` takes an int4.
_MAX_INDEX = 2**31 - 1
_INDEX = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True)
class ColumnField:
    """A field stored in a typed column of the rows table."""

    name: str
    column: str
    kind: Kind
    owner: Literal["row", "exp_meta", "exp_data"]


@dataclass(frozen=True)
class JsonField:
    """A path into one of the experience's JSON payload fields."""

    name: str
    top: str
    path: tuple[str | int, ...]


def _columns() -> dict[str, ColumnField]:
    specs: list[tuple[str, Kind, Literal["row", "exp_meta", "exp_data"]]] = [
        ("id", "string", "row"),
        ("task_id", "string", "exp_meta"),
        ("task_name", "string", "exp_meta"),
        ("agent_id", "string", "exp_meta"),
        ("step", "number", "exp_meta"),
        ("execute_time", "number", "exp_meta"),
        ("pre_agent", "string", "exp_meta"),
        ("reward_t", "number", "exp_data"),
        ("adv_t", "number", "exp_data"),
        ("v_t", "number", "exp_data"),
        ("done", "bool", "exp_data"),
    ]
    fields: dict[str, ColumnField] = {}
    for column, kind, owner in specs:
        full = column if owner == "row" else f"{owner}.{column}"
        fields[full] = ColumnField(full, column, kind, owner)
    return fields


#: Every column field by its full name, in the order the error message lists them.
COLUMN_FIELDS: dict[str, ColumnField] = _columns()
_BARE = {f.column: f for f in COLUMN_FIELDS.values()}


def _valid_fields() -> str:
    columns = ", ".join(COLUMN_FIELDS)
    payload = ", ".join(f"exp_data.{name}" for name in PAYLOAD_FIELDS)
    return (
        f"the valid fields are {columns} (or their bare names, such as task_id), "
        f"and paths into {payload}, such as exp_data.ext_info.policy_version "
        "or exp_data.actions.0.name"
    )


def check_text(text: str, what: str) -> None:
    """Reject strings no backend can store: NUL characters (Postgres) and lone surrogates."""
    if "\x00" in text:
        raise QueryError(
            f"{what} contains a NUL character ({text!r}); Postgres cannot store NUL in text, "
            "so expstore never matches it: remove the NUL"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise QueryError(
            f"{what} is not valid Unicode text ({text!r}: {exc.reason}); "
            "pass a string without lone surrogates"
        ) from None


def _segment(part: str, field: str) -> str | int:
    if part == "":
        raise QueryError(
            f"field {field!r} has an empty path segment; separate keys with single dots, "
            "as in exp_data.state.url"
        )
    if '"' in part:
        raise QueryError(
            f"field {field!r}: the key {part!r} holds a double quote, which SQLite's JSON "
            'paths cannot address; store the value under a key without "'
        )
    if _INDEX.fullmatch(part):
        index = int(part)
        if index > _MAX_INDEX:
            raise QueryError(
                f"field {field!r}: list index {part} is too large; the largest is {_MAX_INDEX}"
            )
        return index
    return part


def resolve_field(field: object) -> ColumnField | JsonField:
    """The column or JSON path ``field`` names; QueryError listing the valid ones otherwise."""
    if not isinstance(field, str):
        raise QueryError(
            f"a field name must be a string such as 'exp_meta.task_id'; got {field!r} "
            f"({type(field).__name__})"
        )
    check_text(field, f"field name {field!r}")
    column = COLUMN_FIELDS.get(field) or _BARE.get(field)
    if column is not None:
        return column
    parts = field.split(".")
    if parts[0] == "exp_data" and len(parts) >= 2 and parts[1] in PAYLOAD_FIELDS:
        path = tuple(_segment(part, field) for part in parts[2:])
        return JsonField(field, parts[1], path)
    head = ".".join(parts[:2])
    if head in COLUMN_FIELDS or parts[0] in _BARE:
        raise QueryError(
            f"field {field!r}: {parts[0] if parts[0] in _BARE else head} is a column holding "
            f"a single {(COLUMN_FIELDS.get(head) or _BARE[parts[0]]).kind}, with no path "
            f"inside it; compare {head if head in COLUMN_FIELDS else parts[0]} itself"
        )
    raise QueryError(f"unknown field {field!r}; {_valid_fields()}")
