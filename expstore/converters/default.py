"""DefaultConverter: the rows as they are."""

from __future__ import annotations

from collections.abc import Sequence

from ..model.rows import DataRow
from .base import Converter

__all__ = ["DefaultConverter"]


class DefaultConverter(Converter[list[DataRow]]):
    """Returns the rows unchanged, as a list (AWorld's ``DefaultConverter``).

    >>> DefaultConverter().to_dataset_row([])
    []
    """

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[DataRow]:
        return list(rows)
