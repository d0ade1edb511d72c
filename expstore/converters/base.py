"""The converter interface: turn the rows a sampler chose into what training consumes.

A :class:`Converter` implements ``to_dataset_row(rows)`` (AWorld's interface). It declares
what it reads (:attr:`Converter.paths`: None for whole rows, or the field paths it needs, so
that the storage fetches only those), builds the batch from what was fetched
(:meth:`Converter.build`), and a dict batch takes the sampler's per-row extras (a
prioritized batch's ``"weights"`` and ``"ids"``) through :meth:`Converter.attach_info`.

Field paths name a value inside a row by the grammar of :mod:`expstore.model.paths` (the same as
queries'): ``"id"``, ``"exp_meta.step"``, ``"exp_data.reward_t"``,
``"exp_data.state.image_features"``, ``"exp_data.actions.0"`` (ASCII digits index a list).
Bare names (``"step"``, ``"reward_t"``, ``"state.url"``) work too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from ..errors import InvalidArgumentError, UnsupportedTypeError
from ..model.paths import MISSING, parse_path, read_path
from ..model.rows import DataRow
from ..samplers.loop import SampleInfo
from ..storage.base import Fetched

__all__ = ["MISSING", "BatchT", "Converter", "FieldSpec", "as_converter", "parse_path", "read_path"]

#: A field of a row: a path string, or a function of the row.
FieldSpec = str | Callable[[DataRow], Any]


#: The type of the batch a converter builds (``ReplayBuffer.sample`` returns it).
BatchT = TypeVar("BatchT")


class Converter(ABC, Generic[BatchT]):
    """Turns a list of rows into a batch (AWorld's ``Converter``), typed by its batch:
    ``Converter[dict[str, Any]]`` builds dicts, so ``buffer.sample(converter=...)`` is
    checked by mypy as one."""

    #: Whether the converter copies every array it is given (so fetched arrays may be
    #: read-only views of the database's bytes).
    copies_arrays: ClassVar[bool] = False

    @property
    def paths(self) -> list[str] | None:
        """The field paths the converter reads, for the storage to fetch only those; None
        (the default) for whole rows."""
        return None

    @abstractmethod
    def to_dataset_row(self, rows: Sequence[DataRow]) -> BatchT:
        """The batch built from ``rows`` (in the order given)."""

    def build(self, fetched: Fetched) -> BatchT:
        """The batch from what the storage fetched: the values at :attr:`paths` when it
        fetched those, else the whole rows through :meth:`to_dataset_row`."""
        assert fetched.rows is not None
        return self.to_dataset_row(fetched.rows)

    def attach_info(self, batch: BatchT, info: SampleInfo) -> BatchT:
        """Add a sampler's per-row extras (``weights`` and ``ids`` of a prioritized batch)
        to a built batch.

        A dict batch gains the entries (a name the batch already has is an error); any other
        batch comes back unchanged, and the extras stay reachable on the sampler
        (``sampler.last_info``, ``sampler.last_weights``, ``sampler.last_ids``).
        """
        extras = info.extras()
        if not extras or not isinstance(batch, dict):
            return batch
        clash = sorted(set(extras) & set(batch))
        if clash:
            raise InvalidArgumentError(
                f"the sampler adds {clash} to each batch, but the converter already produces "
                f"{'that key' if len(clash) == 1 else 'those keys'}; rename the converter's "
                "field"
            )
        batch.update(self.convert_info(extras))
        return batch

    def convert_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """How extras look in this converter's batches (as they come by default)."""
        return dict(info)


class _ForeignConverter(Converter[Any]):
    """An object with AWorld's ``to_dataset_row(rows)`` that is not an expstore Converter
    (AWorld's own): it gets whole rows, and its batch comes back as it is."""

    def __init__(self, converter: Any) -> None:
        self.converter = converter

    def to_dataset_row(self, rows: Sequence[DataRow]) -> Any:
        return self.converter.to_dataset_row(list(rows))

    def attach_info(self, batch: Any, info: SampleInfo) -> Any:
        return batch


def as_converter(converter: Any) -> Converter[Any]:
    """``converter`` as a :class:`Converter`: itself, or an object with AWorld's
    ``to_dataset_row()`` wrapped; UnsupportedTypeError for anything else."""
    if isinstance(converter, Converter):
        return converter
    if callable(getattr(converter, "to_dataset_row", None)):
        return _ForeignConverter(converter)
    raise UnsupportedTypeError(
        "a converter is a Converter (DefaultConverter(), TensorConverter(...)...) or has a "
        f"to_dataset_row(rows) method; got {type(converter).__name__}"
    )
