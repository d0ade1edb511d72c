"""torch data loading: a map-style Dataset over matching rows, an IterableDataset of batches.

- :class:`ExperienceDataset`: every matching row, in insertion order, indexable; batches
  are formed by its converter (``dataset.loader(batch_size=32, shuffle=True)``).
- :class:`SampledBatches`: an endless (or ``num_batches``-long) stream of sampled,
  converted batches (``batches.loader(num_workers=2)``).

Both work with DataLoader workers. A worker started by fork reconnects on first use (the
storage notices the new process and drops the parent's connections); one started by spawn
receives the storage as its URL and options and opens its own. Rows are never pickled into
workers, only fetched there.

This module imports torch; ``import expstore`` does not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ._args import check_batch_size, check_int
from ._optional import require
from .buffer import ReplayBuffer
from .converters.base import Converter
from .converters.default import DefaultConverter
from .errors import OutOfRangeError, StorageError, UnsupportedTypeError
from .model.rows import DataRow
from .query import QueryCondition
from .samplers.base import Sampler
from .samplers.uniform import UniformSampler

torch = require("torch", "expstore.torch_data")
from torch.utils.data import (  # noqa: E402 - after the friendly import check
    DataLoader,
    Dataset,
    IterableDataset,
    get_worker_info,
)

__all__ = ["ExperienceDataset", "SampledBatches"]


class ExperienceDataset(Dataset):  # type: ignore[type-arg]
    """A map-style torch Dataset over the rows matching a condition, in a stable order.

    ``ExperienceDataset(buffer, query_condition=None, converter=None)``

    The order is insertion order, fixed when the dataset is created (or :meth:`refresh`-ed):
    rows stored later are not included until then. ``dataset[i]`` is a
    :class:`~expstore.DataRow`; a batch of rows becomes a training batch through
    :meth:`collate`, which applies ``converter`` (default: the list of rows). Fetching a
    batch of indices takes one query (``__getitems__``). Fetching a row deleted since then
    raises :class:`~expstore.StorageError` (also when SQLite has given its key to a newer
    row; the dataset checks the row's id); :meth:`refresh` takes the rows that exist now::

        dataset = ExperienceDataset(buffer, cond, TensorConverter({"obs": "exp_data.state.obs"}))
        for batch in dataset.loader(batch_size=32, shuffle=True, num_workers=2):
            ...
        # the same as DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2,
        #                        collate_fn=dataset.collate)
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        query_condition: QueryCondition = None,
        converter: Converter[Any] | None = None,
    ) -> None:
        self.buffer = buffer
        self.query_condition = query_condition
        self.converter = converter if converter is not None else DefaultConverter()
        self._keys: np.ndarray = np.empty(0, dtype=np.int64)
        self._ids: np.ndarray = np.empty(0, dtype=object)
        self.refresh()

    def refresh(self) -> None:
        """Take the matching rows afresh (new rows join, deleted ones leave)."""
        index = self.buffer.storage.key_index(self.query_condition, ("id",))
        # The ids too: SQLite may give a deleted row's key to the next row stored, so a key
        # alone cannot tell that the row it named is gone.
        self._keys, self._ids = np.array(index["key"]), np.array(index["id"])

    def __len__(self) -> int:
        return len(self._keys)

    def _position(self, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise UnsupportedTypeError(
                f"ExperienceDataset indices are ints, got {type(i).__name__}"
            )
        n = len(self._keys)
        if not -n <= i < n:
            raise OutOfRangeError(f"index {i} is out of range for a dataset of {n} rows")
        return int(i) % n

    def _fetch(self, positions: list[int]) -> list[DataRow]:
        rows = self.buffer.storage.fetch_keys(self._keys[positions])
        if len(rows) == len(positions):
            # A row stored since may hold a deleted row's key: it is not the row listed.
            gone = sum(row.id != self._ids[p] for row, p in zip(rows, positions, strict=True))
        else:
            gone = len(positions) - len(rows)
        if gone:
            raise StorageError(
                f"{gone} of the rows this dataset lists were deleted since it was created; "
                "call dataset.refresh() to take the rows that exist now"
            )
        return rows

    def __getitem__(self, i: int) -> DataRow:
        return self._fetch([self._position(i)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[DataRow]:
        """Rows at ``indices`` fetched in one query (DataLoader uses this for a batch)."""
        return self._fetch([self._position(i) for i in indices])

    def collate(self, rows: Sequence[DataRow]) -> Any:
        """A batch from rows of this dataset: ``converter.to_dataset_row(rows)``."""
        return self.converter.to_dataset_row(list(rows))

    def loader(self, batch_size: int = 1, **kwargs: Any) -> DataLoader:  # type: ignore[type-arg]
        """A DataLoader over this dataset whose batches go through :meth:`collate`."""
        kwargs.setdefault("collate_fn", self.collate)
        return DataLoader(self, batch_size=batch_size, **kwargs)


class SampledBatches(IterableDataset):  # type: ignore[type-arg]
    """A torch IterableDataset of sampled batches: each item is ``buffer.sample(...)``.

    ``SampledBatches(buffer, sampler=None, batch_size=32, converter=None, num_batches=None,
    *, query_condition=None, prefetch=0)``

    ``num_batches=None`` streams forever; otherwise that many batches in total, shared out
    among DataLoader workers. Items are whole batches, so the DataLoader takes
    ``batch_size=None``; :meth:`loader` sets that up::

        batches = SampledBatches(buffer, PrioritizedSampler(), 256, TensorConverter(fields))
        for batch in batches.loader(num_workers=2):
            ...

    Each DataLoader worker samples on its own connection with its own random stream,
    seeded from torch's worker info (``worker_info.seed``, which is torch's base seed plus
    the worker id) together with the sampler's ``seed``, so workers never repeat each
    other's batches, and ``torch.manual_seed`` (or the DataLoader's ``generator``) makes a
    run reproducible. A persistent worker keeps its stream across epochs. Without
    workers, the sampler's own stream is used as it is. A sampler's own state (such as
    ``UniformSampler(replacement=False)``'s epoch) is per worker.

    ``prefetch=k`` makes up to ``k`` batches ahead in a background thread of the process
    that iterates (``buffer.batches``): the main process without workers, each worker with
    them (where the DataLoader's own ``prefetch_factor`` also queues batches).
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        sampler: Sampler | None = None,
        batch_size: int = 32,
        converter: Converter[Any] | None = None,
        num_batches: int | None = None,
        *,
        query_condition: QueryCondition = None,
        prefetch: int = 0,
    ) -> None:
        self.buffer = buffer
        self.prefetch = check_int("prefetch", prefetch, minimum=0)
        self.sampler = sampler if sampler is not None else UniformSampler()
        self.batch_size = check_batch_size(batch_size)
        self.converter = converter if converter is not None else DefaultConverter()
        check_int("num_batches", num_batches, minimum=0, optional=True)
        self.num_batches = num_batches
        self.query_condition = query_condition
        self._seeded_worker: tuple[int, int] | None = None

    def __len__(self) -> int:
        if self.num_batches is None:
            raise UnsupportedTypeError(
                "SampledBatches(num_batches=None) is endless and has no length"
            )
        return self.num_batches

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        sampler = self.sampler
        worker, workers = 0, 1
        if info is not None:
            worker, workers = info.id, info.num_workers
            # Seed once per worker process: a persistent worker keeps its stream going
            # from one epoch to the next instead of replaying it.
            if self._seeded_worker != (os.getpid(), info.seed):
                self._seeded_worker = (os.getpid(), info.seed)
                seed = getattr(sampler, "seed", None)
                entropy = [int(info.seed)]
                if isinstance(seed, (int, np.integer)):
                    entropy.append(int(seed))
                sampler.reseed(np.random.SeedSequence(entropy))
        count = None if self.num_batches is None else len(range(worker, self.num_batches, workers))
        with self.buffer.batches(
            sampler,
            self.query_condition,
            self.converter,
            self.batch_size,
            prefetch=self.prefetch,
            num_batches=count,
        ) as stream:
            yield from stream

    def loader(self, **kwargs: Any) -> DataLoader:  # type: ignore[type-arg]
        """A DataLoader yielding these batches as they are (``batch_size=None``)."""
        return DataLoader(self, batch_size=None, **kwargs)
