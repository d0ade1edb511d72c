"""TensorConverter: a dict of stacked torch tensors from metadata columns and tensor paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._optional import loaded_torch, require
from ..errors import InvalidArgumentError
from .arrays import NumpyConverter, numpy_stand_in
from .base import MISSING, FieldSpec

__all__ = ["TensorConverter"]


class TensorConverter(NumpyConverter):
    """A dict of torch tensors, one per field, stacked along a new first (batch) axis.

    ``TensorConverter(fields, device=None, *, dtypes=None, pad_value=0, mask=None,
    strict=True)``

    Builds the batch exactly as :class:`NumpyConverter` (same paths, padding and
    ``<name>_mask`` rules), then turns every numeric array into a tensor on ``device``
    (``None``: CPU). Fields that are not numbers (strings, dicts) come back as lists, as
    ``torch.utils.data.default_collate`` does. ``dtypes`` may name numpy or torch dtypes.
    A field whose values are all torch tensors of one dtype numpy lacks (bfloat16, the
    float8 types) keeps that dtype, although :class:`NumpyConverter` gives float32 for it;
    a dtype named in ``dtypes`` for the field wins.
    torch is imported when the converter is created, so ``import expstore`` never needs it.

    With :class:`~expstore.samplers.PrioritizedSampler`, ``buffer.sample`` adds
    ``"weights"`` (a float32 tensor on ``device``) and ``"ids"`` (a list of row ids).

    >>> conv = TensorConverter({"obs": "exp_data.state.image_features",
    ...                         "reward": "exp_data.reward_t", "step": "exp_meta.step"})
    """

    def __init__(
        self,
        fields: Mapping[str, FieldSpec],
        device: Any = None,
        *,
        dtypes: Mapping[str, Any] | None = None,
        pad_value: float = 0,
        mask: bool | None = None,
        strict: bool = True,
    ) -> None:
        torch = require("torch", "TensorConverter")
        torch_dtypes = {k: v for k, v in (dtypes or {}).items() if isinstance(v, torch.dtype)}
        numpy_dtypes = {k: v for k, v in (dtypes or {}).items() if k not in torch_dtypes}
        super().__init__(fields, dtypes=numpy_dtypes, pad_value=pad_value, mask=mask, strict=strict)
        unknown = sorted(set(torch_dtypes) - set(self.fields))
        if unknown:
            raise InvalidArgumentError(f"dtypes names {unknown}, which are not among the fields")
        self.torch_dtypes = torch_dtypes
        self.device = None if device is None else torch.device(device)

    def from_values(self, values_by_field: dict[str, list[Any]]) -> dict[str, Any]:
        arrays = super().from_values(values_by_field)
        dtypes = dict(self.torch_dtypes)
        for name in self.fields:
            if name not in dtypes and name not in self.dtypes:
                dtypes[name] = _lacking_dtype(values_by_field[name])
        return {name: self._tensor(value, dtypes.get(name)) for name, value in arrays.items()}

    def _tensor(self, value: np.ndarray, dtype: Any = None) -> Any:
        if value.dtype == object:
            return value.tolist()
        torch = require("torch", "TensorConverter")
        if not value.flags.writeable:
            value = value.copy()
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if dtype is not None or self.device is not None:
            tensor = tensor.to(device=self.device, dtype=dtype)
        return tensor

    def convert_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """Numeric extras (``weights``) become tensors on ``device``; ``ids`` stay a list."""
        return {
            name: self._tensor(value) if isinstance(value, np.ndarray) else value
            for name, value in info.items()
        }


def _lacking_dtype(values: list[Any] | np.ndarray) -> Any:
    """The torch dtype of ``values`` when every one present is a tensor of one dtype numpy
    lacks (bfloat16, say), which NumpyConverter upcast; else None (keep numpy's dtype)."""
    torch = loaded_torch()
    if torch is None or isinstance(values, np.ndarray):
        return None
    found = None
    for value in values:
        if value is None or value is MISSING:
            continue
        if not isinstance(value, torch.Tensor) or found not in (None, value.dtype):
            return None
        found = value.dtype
    return found if numpy_stand_in(found) is not None else None
