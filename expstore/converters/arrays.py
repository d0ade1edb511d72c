"""NumpyConverter: a dict of stacked numpy arrays from metadata columns and tensor paths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from .._optional import loaded_torch
from ..errors import InvalidArgumentError
from ..model.rows import DataRow
from ..storage.base import Fetched
from .base import MISSING, Converter, FieldSpec, parse_path, read_path

__all__ = ["NumpyConverter"]


class NumpyConverter(Converter[dict[str, Any]]):
    """A dict of numpy arrays, one per field, stacked along a new first (batch) axis.

    ``NumpyConverter(fields, *, dtypes=None, pad_value=0, mask=None, strict=True)``

    - ``fields``: output name -> field path (``"exp_meta.step"``, ``"exp_data.reward_t"``,
      ``"exp_data.state.image_features"``, ``"exp_data.actions.0"``) or a function of the row.
    - Numbers, arrays, tensors and (nested) lists of numbers are stacked; dtypes follow the
      data (float32 tensors stay float32, Python floats give float64, ints int64) unless
      ``dtypes`` names one for the output. torch tensors of a dtype numpy lacks (bfloat16,
      the float8 types) become float32, which holds each of their values exactly
      (complex32 becomes complex64); :class:`TensorConverter` turns them back.
    - Variable-length values (shapes that differ between rows, same number of dimensions)
      are padded with ``pad_value`` to the largest shape, and ``<name>_mask`` (bool, same
      shape) is True where a value is real. A row without the value (``None``, or nothing
      at the path) is all padding. ``mask=None`` adds the mask only to fields that needed
      padding in that batch; ``mask=True`` always adds it (stable keys across batches);
      ``mask=False`` never does.
    - Anything else (strings, dicts) comes back as an object array.
    - ``strict=True``: a path that no row of the batch has raises ValueError (a typo, most
      likely); with ``strict=False`` it gives an array of None.

    >>> conv = NumpyConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    """

    def __init__(
        self,
        fields: Mapping[str, FieldSpec],
        *,
        dtypes: Mapping[str, Any] | None = None,
        pad_value: float = 0,
        mask: bool | None = None,
        strict: bool = True,
    ) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise InvalidArgumentError(
                "fields must be a non-empty dict of output name -> field path, e.g. "
                "{'obs': 'exp_data.state.image_features', 'reward': 'exp_data.reward_t'}"
            )
        self.fields = dict(fields)
        self._readers: dict[str, Any] = {}
        for name, spec in self.fields.items():
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(f"output names must be non-empty strings, got {name!r}")
            if callable(spec):
                self._readers[name] = spec
            else:
                self._readers[name] = parse_path(spec)
        unknown = sorted(set(dtypes or {}) - set(self.fields))
        if unknown:
            raise InvalidArgumentError(f"dtypes names {unknown}, which are not among the fields")
        self.dtypes = dict(dtypes or {})
        self.pad_value = pad_value
        self.mask = mask
        self.strict = strict

    def _values(self, name: str, rows: Sequence[DataRow]) -> list[Any]:
        reader = self._readers[name]
        if callable(reader):
            return [reader(row) for row in rows]
        return [read_path(row, reader) for row in rows]

    #: Every array is stacked (copied) into the batch.
    copies_arrays = True

    @property
    def paths(self) -> list[str] | None:
        """The path of every field, in order, or None if a field is a function of the row.

        With paths, :meth:`ReplayBuffer.sample` fetches just those fields of the chosen rows
        (``storage.fetch_columns``), never building whole rows.
        """
        if any(callable(spec) for spec in self.fields.values()):
            return None
        return [str(spec) for spec in self.fields.values()]

    def to_dataset_row(self, rows: Sequence[DataRow]) -> dict[str, Any]:
        return self.from_values({name: self._values(name, rows) for name in self.fields})

    def build(self, fetched: Fetched) -> dict[str, Any]:
        if fetched.columns is None:
            return super().build(fetched)
        return self.from_values(dict(zip(self.fields, fetched.columns, strict=True)))

    def from_values(self, values_by_field: dict[str, Any]) -> dict[str, Any]:
        """The batch from each field's values, one per row (MISSING where a row has none):
        a list, or an array whose first axis runs over the rows (numeric: taken as the
        field's batch as it is)."""
        out: dict[str, Any] = {}
        for name in self.fields:
            values = values_by_field[name]
            if (
                self.strict
                and type(values) is list
                and values
                and all(v is MISSING for v in values)
            ):
                raise InvalidArgumentError(
                    f"no row of the batch has field {name!r} ({self.fields[name]!r}); check "
                    "the path, or pass strict=False to get None for rows without it"
                )
            array, mask = stack_values(name, values, self.dtypes.get(name), self.pad_value)
            out[name] = array
            if self.mask or (self.mask is None and mask is not None):
                out[f"{name}_mask"] = mask if mask is not None else _present(array)
        return out


def _present(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        return np.array([v is not None for v in array], dtype=bool)
    return np.ones(array.shape, dtype=bool)


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a numeric array, or None if it is not numeric data."""
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "biufc" else None
    if isinstance(value, (bool, int, float, np.generic)):
        array = np.asarray(value)
        return array if array.dtype.kind in "biufc" else None
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        stand_in = numpy_stand_in(value.dtype)
        return cast(
            "np.ndarray | None", (value if stand_in is None else value.to(stand_in)).numpy()
        )
    if isinstance(value, (list, tuple)):
        try:
            array = np.asarray(value)
        except ValueError:  # ragged nested lists
            return None
        return array if array.dtype.kind in "biufc" else None
    return None


def numpy_stand_in(torch_dtype: Any) -> Any | None:
    """The torch dtype to upcast a tensor of ``torch_dtype`` to before it becomes a numpy
    array, when numpy has no equivalent (bfloat16 and the float8 types: float32, which
    holds their values exactly; complex32: complex64); None when numpy has one."""
    torch = loaded_torch()
    if torch is None or not isinstance(torch_dtype, torch.dtype):
        return None
    if torch_dtype.is_floating_point:
        numpy_has = torch_dtype in (torch.float16, torch.float32, torch.float64)
        return None if numpy_has else torch.float32
    if torch_dtype.is_complex:
        return torch.complex64 if torch_dtype == getattr(torch, "complex32", None) else None
    return None


#: The array dtype of a column of Python numbers of one type.
_NATURAL: dict[type, Any] = {float: np.float64, int: np.int64, bool: np.bool_}


def stack_values(
    name: str, values: list[Any] | np.ndarray, dtype: Any = None, pad_value: float = 0
) -> tuple[np.ndarray, np.ndarray | None]:
    """Stack one field's values: (array, mask or None when nothing was padded).

    Numeric values are stacked (padded to the largest shape when shapes differ or a value
    is missing); other values give an object array and no mask. A numeric array whose first
    axis runs over the rows is already stacked: it is used as it is (cast to ``dtype``).
    """
    if isinstance(values, np.ndarray):
        if values.dtype.kind in "biufc" and values.ndim >= 1:
            return values.astype(dtype or values.dtype, copy=False), None
        values = list(values)
    first = values[0] if values else None
    kind_of_first = type(first)
    if kind_of_first in _NATURAL and set(map(type, values)) == {kind_of_first}:
        # a numeric column (rewards, steps, done flags): one array at once
        try:
            natural = _NATURAL[kind_of_first]
            return np.array(values, dtype=dtype or natural), None
        except OverflowError:  # ints beyond int64: value by value, as below
            pass
    if kind_of_first is list and all(type(v) is list for v in values):
        # lists of numbers of one length (actions): numpy reads them at once
        try:
            array = np.array(values)
        except (ValueError, OverflowError):  # ragged, or ints beyond int64: as below
            array = None
        if array is not None and array.dtype.kind in "biufc" and array.ndim >= 2:
            return array.astype(dtype or array.dtype, copy=False), None
    if type(first) is np.ndarray and first.dtype.kind in "biufc":
        # The common case, in one pass: arrays of one shape and dtype (a tensor field).
        shape, kind = first.shape, first.dtype
        if all(type(v) is np.ndarray and v.shape == shape and v.dtype == kind for v in values):
            return np.stack(values).astype(dtype or kind, copy=False), None
    present = [v is not MISSING and v is not None for v in values]
    arrays = [_as_array(v) if p else None for v, p in zip(values, present, strict=True)]
    numeric = any(present) and all(a is not None for a, p in zip(arrays, present, strict=True) if p)
    if not numeric:
        out = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            if isinstance(value, np.ndarray) and not value.flags.writeable:
                value = value.copy()  # a read-only view of fetched bytes: the batch owns it
            out[i] = None if value is MISSING else value
        return out, None
    real = [a for a in arrays if a is not None]
    if dtype is None:
        dtype = _common_dtype(real)
    shapes = {a.shape for a in real}
    if all(present) and len(shapes) == 1:
        return np.stack(real).astype(dtype, copy=False), None
    ndims = {len(s) for s in shapes}
    if len(ndims) != 1:
        raise InvalidArgumentError(
            f"field {name!r} mixes values with different numbers of dimensions "
            f"({sorted(shapes)}); only lengths may vary between rows"
        )
    ndim = ndims.pop()
    largest = tuple(max(s[d] for s in shapes) for d in range(ndim))
    out = np.full((len(values), *largest), pad_value, dtype=dtype)
    mask = np.zeros((len(values), *largest), dtype=bool)
    for i, array in enumerate(arrays):
        if array is not None:
            region: tuple[int | slice, ...] = (i, *(slice(0, n) for n in array.shape))
            out[region] = array
            mask[region] = True
    return out, mask


def _common_dtype(arrays: list[np.ndarray]) -> np.dtype[Any]:
    # np.result_type takes at most 32 arguments; fold over the distinct dtypes instead.
    result = arrays[0].dtype
    for dt in {a.dtype for a in arrays}:
        result = np.result_type(result, dt)
    return result
