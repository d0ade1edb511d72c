"""Checks of arguments, written once: each returns the value normalised or raises a typed
error (:class:`~expstore.errors.InvalidArgumentError`, UnsupportedTypeError, QueryError)
saying what was expected and what arrived.

Checks that need a higher layer's concept stay with it: ``check_dedup``
(:mod:`expstore.features.dedup`'s modes), ``check_retention``
(:mod:`expstore.features.eviction`'s policies), ``check_pattern`` (the LIKE grammar of
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
    if math.isnan(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def check_lease(lease_s: Any) -> float:
    """``lease_s`` as a float > 0, or the error that says what arrived."""
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)):
        raise UnsupportedTypeError(f"lease_s must be a number of seconds, got {lease_s!r}")
    if not math.isfinite(lease_s) or lease_s <= 0:
        raise InvalidArgumentError(
            f"lease_s must be a finite number of seconds > 0, got {lease_s!r}: how long a "
            "consumer may hold the rows before they go back to the queue"
        )
    return float(lease_s)


def check_checkpoint(checkpoint: Any) -> str:
    """The checkpoint as JSON text, or the error that says why it cannot be stored."""
    try:
        return json.dumps(checkpoint, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UnsupportedTypeError(
            "a checkpoint must be JSON (dicts, lists, strings, finite numbers, bools, None): "
            f"{exc}; convert it (for example to a dict of ints and strings) and ack again. "
            "Nothing was acked"
        ) from None


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
