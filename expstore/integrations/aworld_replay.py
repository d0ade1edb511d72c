"""AWorld 0.2.7's replay-buffer names, kept apart from expstore's own.

AWorld's ``ReplayBuffer`` of 0.2.7 (``aworld.replay_buffer``) and its samplers call their
storage by AWorld's names: ``add``, ``add_batch``, ``size``, ``get_all``,
``get_paginated`` and ``get_bacth_by_task_ids`` (sic). Those names are AWorld's contract,
not expstore's vocabulary, so they live here, not on :class:`expstore.storage.Storage`:

    from aworld.replay_buffer import ReplayBuffer          # AWorld 0.2.7's own code
    from expstore.integrations.aworld_replay import AWorldSqlStorage

    buffer = ReplayBuffer(storage=AWorldSqlStorage("sqlite:///replay.db"))

Each name is one of expstore's calls: ``add`` is ``store``, ``add_batch`` ``store_batch``,
``size`` ``count``, ``get_all`` ``query`` listed, ``get_paginated(page, page_size)``
``query(offset=(page - 1) * page_size, limit=page_size)``. AWorld 0.3's storage
interfaces are :mod:`expstore.integrations.aworld`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._args import check_int
from ..model.rows import DataRow
from ..query import QueryCondition
from ..storage import SqlStorage, Storage

__all__ = ["AWorldNames", "AWorldSqlStorage"]


class AWorldNames(Storage):
    """AWorld 0.2.7's storage names over any :class:`~expstore.storage.Storage` (a
    mixin: put it before the storage class)."""

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
        check_int("page", page, minimum=1)
        check_int("page_size", page_size, minimum=1)
        offset = (page - 1) * page_size
        return list(self.query(query_condition, offset=offset, limit=page_size))

    def get_bacth_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """AWorld's spelling of :meth:`get_batch_by_task_ids`."""
        return self.get_batch_by_task_ids(task_ids)


class AWorldSqlStorage(AWorldNames, SqlStorage):
    """:class:`~expstore.storage.SqlStorage` answering to AWorld 0.2.7's names too: what
    AWorld's own ``ReplayBuffer(storage=...)`` of that release takes."""
