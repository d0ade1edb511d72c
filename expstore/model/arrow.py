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

With ``images`` (``"auto"`` or field paths, see :mod:`expstore.model.images`), image arrays
become Hugging Face ``Image`` features instead: ``image.<path>`` (``image.state.screenshot``)
holds ``{"bytes": <PNG file>, "path": None}`` per row (null where the row has no image
there), no ``tensor.<path>`` column is made for that path, and the schema's ``huggingface``
metadata describes every column as ``datasets`` itself would (the image columns as
``{"_type": "Image"}``), so ``datasets.Dataset.from_parquet`` and
``load_dataset("parquet", ...)`` give PIL images. The images are views: the blob still holds
every array, and ``expstore import`` reads the blob only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .images import ImageSelection, as_image, image_problem, png_bytes, short
from .layout import PAYLOAD_FIELDS
from .paths import MISSING, walk
from .rows import DataRow

__all__ = [
    "IMAGE_PREFIX",
    "TENSOR_PREFIX",
    "ImageColumn",
    "TensorColumn",
    "hf_features",
    "image_columns",
    "image_fields",
    "image_table",
    "tensor_columns",
    "tensor_table",
]

TENSOR_PREFIX = "tensor."
IMAGE_PREFIX = "image."
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


# ---------------------------------------------------------------------------------------
# Images as Hugging Face Image features


class ImageColumn(NamedTuple):
    """An image column: its name (``image.state.screenshot``), the payload field and the
    steps into it, and whether every value there must be an image (a named path) or only
    images are taken (``"auto"``)."""

    name: str
    top: str
    steps: tuple[str | int, ...]
    strict: bool

    @property
    def dotted(self) -> tuple[str, ...]:
        """The path as :class:`TensorColumn` spells it (a tensor column it replaces)."""
        return (self.top, *map(str, self.steps))


def image_columns(rows: Sequence[DataRow], selection: ImageSelection) -> list[ImageColumn]:
    """The image columns of a table: each named path, or (``"auto"``) each path where one of
    ``rows`` holds an image array."""
    if selection.paths is not None:
        return [
            ImageColumn(IMAGE_PREFIX + short(path), path.top, path.steps, True)
            for path in selection.paths
            if path.top is not None
        ]
    found: dict[tuple[str | int, ...], ImageColumn] = {}
    for row in rows:
        for image in selection.find(row):
            if image.path not in found:
                top, *steps = image.path
                found[image.path] = ImageColumn(
                    IMAGE_PREFIX + image.where, str(top), tuple(steps), False
                )
    return list(found.values())


def image_type(pa: Any) -> Any:
    """The Arrow type of a Hugging Face ``Image`` feature: ``struct<bytes, path>``."""
    return pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])


def image_fields(pa: Any, columns: Iterable[ImageColumn]) -> list[Any]:
    return [pa.field(c.name, image_type(pa), metadata={"image": "png"}) for c in columns]


def image_table(pa: Any, rows: Sequence[DataRow], columns: Sequence[ImageColumn]) -> dict[str, Any]:
    """The image columns over ``rows`` as Arrow arrays by name: PNG bytes per row, null
    where a row has none. A named path holding something else than an image raises
    InvalidArgumentError (or UnsupportedTypeError) naming the row."""
    out: dict[str, Any] = {}
    for column in columns:
        cells: list[dict[str, Any] | None] = []
        for row in rows:
            value = walk(getattr(row.exp_data, column.top), column.steps)
            if value is MISSING or value is None:
                cells.append(None)
                continue
            where = f"row {row.id}: exp_data.{column.name.removeprefix(IMAGE_PREFIX)}"
            if not column.strict and image_problem(value) is not None:
                cells.append(None)  # "auto": not an image in this row
                continue
            array = as_image(value, where)
            cells.append({"bytes": png_bytes(array, where), "path": None})
        out[column.name] = pa.array(cells, type=image_type(pa))
    return out


_VALUE_NAMES = {"halffloat": "float16", "float": "float32", "double": "float64"}


def _feature(pa: Any, kind: Any) -> dict[str, Any]:
    """The ``datasets`` feature (as ``Features.to_dict`` spells it) of an Arrow type that
    the export writes: a ``Value`` or a fixed-length ``Sequence`` of them."""
    if pa.types.is_fixed_size_list(kind):
        return {
            "feature": _feature(pa, kind.value_type),
            "length": kind.list_size,
            "_type": "Sequence",
        }
    name = str(kind)
    return {"dtype": _VALUE_NAMES.get(name, name), "_type": "Value"}


def hf_features(pa: Any, schema: Any, images: Iterable[ImageColumn]) -> dict[str, str]:
    """The schema metadata that makes ``datasets`` read the image columns as ``Image``:
    ``{"huggingface": '{"info": {"features": {...}}}'}`` describing every column, as
    ``datasets``' own writer does (versions before 2.17 take the features from there
    whole; later ones take each column whose type matches)."""
    names = {c.name for c in images}
    features = {
        field.name: {"_type": "Image"} if field.name in names else _feature(pa, field.type)
        for field in schema
    }
    return {"huggingface": json.dumps({"info": {"features": features}})}
