"""Checks of arguments, written once: each returns the value normalised or raises a typed
error (:class:`~expstore.errors.InvalidArgumentError`, UnsupportedTypeError, QueryError)
saying what was expected and what arrived.

Checks that need a higher layer's concept stay with it: ``check_dedup``
(:mod:`expstore.dedup`'s modes), ``check_retention``
(:mod:`expstore.retention.eviction`'s policies), ``check_pattern`` (the LIKE grammar of
:mod:`expstore.query._like`), ``check_revision`` (the migrations'
revisions, :mod:`expstore.cli._common`); ``check_value`` is the codec's, below this module."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from .codec.checks import text_problem
from .errors import InvalidArgumentError, QueryError, UnsupportedTypeError

__all__ = [
    "MAX_BATCH",
    "MAX_CHECKPOINT_DEPTH",
    "MAX_INT64",
    "check_batch_size",
    "check_checkpoint",
    "check_consumer",
    "check_int",
    "check_lease",
    "check_number",
    "check_priorities",
    "check_query_text",
    "check_seconds",
    "check_staleness",
    "check_text",
    "seeded_rng",
]

#: The largest integer a database column holds (BIGINT), for counts stored there.
MAX_INT64 = 2**63 - 1
#: The most rows one batch or claim may ask for: beyond it the key arrays alone would not
#: fit in memory (10M keys are 80 MB); ask in several batches instead.
MAX_BATCH = 10_000_000
#: How deeply lists and dicts may nest in a checkpoint (the value itself is level 0): far
#: more than a training cursor needs, well inside Python's recursion limit.
MAX_CHECKPOINT_DEPTH = 100


def _finite_or_none(value: Any) -> float | None:
    """``value`` (a real number) as a float; None if it is NaN, infinite or beyond a
    float's range (an int like ``10**400``, which ``math.isfinite`` cannot even take)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


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
        ok = _finite_or_none(value) is not None
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
        raise InvalidArgumentError(f"{name} must be a finite number{bound}, got {_short(value)}")
    return float(value)


def _short(value: Any) -> str:
    """``repr(value)``, cut short for numbers of hundreds of digits."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"an int of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as an int from 1 to :data:`~expstore._args.MAX_BATCH`, or
    InvalidArgumentError saying what arrived."""
    return check_int("batch_size", batch_size, minimum=1, maximum=MAX_BATCH)


def check_staleness(max_staleness: Any) -> int | None:
    """``max_staleness`` as None or an int >= 0 (0: only rows of the current version)."""
    return check_int("max_staleness", max_staleness, minimum=0, optional=True)


def check_consumer(consumer: Any) -> str:
    """``consumer`` as a name a claim can record: a non-empty str of at most 255 chars."""
    if not isinstance(consumer, str) or not consumer or len(consumer) > 255:
        raise InvalidArgumentError(
            f"consumer must be a non-empty string of at most 255 chars (a learner's name, "
            f"the same across its restarts), got {consumer!r}"
        )
    return check_text("consumer", consumer)


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool (True or False, numpy's too); UnsupportedTypeError otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise UnsupportedTypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_seconds(name: str, value: Any, *, optional: bool) -> float | None:
    """``value`` as a float of seconds >= 0 (a wait, a timeout); None passes when
    ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedTypeError(f"{name} must be a number of seconds, got {value!r}")
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return value  # waiting for ever, said with a float
    if _finite_or_none(value) is None or value < 0:
        raise InvalidArgumentError(
            f"{name} must be a number of seconds >= 0 (a float's range at most; None or "
            f"float('inf') for no limit), got {_short(value)}"
        )
    return float(value)


def check_lease(lease_s: Any) -> float:
    """``lease_s`` as a float > 0, or the error that says what arrived."""
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)):
        raise UnsupportedTypeError(f"lease_s must be a number of seconds, got {lease_s!r}")
    if _finite_or_none(lease_s) is None or lease_s <= 0:
        raise InvalidArgumentError(
            f"lease_s must be a finite number of seconds > 0, got {_short(lease_s)}: how long a "
            "consumer may hold the rows before they go back to the queue"
        )
    return float(lease_s)


def check_checkpoint(checkpoint: Any, what: str = "checkpoint", undone: str = "acked") -> str:
    """The checkpoint as JSON text, or the error that says why it cannot be stored.

    A checkpoint is stored so that it comes back equal and of the same types: dicts with
    str keys, lists, str, int (of any size Python prints), finite float (``-0.0``
    included), bool and None, nested at most :data:`MAX_CHECKPOINT_DEPTH` levels. What
    JSON would change on the way is refused instead of changed silently: keys that are not
    str (``{0: 10}`` would come back as ``{'0': 10}``), tuples (they would come back as
    lists), NaN and infinities, other types. Subclasses of these types (an ``IntEnum``, a
    numpy float) are stored as their plain value."""
    _check_json(checkpoint, what, undone)
    try:
        return json.dumps(checkpoint, allow_nan=False)
    except (TypeError, ValueError) as exc:  # an int beyond Python's digit limit
        raise UnsupportedTypeError(
            f"a {what} must be JSON that comes back as given: {exc}; convert it (for "
            f"example to a dict of ints and strings) and try again. Nothing was {undone}"
        ) from None


#: Types whose values JSON brings back as they are (their subclasses take the long way).
_PLAIN = frozenset({int, str, bool, type(None)})


def _check_json(checkpoint: Any, what: str, undone: str) -> None:
    """UnsupportedTypeError or InvalidArgumentError naming the first part of
    ``checkpoint`` that would not come back as given (a walk without recursion)."""
    stack: list[tuple[Any, str, int]] = [(checkpoint, what, 0)]
    while stack:
        value, path, depth = stack.pop()
        if value is None or isinstance(value, (bool, int, str)):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise UnsupportedTypeError(
                    f"a {what} must be JSON that comes back as given: {path} is "
                    f"{value!r}, which JSON cannot hold; store a finite number (or None). "
                    f"Nothing was {undone}"
                )
            continue
        if isinstance(value, (dict, list)):
            if depth >= MAX_CHECKPOINT_DEPTH:
                raise InvalidArgumentError(
                    f"{_cut(path)}: lists and dicts nest more than {MAX_CHECKPOINT_DEPTH} "
                    f"levels deep in the {what} (or contain themselves); store a flatter "
                    f"one. Nothing was {undone}"
                )
            if isinstance(value, list):
                # Plain scalars (most of a long list of tokens) need no path of their own.
                stack.extend(
                    (item, f"{path}[{i}]", depth + 1)
                    for i, item in enumerate(value)
                    if type(item) not in _PLAIN
                )
                continue
            for key, item in value.items():
                if not isinstance(key, str):
                    raise UnsupportedTypeError(
                        f"a {what} must be JSON that comes back as given: {_cut(path)} "
                        f"has the key {_short(key)} of type {type(key).__name__}, which "
                        "JSON would turn into a string (two keys could even become one). Use "
                        f"str keys. Nothing was {undone}"
                    )
                stack.append((item, f"{path}[{key!r}]", depth + 1))
            continue
        hint = "; use a list" if isinstance(value, tuple) else ""
        raise UnsupportedTypeError(
            f"a {what} must be JSON that comes back as given (dicts with str keys, "
            f"lists, strings, ints, finite floats, bools, None): {_cut(path)} is a "
            f"{type(value).__name__}{hint}. Nothing was {undone}"
        )


def _cut(path: str) -> str:
    return path if len(path) <= 80 else path[:77] + "..."


def check_priorities(
    ids: Sequence[str], priorities: Sequence[float] | np.ndarray
) -> tuple[list[str], np.ndarray]:
    """``(ids, priorities as float64)``, or the error that says what is wrong with them."""
    if isinstance(ids, str):
        raise UnsupportedTypeError("update_priorities() needs a list of ids, got one string")
    ids = [check_text("id", i) for i in ids]
    try:
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise UnsupportedTypeError(
            f"priorities must be numbers (a list or an array), got {type(priorities).__name__}; "
            "nothing was updated"
        ) from None
    if len(ids) != len(values):
        raise InvalidArgumentError(
            f"update_priorities() needs one priority per id, got {len(ids)} ids and "
            f"{len(values)} priorities; nothing was updated"
        )
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise InvalidArgumentError("priorities must be finite numbers >= 0; nothing was updated")
    return ids, values


def check_query_text(text: str, what: str) -> None:
    """QueryError for a string in a condition no backend can store or match: NUL
    characters and lone surrogates."""
    problem = text_problem(text)
    if problem:
        raise QueryError(f"{what} ({text!r}): {problem}")


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
