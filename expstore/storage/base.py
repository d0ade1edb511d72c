"""The Storage interface: where rows live and how they come back.

Method names follow AWorld's ``Storage`` (``add``, ``add_batch``, ``size``, ``get_paginated``,
``get_all``, ``get_by_task_id``, ``get_bacth_by_task_ids``) so code written against AWorld runs
unchanged. The fast path that samplers use (``key_index``, ``fetch_keys``) lets them choose
integer keys over numpy arrays and fetch only the chosen rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..models import DataRow

if TYPE_CHECKING:
    from ..query import Condition

    QueryCondition = Condition | dict[str, Any] | None
else:
    QueryCondition = Any

__all__ = ["QueryCondition", "Storage"]


class Storage(ABC):
    """Holds rows of one named buffer and fetches them back."""

    # -- writing -------------------------------------------------------------------------
    @abstractmethod
    def store_batch(self, rows: Sequence[DataRow]) -> None:
        """Store every row, or none of them."""

    def store(self, row: DataRow) -> None:
        """Store one row."""
        if row is None:
            raise ValueError("store() needs a DataRow, got None")
        self.store_batch([row])

    @abstractmethod
    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows; returns how many went."""

    @abstractmethod
    def clear(self) -> None:
        """Delete every row of this buffer."""

    # -- reading -------------------------------------------------------------------------
    @abstractmethod
    def get(self, row_id: str) -> DataRow | None:
        """The row with this id, or None."""

    @abstractmethod
    def count(self, query_condition: QueryCondition = None) -> int:
        """How many rows match (all rows for None)."""

    @abstractmethod
    def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        order_by: str = "key",
    ) -> Iterator[DataRow]:
        """Stream the matching rows in ``order_by`` order."""

    @abstractmethod
    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of one task, ordered by step, then execute_time."""

    @abstractmethod
    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """Every row of each task, grouped by task and ordered as in get_by_task_id."""

    @abstractmethod
    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        """The distinct task ids with at least one matching row, in order of first insertion."""

    @abstractmethod
    def key_index(
        self, query_condition: QueryCondition = None, columns: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """The matching rows' integer keys (``"key"``) and metadata ``columns`` as arrays."""

    def key_indexes(
        self, requests: Sequence[tuple[QueryCondition, Sequence[str]]]
    ) -> list[dict[str, np.ndarray]]:
        """:meth:`key_index` for each ``(condition, columns)``; a storage may serve them
        from one read."""
        return [self.key_index(condition, columns) for condition, columns in requests]

    @abstractmethod
    def fetch_keys(self, keys: Sequence[int] | np.ndarray) -> list[DataRow]:
        """The rows with these keys, in the order given (repeats allowed)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    # -- AWorld's names ------------------------------------------------------------------
    def add(self, row: DataRow) -> None:
        """AWorld's name for :meth:`store`."""
        self.store(row)

    def add_batch(self, rows: Sequence[DataRow]) -> None:
        """AWorld's name for :meth:`store_batch`."""
        self.store_batch(rows)

    def size(self, query_condition: QueryCondition = None) -> int:
        """AWorld's name for :meth:`count`."""
        return self.count(query_condition)

    def get_all(self, query_condition: QueryCondition = None) -> list[DataRow]:
        """Every matching row, in insertion order."""
        return list(self.query(query_condition))

    def get_paginated(
        self, page: int, page_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        """Page ``page`` (1-based) of ``page_size`` matching rows, in insertion order."""
        if not isinstance(page, int) or page < 1:
            raise ValueError(f"page is 1-based: expected an int >= 1, got {page!r}")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
        return self._page(query_condition, offset=(page - 1) * page_size, limit=page_size)

    @abstractmethod
    def _page(self, query_condition: QueryCondition, *, offset: int, limit: int) -> list[DataRow]:
        """Rows ``offset`` .. ``offset + limit`` of the matching rows in insertion order."""

    def get_bacth_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """AWorld's spelling of :meth:`get_batch_by_task_ids`."""
        return self.get_batch_by_task_ids(task_ids)

    def __len__(self) -> int:
        return self.count()
