"""The converter interface: turn the rows a sampler chose into what training consumes.

A :class:`Converter` implements ``to_dataset_row(rows)`` (AWorld's interface). A converter
that builds a dict batch can also take the sampler's per-row extras (a prioritized batch's
``"weights"`` and ``"ids"``) through :meth:`Converter.attach_info`.

Field paths name a value inside a row by the grammar of :mod:`expstore.paths` (the same as
queries'): ``"id"``, ``"exp_meta.step"``, ``"exp_data.reward_t"``,
``"exp_data.state.image_features"``, ``"exp_data.actions.0"`` (ASCII digits index a list).
Bare names (``"step"``, ``"reward_t"``, ``"state.url"``) work too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from ..models import DataRow
from ..paths import MISSING, parse_path, read_path

__all__ = ["MISSING", "Converter", "FieldSpec", "parse_path", "read_path"]

#: A field of a row: a path string, or a function of the row.
FieldSpec = str | Callable[[DataRow], Any]


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
