"""The converter interface: turn the rows a sampler chose into what training consumes.

A :class:`Converter` implements ``to_dataset_row(rows)`` (AWorld's interface). A converter
that builds a dict batch can also take the sampler's per-row extras (a prioritized batch's
``"weights"`` and ``"ids"``) through :meth:`Converter.attach_info`.

Field paths name a value inside a row: ``"id"``, ``"exp_meta.step"``, ``"exp_data.reward_t"``,
``"exp_data.state.image_features"``, ``"exp_data.actions.0"`` (a segment of digits indexes a
list). Bare metadata names (``"step"``, ``"reward_t"``) work too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from ..models import DataRow, Experience, ExpMeta

__all__ = ["MISSING", "Converter", "FieldSpec", "compile_path", "read_path"]

#: A field of a row: a path string, or a function of the row.
FieldSpec = str | Callable[[DataRow], Any]


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


class Converter(ABC):
    """Turns a list of rows into a batch (AWorld's ``Converter``)."""

    @abstractmethod
    def to_dataset_row(self, rows: Sequence[DataRow]) -> Any:
        """The batch built from ``rows`` (in the order given)."""

    def attach_info(self, batch: Any, info: dict[str, Any]) -> Any:
        """Add a sampler's per-row extras (e.g. ``weights``, ``ids``) to a built batch.

        A dict batch gains the entries (a name the batch already has is an error); any other
        batch comes back unchanged, and the extras stay reachable on the sampler
        (``sampler.last_weights``, ``sampler.last_ids``).
        """
        if not info or not isinstance(batch, dict):
            return batch
        clash = sorted(set(info) & set(batch))
        if clash:
            raise ValueError(
                f"the sampler adds {clash} to each batch, but the converter already produces "
                f"{'that key' if len(clash) == 1 else 'those keys'}; rename the converter's "
                "field"
            )
        batch.update(self.convert_info(info))
        return batch

    def convert_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """How extras look in this converter's batches (as they come by default)."""
        return dict(info)


def compile_path(path: str) -> tuple[str, tuple[str | int, ...]]:
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


def read_path(row: DataRow, compiled: tuple[str, tuple[str | int, ...]]) -> Any:
    """The value at a compiled path in ``row``, or :data:`MISSING`."""
    head, steps = compiled
    if head == "id":
        return row.id
    value: Any = row.exp_meta if head == "exp_meta" else row.exp_data
    for step in steps:
        if isinstance(value, BaseModel):
            value = getattr(value, str(step), MISSING)
        elif isinstance(value, dict):
            value = value.get(str(step), MISSING)
        elif isinstance(value, (list, tuple)) and isinstance(step, int):
            value = value[step] if step < len(value) else MISSING
        elif isinstance(value, np.ndarray) and isinstance(step, int):
            value = value[step] if step < len(value) else MISSING
        else:
            return MISSING
        if value is MISSING:
            return MISSING
    return value
