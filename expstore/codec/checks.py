"""What can be stored: one rule per kind of value, used by the validation walk here (run
when a model is built) and by the encoder (run when a row is written).

:func:`check_value` walks containers without copying anything and checks arrays and
tensors by dtype only, so it is cheap enough for a pydantic field validator.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from pydantic import BaseModel

from .._optional import loaded_torch
from ..errors import CodecError
from .format import NUMERIC_KINDS, NUMPY_DTYPES, TORCH_DTYPES

__all__ = [
    "MAX_DEPTH",
    "array_problem",
    "check_value",
    "depth_error",
    "key_problem",
    "numpy_problem",
    "text_problem",
    "too_deep",
    "torch_problem",
    "unsupported",
]

_ACCEPTED = (
    "accepted types are None, bool, int, float, str, bytes, list, tuple, dict with str keys, "
    "pydantic models, numpy arrays and scalars of bool/int/uint/float/complex dtype, "
    "and torch tensors"
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def join(path: str, key: str) -> str:
    """``path.key``, or ``key`` at the top."""
    return f"{path}.{key}" if path else key


def text_problem(text: str) -> str | None:
    """Why no database can store ``text`` (None when it can): a NUL, which PostgreSQL
    cannot store, or a lone surrogate, which is not Unicode text and cannot be written as
    UTF-8 (text decoded with ``errors="surrogateescape"`` holds them)."""
    if "\x00" in text:
        return "strings cannot hold NUL (\\x00), which PostgreSQL cannot store; remove it"
    surrogate = None if text.isascii() else _SURROGATE.search(text)
    if surrogate is not None:
        return (
            f"strings cannot hold lone surrogates ({surrogate[0]!r}), which are not Unicode "
            "text and no database can store; decode the text with errors='replace' or store "
            "its bytes"
        )
    return None


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be a key of a stored dict, or None if it can."""
    if not isinstance(key, str):
        return (
            f"dict keys must be str, got key {key!r} of type {type(key).__name__}; "
            "convert the keys to str"
        )
    problem = text_problem(key)
    return None if problem is None else f"a dict key {key!r}: {problem}"


def numpy_problem(dtype: np.dtype[Any]) -> str | None:
    """Why an array of ``dtype`` cannot be stored, or None if it can."""
    if dtype.kind in NUMERIC_KINDS:
        if dtype.newbyteorder("<").str in NUMPY_DTYPES:
            return None
        return f"numpy dtype {dtype} is not supported"
    if dtype.kind == "O":
        return "object arrays would need pickle; convert to a numeric dtype or a list"
    if dtype.kind in "US":
        return "string arrays are not stored as tensors; convert to a list with .tolist()"
    if dtype.kind in "Mm":
        return "datetime arrays are not supported; convert with .astype('int64') or .tolist()"
    if dtype.kind == "V":
        return "structured arrays are not supported; store each field as its own array"
    return f"numpy dtype {dtype} is not supported; convert to a numeric dtype or a list"


def array_problem(value: np.ndarray[Any, Any]) -> str | None:
    """Why a numpy array cannot be stored, or None if it can."""
    if type(value) is not np.ndarray and isinstance(value, np.ma.MaskedArray):
        return "masked arrays are not supported; store data and mask apart"
    problem = numpy_problem(value.dtype)
    return None if problem is None else f"{problem} (got numpy array of dtype {value.dtype})"


def torch_problem(tensor: Any, torch: Any) -> str | None:
    """Why ``tensor`` cannot be stored, or None if it can."""
    if tensor.layout != torch.strided:
        return f"{tensor.layout} tensors are not supported; convert with .to_dense()"
    if tensor.is_quantized:
        return "quantized tensors are not supported; convert with .dequantize()"
    if getattr(tensor, "is_nested", False):
        return "nested tensors are not supported; store a list of tensors"
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        supported = ", ".join(sorted(TORCH_DTYPES))
        return f"torch dtype {name} is not supported; supported dtypes are {supported}"
    return None


def unsupported(value: Any) -> str:
    """Why a value of a type the codec does not know cannot be stored."""
    kind = type(value)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    hint = ""
    if isinstance(value, (set, frozenset)):
        hint = "; convert the set to a (sorted) list"
    elif isinstance(value, complex):
        hint = "; wrap it as np.complex128(...) or store real and imaginary parts"
    return f"cannot store a value of type {name}; {_ACCEPTED}{hint}"


#: How deeply lists and dicts may nest in a payload field (the field itself is level 0):
#: every path that reads rows back (decoding, export, conditions, ``to_dict``) handles
#: this depth well inside Python's recursion limit.
MAX_DEPTH = 200


def depth_error(path: str) -> CodecError:
    shown = path if len(path) <= 60 else path[:60] + "..."
    return CodecError(
        f"{shown}: lists and dicts nest more than {MAX_DEPTH} levels deep (or contain "
        "themselves), beyond what expstore stores; store a flatter structure"
    )


def check_value(value: Any, path: str) -> None:
    """Raise CodecError (a ValueError, which pydantic validators report) if the encoder
    could not store ``value``: a type it cannot store, text no database can, or nesting
    deeper than :data:`MAX_DEPTH`.

    Pydantic models are accepted as they are (the encoder stores their dump).
    """
    try:
        _check(value, path, 0)
    except RecursionError:
        raise depth_error(path) from None


def too_deep(value: Any) -> bool:
    """Whether lists and dicts in ``value`` nest more than :data:`MAX_DEPTH` levels (a walk
    without recursion, stopping as soon as it knows)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _check(value: Any, path: str, depth: int) -> None:
    kind = type(value)
    if kind is str:
        if "\x00" in value or not value.isascii():
            problem = text_problem(value)
            if problem:
                raise CodecError(f"{path}: {problem}")
        return
    if value is None or kind in (bool, int, float, bytes):
        return
    if kind is dict or kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise depth_error(path)
        if kind is dict:
            for key, item in value.items():
                problem = key_problem(key)
                if problem:
                    raise CodecError(f"{path}: {problem}")
                _check(item, join(path, key), depth + 1)
        else:
            for i, item in enumerate(value):
                _check(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, np.ndarray):
        problem = array_problem(value)
        if problem:
            raise CodecError(f"{path}: {problem}")
        return
    if isinstance(value, np.generic):
        if isinstance(value, (str, bytes)):
            return
        problem = numpy_problem(value.dtype)
        if problem:
            raise CodecError(f"{path}: {problem} (got numpy scalar {value!r})")
        return
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        problem = torch_problem(value, torch)
        if problem:
            raise CodecError(f"{path}: {problem}")
        return
    if isinstance(value, str):
        return _check(str.__str__(value), path, depth)
    if isinstance(value, (BaseModel, bool, int, float, bytes, bytearray)):
        return
    if isinstance(value, dict):
        return _check(dict(value), path, depth)
    if isinstance(value, (list, tuple)):
        return _check(list(value), path, depth)
    raise CodecError(f"{path}: {unsupported(value)}")
