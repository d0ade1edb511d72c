"""Rows as Arrow tables: ``buffer.to_arrow(condition)``, ``to_pandas``, and the Parquet export.

A table has the export's columns (``id``, the metadata and scalar columns, ``data`` as JSON
text, ``tensors`` the blob of ``docs/format.md``: every bit, every dtype, the round trip
``expstore import`` reads) and, so that pandas, polars and Hugging Face datasets give arrays
directly:

- ``tensor.<path>`` for each array or tensor found at a dict path of the payload
  (``tensor.state.obs``) with one dtype and shape in the first rows of the table: a
  fixed-size list per dimension (``[N, 3, 2]`` float32 is a list of 3 lists of 2 floats),
  the shape, the stored dtype and the dtype it came from in the field's metadata. bfloat16
  tensors become float32 (exact: every bfloat16 is a float32); float8 and complex ones stay
  in the blob only. A row whose value at the path has another shape or dtype (or none) has
  null there; its blob still holds it.
- ``execute_time_us``: ``execute_time`` in whole microseconds since the epoch (int64), so
  readers that narrow floats (datasets' torch format casts float64 to float32: two-minute
  steps) keep the time; an integer, not an Arrow timestamp, because datasets' torch format
  cannot make tensors of timestamps. ``execute_time`` itself stays float64, exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .layout import PAYLOAD_FIELDS
from .rows import DataRow

__all__ = ["TENSOR_PREFIX", "TensorColumn", "tensor_columns", "tensor_table"]

TENSOR_PREFIX = "tensor."
#: How deep into dicts tensors are looked for.
_DEPTH = 6


class TensorColumn(NamedTuple):
    """An array column: where its values are, their dtype (as Arrow holds them), shape, and
    what they were stored as."""

    path: tuple[str, ...]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    source: str  # numpy dtype string or torch dtype name


def _as_array(value: Any) -> tuple[np.ndarray, str] | None:
    """A value as a numeric numpy array Arrow can hold, and what it was; None for others."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf" and value.dtype.itemsize <= 8:
            return value, value.dtype.str
        return None
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "detach"):
        return None
    name = str(dtype).removeprefix("torch.")
    if name == "bfloat16":
        return value.detach().cpu().float().numpy(), name
    if name.startswith(("float8", "complex")) or name in ("uint16", "uint32", "uint64"):
        return None
    return value.detach().cpu().resolve_conj().resolve_neg().numpy(), name


def _walk(value: Any, path: tuple[str, ...], out: dict[tuple[str, ...], Any]) -> None:
    if isinstance(value, dict):
        if len(path) < _DEPTH:
            for key, item in value.items():
                if isinstance(key, str):
                    _walk(item, (*path, key), out)
        return
    found = _as_array(value)
    if found is not None:
        out[path] = found


def _arrays(row: DataRow) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for name in PAYLOAD_FIELDS:
        value = getattr(row.exp_data, name)
        if isinstance(value, dict):
            _walk(value, (name,), out)
    return out


def tensor_columns(rows: Sequence[DataRow]) -> list[TensorColumn]:
    """The array columns ``rows`` agree on: each path's dtype and shape as the first row
    with an array there has them (later rows that differ get null)."""
    found: dict[tuple[str, ...], TensorColumn] = {}
    for row in rows:
        for path, (array, source) in _arrays(row).items():
            if path not in found:
                found[path] = TensorColumn(path, array.dtype, tuple(array.shape), source)
    return list(found.values())


def _arrow_type(pa: Any, column: TensorColumn) -> Any:
    kind = pa.from_numpy_dtype(column.dtype)
    for size in reversed(column.shape):
        kind = pa.list_(kind, size)
    return kind


def tensor_fields(pa: Any, columns: Iterable[TensorColumn]) -> list[Any]:
    """The Arrow fields of the array columns, with their shape and dtypes as metadata."""
    return [
        pa.field(
            TENSOR_PREFIX + ".".join(c.path),
            _arrow_type(pa, c),
            metadata={
                "shape": str(list(c.shape)),
                "dtype": c.dtype.str,
                "stored_as": c.source,
            },
        )
        for c in columns
    ]


def tensor_table(pa: Any, rows: Sequence[DataRow], columns: Sequence[TensorColumn]) -> Any:
    """The array columns over ``rows``, and ``execute_time_us``, as Arrow arrays by name."""
    out: dict[str, Any] = {}
    per_row = [_arrays(row) for row in rows]
    for column, field in zip(columns, tensor_fields(pa, columns), strict=True):
        stacked = np.zeros((len(rows), *column.shape), dtype=column.dtype)
        present = np.zeros(len(rows), dtype=bool)
        for i, arrays in enumerate(per_row):
            got = arrays.get(column.path)
            if got is not None and got[0].shape == column.shape and got[0].dtype == column.dtype:
                stacked[i] = got[0]
                present[i] = True
        values: Any = pa.array(stacked.reshape(-1))
        sizes = column.shape
        for size in reversed(sizes[1:]):
            values = pa.FixedSizeListArray.from_arrays(values, size)
        if sizes:
            values = pa.FixedSizeListArray.from_arrays(values, sizes[0], mask=pa.array(~present))
        else:  # a 0-d array: one number per row
            values = pa.array(stacked, mask=~present)
        out[field.name] = values
    micros = np.array([round(row.exp_meta.execute_time * 1e6) for row in rows], dtype=np.int64)
    out["execute_time_us"] = pa.array(micros, type=pa.int64())
    return out
