"""The Storage interface: where rows live and how they come back. It declares everything the
buffer, the samplers, the CLI and the torch datasets call on a storage.

Method names follow AWorld's ``Storage`` (``add``, ``add_batch``, ``size``, ``get_paginated``,
``get_all``, ``get_by_task_id``, ``get_bacth_by_task_ids``) so code written against AWorld runs
unchanged. Sampling goes through :meth:`Storage.key_index` (the matching rows' integer keys
and a few columns as arrays, which samplers choose from) and :meth:`Storage.fetch` (the
chosen rows, whole or only the fields a converter reads).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from .._args import check_int
from ..errors import InvalidArgumentError, UnsupportedTypeError
from ..model.rows import DataRow
from ..query import QueryCondition

if TYPE_CHECKING:
    from ..features.claims.queue import ClaimQueue
    from ..features.dedup import Dedup
    from ..features.eviction import Eviction
    from ..features.groups import GroupIndex, GroupSpec
    from ..features.rate_limits import RateLimits
    from ..features.stats.task_stats import SummaryState
    from .key_space import KeySpace


__all__ = ["Fetched", "QueryCondition", "Storage", "Values"]

_T = TypeVar("_T")

#: One path's values over a batch of rows: a list, or an array whose first axis is the rows.
Values = list[Any] | np.ndarray


class Fetched(NamedTuple):
    """Chosen rows as :meth:`Storage.fetch` gives them: the ids of the rows found, in the
    order asked (repeats kept, rows deleted since they were chosen left out), and either
    the whole rows or, when paths were asked for, each path's values over those rows."""

    ids: list[str]
    rows: list[DataRow] | None = None
    columns: list[Values] | None = None


class Storage(ABC):
    """Holds rows of one named buffer and fetches them back."""

    #: The buffer's retention as this handle last saw it (None: unlimited; see
    #: :meth:`set_retention`).
    capacity: int | None = None
    eviction: str = "fifo"

    #: The buffer's name in its database.
    name: str

    @property
    @abstractmethod
    def url(self) -> Any:
        """Where the rows live (a SQLAlchemy URL for SQL storages)."""

    @property
    def identity(self) -> tuple[Any, ...]:
        """Which buffer this handle reads, as it last saw it: samplers forget what they
        hold of a buffer (an epoch's progress, the rows known spent) when they are next
        used with another (see :meth:`~expstore.samplers.base.KeySampler.forget_buffer`).
        The last item tells one incarnation of a buffer from another (a database made
        anew); None where a storage cannot tell."""
        return (str(self.url), getattr(self, "name", None), None)

    # -- writing -------------------------------------------------------------------------
    @abstractmethod
    def store_batch(self, rows: Sequence[DataRow], *, dedup: Dedup = None) -> int:
        """Store every row, or none of them; returns how many were stored (fewer with
        ``dedup="skip"``: rows whose content was already stored are left out)."""

    def store(self, row: DataRow, *, dedup: Dedup = None) -> int:
        """Store one row; returns 1, or 0 if ``dedup="skip"`` left it out."""
        if row is None:
            raise InvalidArgumentError("store() needs a DataRow, got None")
        return self.store_batch([row], dedup=dedup)

    def extend(self, columns: Mapping[str, Any], *, dedup: Dedup = None) -> int:
        """Store the rows a dict of columns holds, in one transaction (see
        :mod:`expstore.model.columnar`); returns how many were stored. This default builds a
        DataRow per row; a SQL storage hands the columns' rows to its writer directly."""
        from ..model.columnar import rows_from_columns
        from ..model.rows import Experience, ExpMeta

        rows = [
            DataRow(
                id=r.id,
                exp_meta=ExpMeta(**r.exp_meta.__dict__),
                exp_data=Experience(**r.exp_data.__dict__),
            )
            for r in rows_from_columns(columns)
        ]
        return self.store_batch(rows, dedup=dedup)

    @abstractmethod
    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows; returns how many went."""

    @abstractmethod
    def clear(self) -> None:
        """Delete every row of this buffer."""

    @abstractmethod
    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> int:
        """Set stored priorities by row id; returns how many rows were updated."""

    @abstractmethod
    def set_retention(
        self,
        capacity: int | None,
        eviction: Eviction | None = None,
        *,
        max_staleness: int | None = None,
    ) -> int:
        """Change the buffer's capacity and eviction policy for every writer; returns how
        many rows went at once."""

    def policy_version(self) -> int | None:
        """The buffer's current policy version (None: never set); see
        :mod:`expstore.features.versions`."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not keep policy versions; use SqlStorage"
        )

    def set_policy_version(self, version: int, *, force: bool = False) -> int:
        """Publish ``version`` for every process; returns rows the "stale" policy evicted."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not keep policy versions; use SqlStorage"
        )

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
    def page(self, query_condition: QueryCondition, *, offset: int, limit: int) -> list[DataRow]:
        """Rows ``offset`` .. ``offset + limit`` of the matching rows in insertion order."""

    @abstractmethod
    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of one task, ordered by step, then execute_time."""

    @abstractmethod
    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """Every row of each task, grouped by task and ordered as in get_by_task_id."""

    @abstractmethod
    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        """The distinct task ids with at least one matching row, in order of first insertion."""

    # -- sampling ------------------------------------------------------------------------
    def key_index(
        self, query_condition: QueryCondition = None, columns: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """The matching rows' integer keys (``"key"``, ascending) and ``columns`` as arrays."""
        return self.key_indexes([(query_condition, columns)])[0]

    @abstractmethod
    def key_indexes(
        self, requests: Sequence[tuple[QueryCondition, Sequence[str]]]
    ) -> list[dict[str, np.ndarray]]:
        """:meth:`key_index` for each ``(condition, columns)``, all at one moment."""

    def key_space(
        self,
        query_condition: QueryCondition,
        use: Callable[[KeySpace], _T],
        *,
        max_staleness: int | None = None,
        consume_after: int | None = None,
        snapshot: bool = False,
    ) -> _T | None:
        """``use(space)`` over the buffer's key space read now (its key range and row
        count, probed for candidate keys; see :mod:`expstore.storage.key_space`), or None
        from a storage without one, whose samplers then choose over :meth:`key_index`.
        ``max_staleness``, ``consume_after``: the sampler's options of those names narrow
        the matching rows as the condition does. ``snapshot``: every statement of the draw
        reads one snapshot (for a draw whose statements must agree, e.g. priority bounds
        and probes)."""
        return None

    def create_index(self, path: str) -> str:
        """Index the rows on ``path`` so conditions on it are index ranges; returns the
        index's name. A storage without indexes raises UnsupportedTypeError."""
        raise UnsupportedTypeError(f"{type(self).__name__} cannot index paths")

    def drop_index(self, path: str) -> bool:
        """Drop the index :meth:`create_index` made on ``path``; whether there was one."""
        raise UnsupportedTypeError(f"{type(self).__name__} cannot index paths")

    def create_summary(
        self, *, step: int = 200_000, progress: Callable[[int], object] | None = None
    ) -> None:
        """Keep per-task summaries that whole-buffer stats read instead of every row. A
        storage without them raises UnsupportedTypeError."""
        raise UnsupportedTypeError(f"{type(self).__name__} cannot keep task summaries")

    def drop_summary(self) -> bool:
        """Stop keeping per-task summaries; whether there were any."""
        raise UnsupportedTypeError(f"{type(self).__name__} cannot keep task summaries")

    def summary_state(self) -> SummaryState | None:
        """Whether the buffer keeps task summaries and how far they are built (None: it
        keeps none)."""
        return None

    def summary_tasks(self) -> int:
        """How many tasks the buffer's task summaries hold (0 without summaries)."""
        return 0

    def summary(
        self, query_condition: QueryCondition, success_above: float
    ) -> dict[str, Any] | None:
        """The figures of ``expstore stats`` over the matching rows, computed where the rows
        are (see :mod:`expstore.features.stats.summary`), or None from a storage that cannot,
        whose figures are then computed from :meth:`key_index`."""
        return None

    @abstractmethod
    def fetch_keys(self, keys: Sequence[int] | np.ndarray) -> list[DataRow]:
        """The rows with these keys, in the order given (repeats allowed, vanished keys
        skipped)."""

    @abstractmethod
    def fetch_columns(
        self, keys: Sequence[int] | np.ndarray, paths: Sequence[str], *, writable: bool = True
    ) -> tuple[list[str], list[Values]]:
        """The ids of the rows with these keys (as :meth:`fetch_keys` orders them) and the
        values at ``paths`` over them; ``writable=False`` allows read-only arrays."""

    def fetch(
        self,
        keys: Sequence[int] | np.ndarray,
        paths: Sequence[str] | None = None,
        *,
        writable: bool = True,
    ) -> Fetched:
        """The rows with these keys: whole (``paths=None``) or the values at ``paths``."""
        if paths is None:
            rows = self.fetch_keys(keys)
            return Fetched([row.id for row in rows], rows=rows)
        ids, columns = self.fetch_columns(keys, paths, writable=writable)
        return Fetched(ids, columns=columns)

    def count_draws(self, keys: np.ndarray, limit: int) -> np.ndarray:
        """For samplers with ``consume_after=limit``: count one draw of each of ``keys``
        (distinct) whose row has had fewer than ``limit``, and return those keys (see
        :mod:`expstore.features.draw_counts`)."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not count draws (consume_after); use SqlStorage"
        )

    def spent_keys(self, limit: int, among: np.ndarray | None = None) -> np.ndarray:
        """The keys of rows drawn ``limit`` times or more by samplers with
        ``consume_after``, sorted; of ``among`` only if given (none for a storage that
        does not count draws)."""
        return np.empty(0, dtype=np.int64)

    @property
    def rate_limits(self) -> RateLimits:
        """The buffer's rate limit (see :mod:`expstore.features.rate_limiter`)."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not keep rate limits; use SqlStorage"
        )

    def acquire_samples(self, n: int, since: float | None = None) -> tuple[int, bool]:
        """Count ``n`` samples against the buffer's rate limit, waiting while it is spent;
        returns (samples counted, whether it waited). A storage without rate limits counts
        nothing (see :mod:`expstore.features.rate_limiter`)."""
        return 0, False

    def refund_samples(self, n: int) -> None:
        """Give back ``n`` counted samples that were not drawn."""
        return None

    def sampling_limited(self) -> bool:
        """Whether the buffer has a rate limit that counts samples (a read)."""
        return False

    def groups(self, query_condition: QueryCondition, spec: GroupSpec) -> dict[str, Any]:
        """Summaries of the groups of matching rows (see :mod:`expstore.features.groups`)."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not summarise groups; use SqlStorage"
        )

    def group_keys(
        self, query_condition: QueryCondition, spec: GroupSpec, groups: Sequence[Any]
    ) -> list[np.ndarray]:
        """The keys of each group's rows (see :mod:`expstore.features.groups`)."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not summarise groups; use SqlStorage"
        )

    @property
    def group_index(self) -> GroupIndex:
        """The cached group summaries (for group claims)."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not summarise groups; use SqlStorage"
        )

    @property
    def claims(self) -> ClaimQueue:
        """The buffer's claims (consume-once queue, checkpoints, lineage); see
        :mod:`expstore.claims`. A storage without them raises UnsupportedTypeError."""
        raise UnsupportedTypeError(
            f"{type(self).__name__} does not keep claims; use SqlStorage (a database URL)"
        )

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
        check_int("page", page, minimum=1)
        check_int("page_size", page_size, minimum=1)
        return self.page(query_condition, offset=(page - 1) * page_size, limit=page_size)

    def get_bacth_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """AWorld's spelling of :meth:`get_batch_by_task_ids`."""
        return self.get_batch_by_task_ids(task_ids)

    def __len__(self) -> int:
        return self.count()
