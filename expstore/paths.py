"""Field paths: how converters and storage name a value inside a row.

``"id"``, ``"exp_meta.step"``, ``"exp_data.reward_t"``, ``"exp_data.state.image_features"``,
``"exp_data.actions.0"`` (a segment of digits indexes a list). Bare field names (``"step"``,
``"reward_t"``, ``"state.url"``) work too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel

from .models import DataRow, Experience, ExpMeta

__all__ = ["MISSING", "CompiledPath", "compile_path", "read_path", "step_into"]

#: ("id" | "exp_meta" | "exp_data", the steps below it).
CompiledPath = tuple[str, tuple[str | int, ...]]


class _Missing:
    """The marker for a path that leads nowhere in a row."""

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


#: What :func:`read_path` returns when a row has nothing at the path.
MISSING: Any = _Missing()

_META = frozenset(ExpMeta.model_fields)
_DATA = frozenset(Experience.model_fields)


def compile_path(path: str) -> CompiledPath:
    """Split a field path into (``"id"`` | ``"exp_meta"`` | ``"exp_data"``, rest).

    Raises ValueError for a path that cannot name anything in a row.
    """
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        raise ValueError(
            f"a field path is a dotted name such as 'exp_data.state.image_features', got {path!r}"
        )
    parts = path.split(".")
    head, rest = parts[0], parts[1:]
    if head == "id" and not rest:
        return "id", ()
    if head not in ("exp_meta", "exp_data"):
        # bare names: "step" is exp_meta.step, "reward_t" / "state.x" are in exp_data
        if head in _META:
            head, rest = "exp_meta", parts
        elif head in _DATA:
            head, rest = "exp_data", parts
        else:
            raise ValueError(
                f"field path {path!r} must start with 'exp_meta.', 'exp_data.' or name a "
                f"field of either (ExpMeta: {sorted(_META)}; Experience: {sorted(_DATA)})"
            )
    if not rest:
        raise ValueError(f"field path {path!r} needs a field after {head!r}")
    allowed = _META if head == "exp_meta" else _DATA
    if rest[0] not in allowed:
        raise ValueError(
            f"{head} has no field {rest[0]!r} (in {path!r}); fields: {sorted(allowed)}"
        )
    steps: tuple[str | int, ...] = tuple(
        int(p) if p.isdigit() and (p == "0" or not p.startswith("0")) else p for p in rest
    )
    return head, steps


def read_path(row: DataRow, compiled: CompiledPath) -> Any:
    """The value at a compiled path in ``row``, or :data:`MISSING`."""
    head, steps = compiled
    if head == "id":
        return row.id
    value: Any = row.exp_meta if head == "exp_meta" else row.exp_data
    for step in steps:
        value = step_into(value, step)
        if value is MISSING:
            return MISSING
    return value


def step_into(value: Any, step: str | int) -> Any:
    """``value[step]`` (or its attribute ``step``) by path rules, or :data:`MISSING`."""
    if isinstance(value, BaseModel):
        return getattr(value, str(step), MISSING)
    if isinstance(value, dict):
        return value.get(str(step), MISSING)
    if isinstance(value, (list, tuple, np.ndarray)) and isinstance(step, int):
        return value[step] if step < len(value) else MISSING
    return MISSING
