"""Many rows' payloads encoded at once from columns (``buffer.extend``).

When every row's payload has the same structure (a dict of columns), the documents differ
only in the scalar values a column gives each row, and the blobs only in the tensors'
bytes, which sit at the same offsets in every row. A :class:`ColumnPayloads` is made once
per batch:

- the document *template*: row 0's payload, each per-row scalar replaced by a marker,
  encoded by :class:`~expstore.codec.encode.PayloadWriter` (so placeholders, escaping and
  key order are the encoder's own) and cut at the markers into a format string;
- per-row scalars as JSON text, column by column (``tolist`` plus one C-level map);
- the blob: every tensor column converted once to its stored dtype, its rows' bytes
  copied into an ``[rows, size]`` array at the offsets the encoder gives them, the header's
  checksum computed per row over that row's bytes.

What it does not cover (arrays large enough to be stored by digest, per-row lists or dicts,
tagged floats, objects, text a database refuses, dtypes the fast tables lack) makes
:func:`plan_payloads` return None, and the caller encodes row by row. Rows 0 and N-1 are
encoded by the row encoder too and must come out identical, so a template that does not
hold is never used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._optional import loaded_torch
from ..errors import CodecError
from .checks import key_problem, text_problem, torch_problem
from .compression import EXTERNAL_THRESHOLD
from .encode import PayloadWriter
from .format import (
    ALIGNMENT,
    MAGIC_BYTES,
    STORED_DTYPE,
    TAGGED_MAGNITUDE,
    TORCH_DTYPES,
    crc32,
    row_seed,
    tagged_float,
    tensor_as_numpy,
)

__all__ = ["ColumnPayloads", "Listed", "Same", "plan_payloads"]

_MARK = "\ue000"
_MARKER = re.compile(f'"{_MARK}([0-9]+){_MARK}"')
_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})
_JSON_BOOL = {True: "true", False: "false"}
_json_string: Callable[[str], str] = getattr(
    json.encoder, "c_encode_basestring", json.encoder.py_encode_basestring
)


class _Unfit(Exception):
    """A column the template cannot express: the caller encodes row by row."""


class Same:
    """One value every row holds as it is (a default such as ``[]`` or ``{}``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Listed:
    """A column whose every row holds its value inside a list of one (AWorld's singular
    ``action`` stored as ``actions``)."""

    __slots__ = ("column",)

    def __init__(self, column: Any) -> None:
        self.column = column


class _Slot:
    """A per-row scalar: its values, and their JSON text."""

    __slots__ = ("text", "values")

    def __init__(self, values: list[Any], text: Callable[[list[Any]], list[str]]) -> None:
        self.values = values
        self.text = text


class _Tensor:
    """A per-row array: the column as its stored bytes, ``[rows, nbytes]``."""

    __slots__ = ("column", "rows", "stored")

    def __init__(self, column: Any, stored: np.ndarray[Any, Any], n: int) -> None:
        self.column = column
        self.stored = stored.reshape(n, -1).view(np.uint8) if stored.size else None
        self.rows = stored.nbytes // n if n else 0


def _scalar_texts(values: list[Any]) -> list[str]:
    """JSON text of plain scalars (str, int, bool, None, untagged floats)."""
    out: list[str] = []
    append = out.append
    for value in values:
        kind = type(value)
        if kind is str:
            append(_json_string(value))
        elif kind is bool:
            append(_JSON_BOOL[value])
        elif value is None:
            append("null")
        elif kind is int:
            append(int.__repr__(value))
        else:
            append(float.__repr__(value))
    return out


def _bool_texts(values: list[Any]) -> list[str]:
    return list(map(_JSON_BOOL.__getitem__, values))


def _int_texts(values: list[Any]) -> list[str]:
    return list(map(int.__repr__, values))


def _float_texts(values: list[Any]) -> list[str]:
    return list(map(float.__repr__, values))


def _floats_untagged(array: np.ndarray[Any, Any]) -> bool:
    """Whether no value would be stored as a ``__float__`` placeholder."""
    array = array.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(
            np.isfinite(array).all()
            and (np.abs(array) < TAGGED_MAGNITUDE).all()
            and not (np.signbit(array) & (array == 0)).any()
        )


def _text_ok(strings: Sequence[str]) -> bool:
    joined = "".join(strings)
    return text_problem(joined) is None


def _array_node(value: np.ndarray[Any, Any], n: int) -> _Slot | _Tensor:
    if value.ndim == 1:
        kind = value.dtype.kind
        if kind == "b":
            return _Slot(value.tolist(), _bool_texts)
        if kind in "iu" and value.dtype.itemsize <= 8:
            return _Slot(value.tolist(), _int_texts)
        if kind == "f" and value.dtype.itemsize <= 8 and _floats_untagged(value):
            return _Slot(value.tolist(), _float_texts)
        if kind == "U":
            strings = value.tolist()
            if _text_ok(strings):
                return _Slot(strings, _scalar_texts)
        raise _Unfit
    stored = STORED_DTYPE.get(value.dtype) if type(value) is np.ndarray else None
    if stored is None:
        raise _Unfit
    return _Tensor(value, np.ascontiguousarray(value, dtype=stored), n)


def _node(value: Any, n: int) -> Any:
    """The plan of one column (see :func:`plan_payloads`)."""
    if type(value) is np.ndarray:  # the common cases first (no ABC checks)
        return _array_node(value, n)
    if type(value) is Same:
        return value.value
    if isinstance(value, Same):
        return value.value
    if isinstance(value, Listed):
        return Listed(_node(value.column, n))
    if type(value) in _PLAIN_SCALARS:  # the same value in every row
        if (type(value) is float and tagged_float(value)) or (
            type(value) is str and not _text_ok([value])
        ):
            raise _Unfit
        return value
    if isinstance(value, np.generic):
        raise _Unfit
    if isinstance(value, Mapping):
        if not all(type(key) is str and key_problem(key) is None for key in value):
            raise _Unfit  # the row encoder refuses (or converts) such keys
        return {key: _node(item, n) for key, item in value.items()}
    if type(value) is np.ndarray:  # subclasses (masked arrays...) take the row path
        return _array_node(value, n)
    if isinstance(value, np.ndarray):
        raise _Unfit
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.ndim == 1:
            return _node(value.tolist(), n)
        if (
            str(value.dtype).removeprefix("torch.") not in TORCH_DTYPES
            or value.is_complex()
            or torch_problem(value, torch) is not None
        ):
            raise _Unfit
        return _Tensor(value, tensor_as_numpy(value, torch), n)
    if isinstance(value, (list, tuple)):
        values = list(value)
        kinds = set(map(type, values))
        if not kinds <= _PLAIN_SCALARS:
            raise _Unfit
        if float in kinds and not _floats_untagged(
            np.array([v for v in values if type(v) is float], dtype=np.float64)
        ):
            raise _Unfit
        if str in kinds and not _text_ok([v for v in values if type(v) is str]):
            raise _Unfit
        return _Slot(values, _scalar_texts)
    raise _Unfit


class ColumnPayloads:
    """Documents and blobs for the rows of a batch given as columns (see the module doc)."""

    def __init__(self, fields: dict[str, Any], n: int) -> None:
        self.fields = fields
        self.n = n
        self.slots: list[_Slot] = []
        self.tensors: list[_Tensor] = []
        template = {name: self._template(node) for name, node in fields.items()}
        if any(tensor.rows >= EXTERNAL_THRESHOLD for tensor in self.tensors):
            raise _Unfit  # stored by digest: the row encoder does that
        text, _ = PayloadWriter().encode(template)
        parts = _MARKER.split(text)
        order = [int(i) for i in parts[1::2]]
        if sorted(order) != list(range(len(self.slots))):
            raise _Unfit  # a marker the encoder did not write as it is
        self.order = [self.slots[i] for i in order]
        escaped = [part.replace("{", "{{").replace("}", "}}") for part in parts[::2]]
        self.format = "{}".join(escaped)
        self.offsets: list[int] = []
        size = 0
        for tensor in self.tensors:  # the encoder's layout: each at an aligned offset
            offset = -(-size // ALIGNMENT) * ALIGNMENT
            self.offsets.append(offset)
            size = offset + tensor.rows
        self.size = size

    def _template(self, node: Any) -> Any:
        """Row 0's payload with a marker for each per-row scalar; notes slots and tensors
        in the order the encoder meets them."""
        if isinstance(node, _Slot):
            self.slots.append(node)
            return f"{_MARK}{len(self.slots) - 1}{_MARK}"
        if isinstance(node, _Tensor):
            self.tensors.append(node)
            return node.column[0]
        if isinstance(node, Listed):
            return [self._template(node.column)]
        if isinstance(node, dict):
            return {key: self._template(item) for key, item in node.items()}
        return node

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i``'s payload as the row encoder would get it."""
        return {name: _row(node, i) for name, node in self.fields.items()}

    def encode(self, start: int, stop: int, ids: Sequence[str]) -> tuple[list[str], list[Any]]:
        """The documents (JSON text) and blobs of rows ``start:stop``, whose ids are
        ``ids`` (one per row)."""
        stop = min(stop, self.n)
        count = stop - start
        if self.order:
            texts = [slot.text(slot.values[start:stop]) for slot in self.order]
            docs = list(map(self.format.format, *texts))
        else:
            docs = [self.format.format()] * count
        if not self.tensors:
            return docs, [None] * count
        size = self.size
        body = np.zeros((count, size), np.uint8)
        for tensor, offset in zip(self.tensors, self.offsets, strict=True):
            if tensor.stored is not None:
                body[:, offset : offset + tensor.rows] = tensor.stored[start:stop]
        raw = memoryview(body.tobytes())
        crcs = [
            crc32(raw[j * size : (j + 1) * size], row_seed(row_id)) for j, row_id in enumerate(ids)
        ]
        full = np.empty((count, size + 8), np.uint8)
        full[:, :4] = MAGIC_BYTES
        full[:, 4:8] = np.array(crcs, "<u4").view(np.uint8).reshape(count, 4)
        full[:, 8:] = body
        whole = full.tobytes()
        width = size + 8
        return docs, [whole[j * width : (j + 1) * width] for j in range(count)]


def _row(node: Any, i: int) -> Any:
    if isinstance(node, _Slot):
        return node.values[i]
    if isinstance(node, _Tensor):
        return node.column[i]
    if isinstance(node, Listed):
        return [_row(node.column, i)]
    if isinstance(node, dict):
        return {key: _row(item, i) for key, item in node.items()}
    return node


def plan_payloads(columns: Mapping[str, Any], n: int) -> ColumnPayloads | None:
    """How to encode the payloads of ``n`` rows from ``columns`` (payload field -> column,
    in the stored field order; a plain value or a :class:`Same` is every row's; a
    :class:`Listed` column wraps each row's value in a list), or None when a column needs
    the row encoder. The caller checks rows against the row encoder before using it."""
    try:
        return ColumnPayloads({name: _node(value, n) for name, value in columns.items()}, n)
    except (_Unfit, CodecError, ValueError, TypeError, RuntimeError):
        return None
