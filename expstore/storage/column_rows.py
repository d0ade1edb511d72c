"""A batch of columns encoded column by column for the writer (``buffer.extend``).

The row path (:meth:`expstore.model.columnar.Columns.rows`) cuts columns into N rows that the
writer encodes one by one; here the typed columns are checked whole
(:func:`~expstore.storage.writer.column_ok`), the payloads come from a document template
and a block of tensor bytes (:mod:`expstore.codec.columns`), and each row's content digest
from text written column by column. A batch this cannot express exactly (a column that
fails a check, a payload the template cannot hold) goes the row path, which also gives
the errors; rows 0 and N-1 are encoded both ways and must agree before the batch is used,
the first time a batch of its layout comes (:meth:`EncodedColumns.layout`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from ..codec.columns import ColumnPayloads, Listed, Same, plan_payloads
from ..model.columnar import ColumnRow, Columns, field_defaults, parse_columns
from ..model.layout import COLUMNS_BY_NAME, ID_COLUMN, META_COLUMNS, PAYLOAD_FIELDS, SCALAR_COLUMNS
from ..model.rows import Experience, ExpMeta
from .writer import RowSource, column_ok, content_digest, encode_chunk

__all__ = ["EncodedColumns", "column_source", "encoded_columns"]

#: The metadata a content digest covers (all but execute_time), as the writer's.
_HASHED = tuple(c for c in META_COLUMNS if c != "execute_time")
#: Payload fields whose values the model types beyond "anything storable": given as
#: columns, they take the row path, which checks each value.
_TYPED_PAYLOAD = frozenset({"messages", "ext_info"})


def _tuple_format(count: int) -> str:
    """The format of a tuple's repr from its items' reprs (``(a,)`` for one item)."""
    return "(" + ", ".join(["{}"] * count) + ("," if count == 1 else "") + ")"


class EncodedColumns(RowSource):
    """Rows of a batch of columns, encoded a chunk at a time (see the module doc)."""

    def __init__(
        self, columns: Columns, values: dict[str, list[Any]], payloads: ColumnPayloads
    ) -> None:
        self._ids = columns.ids
        self.payloads = payloads
        self.meta = [values[name] for name in META_COLUMNS]
        self.scalars = [values[name] for name in SCALAR_COLUMNS]
        # repr((hashed metadata, scalars)): a format with each constant's repr written in.
        constant = columns.constant | (values.keys() - columns.fields.keys())
        self.varying = [name for name in (*_HASHED, *SCALAR_COLUMNS) if name not in constant]
        self.values = values

        def part(name: str) -> str:
            if name in constant:
                return repr(values[name][0]).replace("{", "{{").replace("}", "}}")
            return "{}"

        hashed = _tuple_format(len(_HASHED)).format(*map(part, _HASHED))
        scalars = _tuple_format(len(SCALAR_COLUMNS)).format(*map(part, SCALAR_COLUMNS))
        self.key_format = f"({hashed}, {scalars})"

    @property
    def ids(self) -> Sequence[str]:
        return self._ids

    def layout(self) -> tuple[Any, ...]:
        """What decides how the batch is encoded, but its values: the payload's template
        and slots, the tensors' places, which columns vary, and the type of each column's
        first value (the values themselves were checked when the batch was planned)."""
        plan = self.payloads
        return (
            plan.format,
            tuple(slot.text for slot in plan.order),
            tuple(plan.offsets),
            plan.size,
            tuple(self.varying),
            tuple(type(column[0]) if len(column) else None for column in self.meta),
            tuple(type(column[0]) if len(column) else None for column in self.scalars),
        )

    def encode(self, start: int, stop: int, buffer_id: int) -> list[tuple[Any, ...]]:
        stop = min(stop, len(self._ids))
        ids = self._ids[start:stop]
        docs, blobs = self.payloads.encode(start, stop, ids)
        reprs = [list(map(repr, self.values[name][start:stop])) for name in self.varying]
        if reprs:
            keys: Any = map(self.key_format.format, *reprs)
        else:
            keys = repeat(self.key_format.format(), len(ids))
        digests = list(map(content_digest, keys, docs, blobs))
        return list(
            zip(
                repeat(buffer_id, len(ids)),
                ids,
                *(column[start:stop] for column in self.meta),
                *(column[start:stop] for column in self.scalars),
                docs,
                blobs,
                digests,
                repeat(0, len(ids)),  # change_flags: a write to a tracked buffer sets them
                strict=True,
            )
        )

    def row(self, i: int) -> ColumnRow:
        """Row ``i`` as the row path gives it to the writer."""
        meta = {name: column[i] for name, column in zip(META_COLUMNS, self.meta, strict=True)}
        data = {name: column[i] for name, column in zip(SCALAR_COLUMNS, self.scalars, strict=True)}
        data.update(self.payloads.row(i))
        return ColumnRow(self._ids[i], meta, data)


def column_source(columns: Mapping[str, Any]) -> EncodedColumns | list[ColumnRow]:
    """The rows a dict of columns holds, as the writer takes them: encoded column by column
    where the batch allows it (checked whole: no row of it can fail its model), else the
    rows cut from the columns (each checked by its model as it is written)."""
    parsed = parse_columns(columns)
    encoded = encoded_columns(parsed)
    return parsed.rows() if encoded is None else encoded


def encoded_columns(columns: Columns) -> EncodedColumns | None:
    """The batch encoded column by column, or None where it must take the row path."""
    n = columns.n
    if not column_ok(columns.ids, ID_COLUMN) or _TYPED_PAYLOAD & set(columns.payload):
        return None
    defaults = _defaults()
    values: dict[str, list[Any]] = {}
    for name in (*META_COLUMNS, *SCALAR_COLUMNS):
        given = columns.fields[name] if name in columns.fields else [defaults[name]] * n
        if not column_ok(given, COLUMNS_BY_NAME[name]):
            return None
        values[name] = given
    payload: dict[str, Any] = {}
    for name in PAYLOAD_FIELDS:
        if name in columns.payload:
            column = columns.payload[name]
            payload[name] = Listed(column) if name == "actions" and columns.action else column
        else:
            payload[name] = Same(defaults[name])
    plan = plan_payloads(payload, n)
    if plan is None:
        return None
    encoded = EncodedColumns(columns, values, plan)
    layout = encoded.layout()
    if layout in _AGREED:
        return encoded
    for i in {0, n - 1}:
        try:
            expected = encode_chunk([encoded.row(i)], 0)  # type: ignore[list-item]
            if encoded.encode(i, i + 1, 0) != expected:
                return None  # pragma: no cover - a batch the template does not express
        except Exception:  # noqa: BLE001 - whatever the row path says, it says it
            return None
    if len(_AGREED) >= _AGREED_MAX:
        _AGREED.clear()
    _AGREED.add(layout)
    return encoded


def _defaults() -> dict[str, Any]:
    """Each field's default (None for a required one, which column_ok then refuses), read
    from the models once: the values are only read (encoded), never changed."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = {**field_defaults(ExpMeta, 0.0), **field_defaults(Experience, 0.0)}
    return _DEFAULTS


_DEFAULTS: dict[str, Any] | None = None

#: Layouts (:meth:`EncodedColumns.layout`) whose encoding agreed with the row path's: a
#: batch of one of them is encoded the same way (its values were checked as it was
#: planned), so a trainer's ``extend`` of the same columns every step checks it once.
_AGREED: set[tuple[Any, ...]] = set()
_AGREED_MAX = 256
