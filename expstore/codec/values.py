"""Comparing and flattening stored values: arrays and tensors as values, models as dicts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel

from .._optional import loaded_torch
from .checks import torch_problem
from .format import tensor_as_numpy

__all__ = ["deep_equal", "to_plain"]


def _array_bytes(value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The little-endian bytes of an array as a flat uint8 array (a view when possible)."""
    data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    return data.reshape(-1).view(np.uint8)


def deep_equal(a: Any, b: Any) -> bool:
    """Structural equality that treats arrays and tensors as values.

    Arrays and tensors are equal when they are the same kind (numpy or torch), dtype
    (ignoring byte order) and shape and hold the same bytes, so NaN equals itself and -0.0
    differs from 0.0. Dicts, lists and tuples compare item by item, pydantic models field
    by field, NaN floats equal each other; everything else uses ``==``.
    """
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype.hasobject or b.dtype.hasobject:
            return (
                a.shape == b.shape
                and a.dtype == b.dtype
                and all(deep_equal(x, y) for x, y in zip(a.flat, b.flat, strict=True))
            )
        return (
            a.shape == b.shape
            and a.dtype.newbyteorder("<") == b.dtype.newbyteorder("<")
            and bool(np.array_equal(_array_bytes(a), _array_bytes(b)))
        )
    if isinstance(a, np.generic) or isinstance(b, np.generic):
        if type(a) is not type(b):
            return False
        return deep_equal(np.asarray(a), np.asarray(b))
    torch = loaded_torch()
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout:
            return False
        if torch_problem(a, torch) or torch_problem(b, torch):
            return bool(torch.equal(a, b))
        return bool(
            np.array_equal(
                _array_bytes(tensor_as_numpy(a, torch)), _array_bytes(tensor_as_numpy(b, torch))
            )
        )
    if isinstance(a, BaseModel) or isinstance(b, BaseModel):
        return (
            type(a) is type(b)
            and deep_equal(a.__dict__, b.__dict__)
            and deep_equal(a.__pydantic_extra__, b.__pydantic_extra__)
            and deep_equal(a.__pydantic_private__, b.__pydantic_private__)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if (isinstance(a, list) and isinstance(b, list)) or (
        isinstance(a, tuple) and isinstance(b, tuple)
    ):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False


def to_plain(value: Any) -> Any:
    """Replace pydantic models with their ``model_dump()`` at any depth.

    Arrays, tensors and other values are returned as they are; dicts, lists and tuples
    are rebuilt around them.
    """
    if isinstance(value, BaseModel):
        return to_plain(value.model_dump(mode="python"))
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_plain(v) for v in value)
    return value
