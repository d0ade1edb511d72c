"""The row layout, read off the models once: which fields live in typed columns, which in
the JSON payload, and what each column holds.

The models in :mod:`expstore.model.rows` are the one declaration. A field of ``ExpMeta`` is a
column; a field of ``Experience`` whose type is a scalar (``str``, ``int``, ``float``,
``bool``, optionally ``None``) is a column too (``reward_t``, ``adv_t``, ``v_t``, ``done``);
the other ``Experience`` fields are the payload (``state``, ``actions``, ``messages``,
``next_state``, ``ext_info``), stored through :mod:`expstore.codec`. Everything that lists
columns derives from :data:`COLUMNS`: the SQL table (:mod:`expstore.db.schema`), the
write tuples and COPY types, query fields, the export columns and Arrow schema, the CLI's
orderings. Adding a metadata column is one model field and one migration; a field marked
``Field(json_schema_extra={"indexed": True})`` also gets a ``(buffer_id, column)`` index.

>>> [c.name for c in COLUMNS][:4]
['task_id', 'task_name', 'agent_id', 'step']
>>> PAYLOAD_FIELDS
('state', 'actions', 'messages', 'next_state', 'ext_info')
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Ge, Le, MaxLen, MinLen
from pydantic.fields import FieldInfo

from ..errors import UnsupportedTypeError
from .rows import DataRow, Experience, ExpMeta

__all__ = [
    "COLUMNS",
    "COLUMNS_BY_NAME",
    "ColumnSpec",
    "Kind",
    "META_COLUMNS",
    "ORDERABLE",
    "PAYLOAD_FIELDS",
    "PAYLOAD_TYPES",
    "SCALAR_COLUMNS",
]

#: What a column holds, as far as comparisons care.
Kind = Literal["string", "number", "bool"]
Owner = Literal["row", "exp_meta", "exp_data"]

_KINDS: dict[type, Kind] = {str: "string", int: "number", float: "number", bool: "bool"}


@dataclass(frozen=True)
class ColumnSpec:
    """One typed column of a stored row, as its model field declares it."""

    name: str
    owner: Owner
    python: type  # str, int, float or bool
    nullable: bool
    max_length: int | None = None
    min_length: int | None = None
    ge: int | float | None = None
    le: int | float | None = None
    indexed: bool = False

    @property
    def kind(self) -> Kind:
        return _KINDS[self.python]

    @property
    def stored_types(self) -> tuple[type, ...]:
        """The Python types a value read back from this column may have (None included
        where the column is nullable); anything else means a damaged row."""
        return (self.python, type(None)) if self.nullable else (self.python,)

    @property
    def path(self) -> str:
        """The full field path: ``exp_meta.step``, ``exp_data.reward_t``, ``id``."""
        return self.name if self.owner == "row" else f"{self.owner}.{self.name}"


def _scalar(annotation: Any) -> tuple[type, bool] | None:
    """``(type, nullable)`` for a scalar annotation (``str``, ``float | None`` ...), else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in _KINDS and len(args) == 2:
            return rest[0], True
        return None
    return (annotation, False) if annotation in _KINDS else None


def _spec(name: str, owner: Owner, info: FieldInfo) -> ColumnSpec | None:
    scalar = _scalar(info.annotation)
    if scalar is None:
        return None
    python, nullable = scalar
    limits: dict[str, Any] = {}
    for item in info.metadata:
        if isinstance(item, MaxLen):
            limits["max_length"] = item.max_length
        elif isinstance(item, MinLen):
            limits["min_length"] = item.min_length
        elif isinstance(item, Ge):
            limits["ge"] = item.ge
        elif isinstance(item, Le):
            limits["le"] = item.le
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return ColumnSpec(name, owner, python, nullable, indexed=bool(extra.get("indexed")), **limits)


def _columns() -> tuple[ColumnSpec, ...]:
    columns: list[ColumnSpec] = []
    for name, info in ExpMeta.model_fields.items():
        spec = _spec(name, "exp_meta", info)
        if spec is None:
            raise UnsupportedTypeError(
                f"ExpMeta.{name} must be a scalar (str, int, float, bool or None)"
            )
        columns.append(spec)
    for name, info in Experience.model_fields.items():
        spec = _spec(name, "exp_data", info)
        if spec is not None:
            columns.append(spec)
    return tuple(columns)


#: Every typed column, metadata first, in the models' field order.
COLUMNS: tuple[ColumnSpec, ...] = _columns()
COLUMNS_BY_NAME: dict[str, ColumnSpec] = {c.name: c for c in COLUMNS}


def _id_column() -> ColumnSpec:
    spec = _spec("id", "row", DataRow.model_fields["id"])
    assert spec is not None
    return spec


#: The row id, a column of its own (``DataRow.id``).
ID_COLUMN: ColumnSpec = _id_column()
#: Column names of the ``ExpMeta`` fields.
META_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.owner == "exp_meta")
#: Column names of the scalar ``Experience`` fields.
SCALAR_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.owner == "exp_data")
#: The ``Experience`` fields stored through the codec (JSON plus tensor bytes).
PAYLOAD_FIELDS: tuple[str, ...] = tuple(
    name for name in Experience.model_fields if name not in SCALAR_COLUMNS
)


def _containers(annotation: Any) -> tuple[type, ...] | None:
    """The container types a payload field's annotation allows (``list[dict] | None`` ->
    ``(list, NoneType)``), or None when it allows anything."""
    if annotation is Any:
        return None
    options = (
        typing.get_args(annotation)
        if typing.get_origin(annotation)
        in (
            typing.Union,
            types.UnionType,
        )
        else (annotation,)
    )
    found: list[type] = []
    for option in options:
        origin = typing.get_origin(option) or option
        if not isinstance(origin, type) or origin is object:
            return None
        found.append(origin)
    return tuple(found)


#: The types a payload field may hold, where its annotation says (``messages``: a list or
#: None; ``ext_info``: a dict); fields typed ``Any`` are left out.
PAYLOAD_TYPES: dict[str, tuple[type, ...]] = {
    name: kinds
    for name in PAYLOAD_FIELDS
    if (kinds := _containers(Experience.model_fields[name].annotation)) is not None
}
#: What rows can be streamed in order of (keyset pagination needs values that are never
#: NULL): the insertion order ``key`` and every column that cannot be NULL.
ORDERABLE: tuple[str, ...] = ("key", *(c.name for c in COLUMNS if not c.nullable))
