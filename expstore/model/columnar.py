"""Writing a batch of columns at once: ``buffer.extend({...})`` (TorchRL's word).

A vectorised environment or a rollout engine has columns: observations ``[N, ...]``,
actions, rewards, dones, task and agent ids. ``extend`` stores them as N rows without
building N pydantic models: the columns are checked as columns (names, lengths), cut into
rows (a 1-D numeric array becomes Python numbers in one ``tolist()``, an N-D array or
tensor one sub-array per row), and handed to the writer, which checks every typed column
for the whole chunk at once and validates a row through its model only where a column
failed, exactly as for ``store_batch`` (see :mod:`expstore.storage.writer`). The write is
one transaction with the buffer's retention, dedup and rate limit, as ``store_batch``.

A column is named by its field (``task_id``, ``exp_meta.step``, ``reward_t``,
``exp_data.state``...). Its value is a sequence of N values, an array or tensor whose first
axis is N, a dict of such columns (``state={"obs": obs, "mask": mask}`` gives each row
``{"obs": obs[i], "mask": mask[i]}``), or one plain value (a str, number, bool or None)
given to every row. ``id`` is optional (fresh UUIDs); ``execute_time`` defaults to now.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from ..codec import check_value
from ..errors import InvalidArgumentError, RowValidationError, UnsupportedTypeError
from .layout import SCALAR_COLUMNS
from .rows import Experience, ExpMeta

__all__ = [
    "ColumnRow",
    "Columns",
    "column_error",
    "field_defaults",
    "fresh_ids",
    "parse_columns",
    "rows_from_columns",
]

_META = tuple(ExpMeta.model_fields)
_DATA = tuple(Experience.model_fields)
_PLAIN = (str, int, float, bool, type(None))
#: The payload fields stored in typed columns (reward_t, adv_t, v_t, done).
_SCALARS = frozenset(SCALAR_COLUMNS)


class _Fields:
    """A model's fields as the writer reads them (its ``__dict__``)."""

    __slots__ = ("__dict__",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__ = fields


class ColumnRow:
    """One row cut from columns, shaped as the writer reads a DataRow (``id``,
    ``exp_meta.__dict__``, ``exp_data.__dict__``); it never leaves the write."""

    __slots__ = ("exp_data", "exp_meta", "id")

    def __init__(self, row_id: str, meta: dict[str, Any], data: dict[str, Any]) -> None:
        self.id = row_id
        self.exp_meta = _Fields(meta)
        self.exp_data = _Fields(data)


def _field(name: Any) -> tuple[str, str]:
    """("meta" | "data" | "id", the field) for a column name."""
    if not isinstance(name, str):
        raise UnsupportedTypeError(f"column names are field names (str), got {name!r}")
    bare = name
    for prefix, part in (("exp_meta.", "meta"), ("exp_data.", "data")):
        if name.startswith(prefix):
            bare = name[len(prefix) :]
            if bare in (_META if part == "meta" else _DATA):
                return part, bare
            break
    if bare == "id":
        return "id", "id"
    if bare in _META:
        return "meta", bare
    if bare in _DATA:
        return "data", bare
    if bare == "action":
        return "data", "action"
    raise InvalidArgumentError(
        f"extend() got a column {name!r}, which is no field of a row; columns are the "
        f"metadata fields {sorted(_META)}, the payload fields {sorted(_DATA)} and id"
    )


def _length(name: str, value: Any) -> int | None:
    """The number of rows a column holds (None: one value for every row)."""
    if type(value) is np.ndarray and value.ndim:  # the common case first
        return int(value.shape[0])
    if isinstance(value, _PLAIN) or isinstance(value, np.generic):
        return None
    if isinstance(value, Mapping):
        lengths = {k: _length(f"{name}.{k}", v) for k, v in value.items()}
        found = {n for n in lengths.values() if n is not None}
        if len(found) > 1:
            raise InvalidArgumentError(
                f"the columns inside {name!r} have different lengths {lengths}; each holds "
                "one value per row"
            )
        return found.pop() if found else None
    shape = getattr(value, "shape", None)
    if shape is not None:
        if not len(shape):
            raise InvalidArgumentError(
                f"column {name!r} is a 0-d array; give one value per row, or a plain value"
            )
        return int(shape[0])
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return len(value)
    raise UnsupportedTypeError(
        f"column {name!r} is a {type(value).__name__}; give a list, an array or tensor whose "
        "first axis is the rows, a dict of such columns, or one plain value for every row"
    )


def _values(value: Any, n: int) -> list[Any]:
    """A column's N per-row values."""
    if type(value) is list:
        return list(value)
    if isinstance(value, np.generic):  # a numpy scalar: the Python value, for every row
        value = value.item()
    if isinstance(value, _PLAIN):
        return [value] * n
    if isinstance(value, Mapping):
        keys = list(value)
        if not keys:
            return [{} for _ in range(n)]
        columns = [_values(value[k], n) for k in keys]
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    if isinstance(value, np.ndarray):
        if value.ndim == 1 and value.dtype.kind in "biuf" and value.dtype.itemsize <= 8:
            return value.tolist()  # type: ignore[no-any-return]
        if value.ndim == 1 and value.dtype.kind in "USO":
            return value.tolist()  # type: ignore[no-any-return]
        return list(value)
    if hasattr(value, "shape") and hasattr(value, "unbind"):  # a torch tensor
        if value.ndim == 1:
            return value.tolist()  # type: ignore[no-any-return]
        return list(value.unbind(0))
    return list(value)


#: The types the model gives payload fields beyond "any storable value".
_PAYLOAD_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "messages": TypeAdapter(list[dict[str, Any]] | None),
    "ext_info": TypeAdapter(dict[str, Any]),
}


def _check_payload(name: str, values: list[Any]) -> None:
    """What the model checks of a payload field (state, actions...), for each row's value
    (the writer checks only the field's container type): its type where the model says
    more, and that the codec can store it. InvalidArgumentError naming the column and row
    otherwise."""
    adapter = _PAYLOAD_ADAPTERS.get(name)
    for position, value in enumerate(values):
        try:
            if adapter is not None:
                adapter.validate_python(value, strict=True)
            check_value(value, name)
        except (ValidationError, ValueError) as exc:
            reason = (
                str(exc).splitlines()[0]
                if not isinstance(exc, ValidationError)
                else (exc.errors()[0]["msg"])
            )
            raise InvalidArgumentError(
                f"extend(): column {name} at row {position} holds {value!r:.80}: {reason}. "
                "Nothing was stored"
            ) from None


def field_defaults(model: Any, now: float) -> dict[str, Any]:
    """Each field's default (None for a required one, which must be given; ``now`` for
    the execute time)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name == "execute_time":
            out[name] = now
        elif info.default_factory is not None:
            out[name] = info.default_factory()
        elif info.is_required():
            out[name] = None
        else:
            out[name] = info.default
    return out


class Columns:
    """A batch of columns, checked as columns: ``n`` rows, their ids, each metadata and
    scalar field's N values (one value for all where a plain value was given) and the
    payload fields' columns as given (AWorld's singular ``action`` as ``actions``)."""

    def __init__(
        self,
        n: int,
        ids: list[str],
        fields: dict[str, list[Any]],
        payload: dict[str, Any],
        action: bool,
        constant: frozenset[str] = frozenset(),
    ) -> None:
        self.n = n
        self.ids = ids
        self.fields = fields
        #: The fields given one value for every row.
        self.constant = constant
        self.payload = payload
        self.action = action

    def rows(self) -> list[ColumnRow]:
        """The rows, one by one, with each payload value checked as the model would."""
        n = self.n
        data_cols = [(f, _values(v, n)) for f, v in self.payload.items()]
        if self.action:  # AWorld's singular action: each row's list of one
            at = [f for f, _ in data_cols].index("actions")
            data_cols[at] = ("actions", [[value] for value in data_cols[at][1]])
        for name, values in data_cols:
            _check_payload(name, values)
        meta_base = field_defaults(ExpMeta, self.fields["execute_time"][0])
        data_base = field_defaults(Experience, 0.0)
        fresh = [name for name in ("actions", "ext_info") if name not in self.payload]
        meta_names = [f for f in self.fields if f in _META]
        scalar_names = [f for f in self.fields if f not in _META]
        names = scalar_names + [f for f, _ in data_cols]
        meta_rows = zip(*(self.fields[f] for f in meta_names), strict=True)
        data_rows: Any = zip(
            *(self.fields[f] for f in scalar_names),
            *(values for _, values in data_cols),
            strict=True,
        )
        if not names:
            data_rows = iter([()] * n)
        out: list[ColumnRow] = []
        for row_id, m, d in zip(self.ids, meta_rows, data_rows, strict=True):
            meta = {**meta_base, **dict(zip(meta_names, m, strict=True))}
            data = {**data_base, **dict(zip(names, d, strict=True))}
            for name in fresh:  # a list or dict of its own per row, as the model gives
                data[name] = type(data_base[name])()
            out.append(ColumnRow(row_id, meta, data))
        return out


def parse_columns(columns: Mapping[str, Any]) -> Columns:
    """The batch ``columns`` hold (see the module's docstring); InvalidArgumentError or
    UnsupportedTypeError, before anything is stored, for columns that do not fit."""
    if not isinstance(columns, Mapping):
        raise UnsupportedTypeError(
            f"extend() takes a dict of columns (field name -> values), got "
            f"{type(columns).__name__}; for rows use store_batch()"
        )
    placed: dict[tuple[str, str], Any] = {}
    for name, value in columns.items():
        where = _field(name)
        if where in placed:
            raise InvalidArgumentError(f"extend() got the field {where[1]!r} twice")
        placed[where] = value
    if ("data", "action") in placed and ("data", "actions") in placed:
        raise InvalidArgumentError(
            "extend() got both 'action' and 'actions'; give one (action: one value per "
            "row, stored as a list of one)"
        )
    lengths = {f"{part}.{field}": _length(field, v) for (part, field), v in placed.items()}
    found = {n for n in lengths.values() if n is not None}
    if len(found) > 1:
        shown = {k.split(".", 1)[1]: v for k, v in lengths.items() if v is not None}
        raise InvalidArgumentError(
            f"extend() columns have different lengths {shown}; every column holds one value "
            "per row (or is one plain value for all). Nothing was stored"
        )
    if not found:
        raise InvalidArgumentError(
            "extend() needs at least one column with a value per row (a list or array); "
            "to store one row use store()"
        )
    n = found.pop()
    if n == 0:
        raise InvalidArgumentError("extend() got columns of 0 rows; nothing to store")
    missing = [f for f in ("task_id", "agent_id", "step") if ("meta", f) not in placed]
    if missing:
        raise InvalidArgumentError(
            f"extend() needs the columns {missing} (every row has a task, an agent and a "
            "step); give a column or one value for all rows"
        )
    ids_given = placed.get(("id", "id"))
    ids = _values(ids_given, n) if ids_given is not None else fresh_ids(n)
    if ids_given is not None and len(set(map(repr, ids))) != n:
        raise InvalidArgumentError(
            "extend() got the same id for two rows; ids must be unique (leave the id column "
            "out for fresh ones). Nothing was stored"
        )
    fields: dict[str, list[Any]] = {}
    payload: dict[str, Any] = {}
    for (part, field), value in placed.items():
        if part == "meta" or (part == "data" and field in _SCALARS):
            fields[field] = _values(value, n)
        elif part == "data":
            payload["actions" if field == "action" else field] = value
    constant = {
        f
        for f, v in fields.items()
        if isinstance(placed.get(("meta", f), placed.get(("data", f))), (*_PLAIN, np.generic))
    }
    if "execute_time" not in fields:
        fields["execute_time"] = [time.time()] * n
        constant.add("execute_time")
    return Columns(n, ids, fields, payload, ("data", "action") in placed, frozenset(constant))


def rows_from_columns(columns: Mapping[str, Any]) -> list[ColumnRow]:
    """The rows the columns hold, one by one (see :func:`parse_columns`)."""
    return parse_columns(columns).rows()


#: The RFC 4122 variant's hex digit for each random one (its top two bits 10).
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def fresh_ids(n: int) -> list[str]:
    """N new random (version 4) UUIDs as text, made in bulk (a few from the text of their
    random bytes: numpy's arrays cost more than they save there)."""
    if n < 16:
        text = os.urandom(16 * n).hex()
        return [
            f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"
            for h in (text[i : i + 32] for i in range(0, 32 * n, 32))
        ]
    raw = np.frombuffer(os.urandom(16 * n), np.uint8).reshape(n, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.tobytes().hex()
    return [
        f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        for h in (text[i : i + 32] for i in range(0, 32 * n, 32))
    ]


def column_error(exc: RowValidationError, rows: Sequence[ColumnRow]) -> InvalidArgumentError:
    """The error for a row cut from columns that its model refused: which column, which
    row, what was wrong."""
    errors = exc.errors()
    first: dict[str, Any] = dict(errors[0]) if errors else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("exp_meta", "exp_data")]
    row_id = str(exc.title).removeprefix("DataRow ").strip("'")
    position = next((i for i, row in enumerate(rows) if row.id == row_id), None)
    where = f"row {position}" if position is not None else f"row {row_id!r}"
    return InvalidArgumentError(
        f"extend(): column {'.'.join(loc) or '?'} at {where} holds {first.get('input')!r}: "
        f"{first.get('msg', 'invalid')}. Nothing was stored"
    )
