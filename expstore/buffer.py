"""ReplayBuffer: the facade trainers and agents use.

>>> from expstore import DataRow, Experience, ExpMeta, QueryBuilder, ReplayBuffer
>>> buffer = ReplayBuffer()  # a private in-memory SQLite store
>>> buffer.store(DataRow(exp_meta=ExpMeta(task_id="t1", agent_id="a1", step=0),
...                      exp_data=Experience(state={"url": "https://example.com"}, reward_t=1.0)))
>>> buffer.count(QueryBuilder().eq("exp_meta.task_id", "t1").build())
1
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

import numpy as np
from sqlalchemy.engine import URL

from .converters.arrays import NumpyConverter
from .converters.base import Converter
from .converters.default import DefaultConverter
from .models import DataRow
from .samplers.base import KeySampler, Sampler, TaskSampler
from .samplers.random_task import RandomTaskSampler
from .samplers.uniform import UniformSampler
from .storage.base import QueryCondition, Storage
from .storage.sql import SqlStorage

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """A durable, queryable replay buffer over a SQL :class:`Storage`.

    ``ReplayBuffer(storage=None, *, name="default", capacity=None, eviction=None, upgrade=False)``

    - ``storage``: ``None`` (default) gives a fresh in-memory SQLite store that no other
      buffer shares; a string or URL opens :class:`SqlStorage` there (``sqlite:///path.db``,
      ``postgresql+psycopg://user@host/db``); a :class:`Storage` is used as it is.
    - ``name``: which buffer of the database (one database holds many, isolated).
    - ``capacity``: at most this many rows remain after each write (default: unlimited).
    - ``eviction``: which rows go beyond capacity: ``"fifo"`` (default), ``"max_reward"``,
      ``"task_fifo"``. Both are kept with the buffer in the database, so every process
      that writes to it evicts alike: the first to give them sets them, a handle that gives
      neither uses them, one that asks for others raises ValueError, and
      :meth:`set_retention` changes them for everyone.
    - ``upgrade``: upgrade an older database schema instead of raising SchemaVersionError.
    """

    def __init__(
        self,
        storage: Storage | str | URL | None = None,
        *,
        name: str = "default",
        capacity: int | None = None,
        eviction: str | None = None,
        upgrade: bool = False,
    ) -> None:
        if storage is None:
            storage = "sqlite://"
        if isinstance(storage, (str, URL)):
            storage = SqlStorage(
                storage, name=name, capacity=capacity, eviction=eviction, upgrade=upgrade
            )
        elif not isinstance(storage, Storage):
            raise TypeError(
                "ReplayBuffer(storage=...) expects None, a database URL or a Storage, "
                f"got {type(storage).__name__}"
            )
        self.storage: Storage = storage

    # -- writing -------------------------------------------------------------------------
    def store(self, row: DataRow) -> None:
        """Store one row."""
        self.storage.store(row)

    def store_batch(self, rows: Sequence[DataRow]) -> None:
        """Store every row in one transaction: all are validated first; all or none land."""
        self.storage.store_batch(rows)

    def delete(self, query_condition: QueryCondition) -> int:
        """Delete the matching rows; returns how many went."""
        return self.storage.delete(query_condition)

    def clear(self) -> None:
        """Delete every row of this buffer."""
        self.storage.clear()

    # -- reading -------------------------------------------------------------------------
    def get(self, row_id: str) -> DataRow | None:
        """The row with this id, or None."""
        return self.storage.get(row_id)

    def count(self, query_condition: QueryCondition = None) -> int:
        """How many rows match (all rows for None)."""
        return self.storage.count(query_condition)

    def __len__(self) -> int:
        return self.storage.count()

    def query(
        self,
        query_condition: QueryCondition = None,
        *,
        limit: int | None = None,
        order_by: str = "key",
    ) -> Iterator[DataRow]:
        """Stream the matching rows (insertion order by default; ``"-key"`` newest first)."""
        return self.storage.query(query_condition, limit=limit, order_by=order_by)

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of one task, ordered by step, then execute_time."""
        return self.storage.get_by_task_id(task_id)

    def get_batch_by_task_ids(self, task_ids: Iterable[str]) -> dict[str, list[DataRow]]:
        """Every row of each task, grouped by task id."""
        return self.storage.get_batch_by_task_ids(task_ids)

    def task_ids(self, query_condition: QueryCondition = None) -> list[str]:
        """Distinct task ids with at least one matching row, in order of first insertion."""
        return self.storage.task_ids(query_condition)

    def update_priorities(
        self, ids: Sequence[str], priorities: Sequence[float] | np.ndarray
    ) -> int:
        """Set stored priorities (for PrioritizedSampler) by row id; returns rows updated."""
        update = getattr(self.storage, "update_priorities", None)
        if update is None:
            raise TypeError(f"{type(self.storage).__name__} does not store priorities")
        return int(update(ids, priorities))

    def set_retention(self, capacity: int | None, eviction: str | None = None) -> int:
        """Change this buffer's capacity (None: unlimited) and eviction policy (None: keep
        it) for every process that writes to it; rows beyond the new capacity go now.
        Returns how many rows went."""
        change = getattr(self.storage, "set_retention", None)
        if change is None:
            raise TypeError(f"{type(self.storage).__name__} does not keep a retention")
        return int(change(capacity, eviction))

    # -- sampling ------------------------------------------------------------------------
    def sample(
        self,
        sampler: Sampler | None = None,
        query_condition: QueryCondition = None,
        converter: Converter | None = None,
        batch_size: int = 1000,
    ) -> Any:
        """A batch: ``sampler`` chooses up to ``batch_size`` matching rows, ``converter``
        turns them into the batch (``converter.to_dataset_row(rows)``).

        Defaults: ``UniformSampler()`` (with replacement) and ``DefaultConverter()`` (the
        rows as a list). When the sampler gives per-row extras and the converter builds a
        dict, the extras join the batch: with ``PrioritizedSampler`` and ``TensorConverter``
        the batch has ``"weights"`` (importance-sampling weights) and ``"ids"`` (for
        :meth:`update_priorities`). No matching row raises EmptyBufferError. ::

            per = PrioritizedSampler(seed=0)
            conv = TensorConverter({"obs": "exp_data.state.obs", "r": "exp_data.reward_t"})
            batch = buffer.sample(per, converter=conv, batch_size=256)
            loss = (batch["weights"] * td_error(batch) ** 2).mean()
            buffer.update_priorities(batch["ids"], td_error(batch).abs().detach().numpy())
        """
        sampler = UniformSampler() if sampler is None else sampler
        converter = DefaultConverter() if converter is None else converter
        if (
            isinstance(converter, NumpyConverter)
            and (paths := converter.field_paths) is not None
            and isinstance(sampler, KeySampler)
            and hasattr(self.storage, "fetch_columns")
        ):
            # Fast path: fetch only the fields the converter reads, not whole rows, column
            # by column (a tensor field comes stacked). The converter stacks (copies) every
            # array it is given one per row, so those may be read-only views.
            (_, columns), info = sampler.sample_fields(
                self.storage, batch_size, query_condition, paths, writable=False
            )
            batch = converter.from_values(dict(zip(converter.fields, columns, strict=True)))
            return converter.attach_info(batch, info) if info else batch
        with_info = getattr(sampler, "sample_with_info", None)
        if with_info is not None:
            rows, info = with_info(self.storage, batch_size, query_condition)
        else:  # a duck-typed AWorld sampler
            rows, info = sampler.sample(self.storage, batch_size, query_condition), {}
        batch = converter.to_dataset_row(rows)
        if info and hasattr(converter, "attach_info"):
            batch = converter.attach_info(batch, info)
        return batch

    def sample_task(
        self,
        sampler: TaskSampler | None = None,
        query_condition: QueryCondition = None,
        converter: Converter | None = None,
        batch_size: int = 1000,
    ) -> list[Any]:
        """Whole tasks: one converted item per sampled task (up to ``batch_size`` tasks).

        The condition chooses the tasks (those with at least one matching row); every row
        of a chosen task comes back, ordered by step, then execute_time. Defaults:
        ``RandomTaskSampler()`` and ``DefaultConverter()`` (each item a list of rows). No
        matching row raises EmptyBufferError.
        """
        sampler = RandomTaskSampler() if sampler is None else sampler
        converter = DefaultConverter() if converter is None else converter
        tasks = sampler.sample_tasks(self.storage, batch_size, query_condition)
        return [converter.to_dataset_row(task_rows) for task_rows in tasks.values()]

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the storage's connections."""
        self.storage.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplayBuffer({self.storage!r})"

    def __reduce__(self) -> Any:
        return (ReplayBuffer, (self.storage,))
