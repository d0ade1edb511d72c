"""Checks of scalar arguments, written once: each returns the value normalised or raises
:class:`~expstore.errors.InvalidArgumentError` saying what was expected and what arrived."""

from __future__ import annotations

import math
from typing import Any, Literal, overload

import numpy as np

from .codec.checks import text_problem
from .errors import InvalidArgumentError, UnsupportedTypeError

__all__ = ["MAX_BATCH", "MAX_INT64", "check_int", "check_number", "check_text", "seeded_rng"]

#: The largest integer a database column holds (BIGINT), for counts stored there.
MAX_INT64 = 2**63 - 1
#: The most rows one batch or claim may ask for: beyond it the key arrays alone would not
#: fit in memory (10M keys are 80 MB); ask in several batches instead.
MAX_BATCH = 10_000_000


@overload
def check_int(
    name: str,
    value: Any,
    *,
    minimum: int | None = ...,
    maximum: int = ...,
    optional: Literal[False] = ...,
) -> int: ...
@overload
def check_int(
    name: str, value: Any, *, minimum: int | None = ..., maximum: int = ..., optional: Literal[True]
) -> int | None: ...


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int = MAX_INT64,
    optional: bool = False,
) -> int | None:
    """``value`` as an int (numpy integers accepted, bools refused), at least ``minimum``
    and at most ``maximum`` (by default the largest a database column holds); None passes
    when ``optional``."""
    if value is None and optional:
        return None
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if not ok or (minimum is not None and value < minimum) or value > maximum:
        wanted = "an int" if minimum is None else f"an int >= {minimum}"
        if ok and value > maximum:
            wanted += f" and <= {maximum:,}"
        if optional:
            wanted = f"None or {wanted}"
        raise InvalidArgumentError(f"{name} must be {wanted}, got {value!r}")
    return int(value)


def check_text(name: str, value: Any) -> str:
    """``value`` as a str a database can store and compare (no NUL, no lone surrogates);
    UnsupportedTypeError for another type, InvalidArgumentError for such text."""
    if not isinstance(value, str):
        raise UnsupportedTypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    problem = text_problem(value)
    if problem:
        raise InvalidArgumentError(f"{name}: {problem}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
) -> float:
    """``value`` as a finite float (ints accepted, bools refused), within ``minimum`` and
    ``maximum``, or above 0 when ``positive``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if ok:
        ok = math.isfinite(value)
    if ok and minimum is not None:
        ok = value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if ok and positive:
        ok = value > 0
    if not ok:
        if minimum is not None and maximum is not None:
            bound = f" in [{minimum:g}, {maximum:g}]"
        elif positive:
            bound = " > 0"
        else:
            bound = "" if minimum is None else f" >= {minimum:g}"
        raise InvalidArgumentError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def seeded_rng(seed: Any) -> np.random.Generator:
    """``np.random.default_rng(seed)``, or a typed error saying what a seed may be."""
    if isinstance(seed, bool):
        raise UnsupportedTypeError(f"seed must be None or an int >= 0, got {seed!r}")
    try:
        return np.random.default_rng(seed)
    except TypeError:
        raise UnsupportedTypeError(
            f"seed must be None or an int >= 0 (or a numpy SeedSequence), got {seed!r}"
        ) from None
    except ValueError:
        raise InvalidArgumentError(f"seed must be None or an int >= 0, got {seed!r}") from None
