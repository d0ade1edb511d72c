"""The sampler interfaces: a Sampler chooses rows, storage fetches them.

- :class:`Sampler` is AWorld's interface: ``sample(storage, batch_size, query_condition=None)``
  returns a list of :class:`~expstore.models.DataRow`. Subclass it to sample any way at all.
- :class:`KeySampler` is the fast path every built-in sampler takes. It asks the storage for
  the matching rows' integer keys and a few metadata columns as numpy arrays
  (``storage.key_index``, cached until the buffer changes), lets :meth:`KeySampler.sample_keys`
  choose keys over those arrays, and fetches only the chosen rows by primary key. The table
  is never scanned or ``ORDER BY random()``-ed per batch. A custom sampler overrides just
  ``sample_keys`` (and says which columns it reads in ``columns``)::

      import numpy as np
      from expstore import EmptyBufferError
      from expstore.samplers import KeySampler

      class HighRewardSampler(KeySampler):
          \"\"\"Uniform over the rows whose reward is at least ``threshold``.\"\"\"

          columns = ("reward_t",)

          def __init__(self, threshold: float, *, seed: int | None = None) -> None:
              super().__init__(seed=seed)
              self.threshold = threshold

          def sample_keys(self, index, batch_size, rng):
              keys = index["key"][index["reward_t"] >= self.threshold]
              if not len(keys):  # the base class adds the condition to the message
                  raise EmptyBufferError(f"no row has reward_t >= {self.threshold}")
              return rng.choice(keys, size=batch_size)  # with replacement

      rows = HighRewardSampler(0.5, seed=0).sample(buffer.storage, 32)

- :class:`TaskSampler` chooses whole tasks (trajectories), as AWorld's ``TaskSampler``.

Every built-in sampler takes ``seed=``: ``np.random.default_rng(seed)`` drives all its draws, so
the same seed over the same data gives the same batches.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..errors import EmptyBufferError, StorageError
from ..models import DataRow
from ..storage.base import QueryCondition, Storage

__all__ = [
    "DerivedArrays",
    "KeySampler",
    "Sampler",
    "TaskSampler",
    "check_batch_size",
    "describe_condition",
    "empty_error",
    "value_codes",
]

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Derived arrays kept per sampler (one per condition in use, most recent first).
_DERIVED_ENTRIES = 4

#: How many times a sampler chooses again when rows it chose were deleted by another writer
#: before they could be fetched.
_FETCH_ATTEMPTS = 5


def value_codes(values: Sequence[Any]) -> np.ndarray:
    """An int64 code per value, equal codes for equal values, numbered in order of first
    appearance. ``dict.fromkeys`` and ``map`` run in C: no Python-level loop per row."""
    first_seen = dict.fromkeys(values)
    codes = dict(zip(first_seen, range(len(first_seen)), strict=False))
    return np.fromiter(map(codes.__getitem__, values), dtype=np.int64, count=len(values))


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as an int >= 1, or a ValueError that says what arrived."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return int(batch_size)


def describe_condition(query_condition: QueryCondition) -> str:
    """A readable form of a condition for messages (``str(condition)``)."""
    if query_condition is None:
        return "none, all rows"
    try:
        from ..query import as_condition

        return str(as_condition(query_condition))
    except Exception:  # noqa: BLE001 - only for a message; fall back to the raw value
        return str(query_condition)


def empty_error(storage: Storage, query_condition: QueryCondition, what: str) -> EmptyBufferError:
    """The EmptyBufferError for ``what`` (e.g. "no rows match") under ``query_condition``."""
    name = getattr(storage, "name", None)
    where = f" in buffer {name!r}" if name else ""
    return EmptyBufferError(
        f"cannot sample: {what}{where} (condition: {describe_condition(query_condition)}); "
        "store rows first or loosen the condition"
    )


class DerivedArrays:
    """Values computed from key-index arrays, kept while those arrays are unchanged.

    The storage hands back the very same read-only array objects until the buffer changes,
    so identity tells whether a derived value is still valid. A few entries are kept (one
    per condition in use, most recent first). Pickling drops them: they are rebuilt where
    the sampler lands (e.g. in a DataLoader worker).
    """

    def __init__(self) -> None:
        self._entries: list[tuple[str, tuple[np.ndarray, ...], Any]] = []

    def get(self, name: str, sources: tuple[np.ndarray, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, or the value remembered for ``name`` over these very arrays."""
        for i, (entry_name, entry_sources, value) in enumerate(self._entries):
            if entry_name == name and len(entry_sources) == len(sources):
                if all(a is b for a, b in zip(entry_sources, sources, strict=True)):
                    if i:
                        self._entries.insert(0, self._entries.pop(i))
                    return value  # type: ignore[no-any-return]
        value = compute()
        self._entries.insert(0, (name, sources, value))
        del self._entries[_DERIVED_ENTRIES:]
        return value

    def __getstate__(self) -> dict[str, Any]:
        return {"_entries": []}


class Sampler(ABC):
    """Chooses rows from a storage (AWorld's interface).

    Implement :meth:`sample`. A sampler that can say more about its batch than the rows
    (importance weights, say) also overrides :meth:`sample_with_info`.
    """

    @abstractmethod
    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        """Up to ``batch_size`` rows among those matching ``query_condition``."""

    def sample_with_info(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> tuple[list[DataRow], dict[str, Any]]:
        """The rows and per-row extras for the batch (``{}`` unless the sampler has some).

        :class:`~expstore.ReplayBuffer.sample` calls this and hands the extras to the
        converter, so e.g. a prioritized batch carries ``"weights"`` and ``"ids"``.
        """
        return self.sample(storage, batch_size, query_condition), {}

    def reseed(self, seed: Any) -> None:
        """Restart the sampler's random stream from ``seed`` (and forget any epoch state).

        :class:`~expstore.torch_data.SampledBatches` calls this in each DataLoader worker.
        This default restarts every ``numpy.random.Generator`` and ``random.Random`` the
        sampler holds as an attribute, each from its own child of ``seed``, so a custom
        sampler that keeps one gets a stream of its own in each worker (the module-level
        ``random`` and ``np.random`` streams torch already seeds per worker). Override it
        to reset other state.
        """
        sequence = (
            seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        )
        for name, value in sorted(vars(self).items()):
            if isinstance(value, np.random.Generator):
                setattr(self, name, np.random.default_rng(sequence.spawn(1)[0]))
            elif isinstance(value, random.Random):
                value.seed(int(sequence.spawn(1)[0].generate_state(1, np.uint64)[0]))


class KeySampler(Sampler):
    """A sampler that chooses integer keys over the storage's cached key index.

    Subclasses implement :meth:`sample_keys` and list the index columns they read in
    ``columns`` (any of ``step``, ``execute_time``, ``task_id``, ``task_name``, ``agent_id``,
    ``pre_agent``, ``reward_t``, ``adv_t``, ``v_t``, ``done``, ``priority``).

    After each call, ``last_keys`` holds the chosen keys and ``last_ids`` the ids of the rows
    returned, in batch order.
    """

    #: The key_index columns :meth:`sample_keys` reads, besides ``"key"``.
    columns: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, seed: int | None = None) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self.last_keys: np.ndarray = np.empty(0, dtype=np.int64)
        self.last_ids: list[str] = []

    @property
    def rng(self) -> np.random.Generator:
        """The random stream all draws come from (created on first use if a subclass
        forgot to call ``super().__init__``)."""
        rng = self.__dict__.get("_rng")
        if rng is None:
            rng = self._rng = np.random.default_rng(getattr(self, "seed", None))
        return rng

    def reseed(self, seed: Any) -> None:
        super().reseed(seed)  # generators a subclass holds
        self._rng = np.random.default_rng(seed)

    def derived(self, name: str, sources: tuple[np.ndarray, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, remembered while ``sources`` are the same array objects.

        See :class:`DerivedArrays`; use it for work over the whole index (a cumulative sum,
        a grouping) so it happens once per change of the buffer, not once per batch.
        """
        cache = self.__dict__.get("_derived")
        if cache is None:
            cache = self._derived = DerivedArrays()
        return cache.get(name, sources, compute)

    def index_columns(self) -> tuple[str, ...]:
        """The columns to ask ``key_index`` for (``columns`` unless an instance overrides)."""
        return tuple(self.columns)

    def read_index(self, storage: Storage, query_condition: QueryCondition) -> dict[str, Any]:
        """The arrays :meth:`sample_keys` chooses from: ``storage.key_index`` of the matching
        rows and :meth:`index_columns`. A sampler that also needs something of the whole
        buffer adds it here."""
        return storage.key_index(query_condition, self.index_columns())

    @abstractmethod
    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Choose keys from ``index["key"]`` (int64, ascending = insertion order).

        ``index`` also holds the arrays named in ``columns`` (aligned with ``"key"``; floats
        are float64 with NaN for NULL; the arrays are read-only and shared, never modify
        them). ``index["key"]`` is never empty here. Return the chosen keys in batch order;
        repeats are allowed. Raise :class:`~expstore.EmptyBufferError` if no row is eligible.
        """

    def batch_info(
        self, index: dict[str, np.ndarray], keys: np.ndarray, ids: list[str]
    ) -> dict[str, Any]:
        """Per-row extras for a batch whose ``keys`` were all fetched (rows ``ids``)."""
        return {}

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        return self.sample_with_info(storage, batch_size, query_condition)[0]

    def sample_with_info(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> tuple[list[DataRow], dict[str, Any]]:
        def fetch(keys: np.ndarray) -> tuple[list[DataRow], list[str]]:
            rows = storage.fetch_keys(keys)
            return rows, [row.id for row in rows]

        return self._draw(storage, batch_size, query_condition, fetch)

    def sample_fields(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: QueryCondition,
        paths: Sequence[str],
        *,
        writable: bool = True,
    ) -> tuple[tuple[list[str], list[Any]], dict[str, Any]]:
        """Like :meth:`sample_with_info`, but fetches only ``paths`` of the chosen rows
        (``storage.fetch_columns``): ``((ids, values per path), info)``, where a path's
        values are a list or, for a tensor field, an array whose first axis is the rows.
        With ``writable=False`` arrays may be read-only (for a converter that copies them)."""
        fetch_columns = getattr(storage, "fetch_columns", None)
        if fetch_columns is None:
            raise TypeError(f"{type(storage).__name__} cannot fetch single fields")

        def fetch(keys: np.ndarray) -> tuple[tuple[list[str], list[Any]], list[str]]:
            ids, columns = fetch_columns(keys, paths, writable=writable)
            return (ids, columns), ids

        return self._draw(storage, batch_size, query_condition, fetch)

    def _draw(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: QueryCondition,
        fetch: Callable[[np.ndarray], tuple[_R, list[str]]],
    ) -> tuple[_R, dict[str, Any]]:
        batch_size = check_batch_size(batch_size)
        has_info = type(self).batch_info is not KeySampler.batch_info
        attempts = _FETCH_ATTEMPTS
        for attempt in range(attempts):
            index = self.read_index(storage, query_condition)
            if not len(index["key"]):
                raise empty_error(storage, query_condition, "no rows match")
            try:
                keys = np.asarray(self.sample_keys(index, batch_size, self.rng), dtype=np.int64)
            except EmptyBufferError as exc:
                raise empty_error(storage, query_condition, str(exc)) from None
            fetched, ids = fetch(keys)
            # A row deleted by another writer (evicted, say) between choosing and fetching
            # is missing: choose again from the fresh index, so the batch is full. After the
            # last attempt a batch with per-row info (which must stay aligned) fails; any
            # other comes back with the rows that could be fetched.
            if len(ids) == len(keys):
                break
            if has_info and attempt == attempts - 1:
                raise StorageError(
                    f"{type(self).__name__}: rows chosen from the index kept being deleted "
                    f"before they could be fetched ({attempts} attempts); another process is "
                    "deleting or evicting faster than this sampler reads. Retry the call"
                )
        self.last_keys = keys
        self.last_ids = ids
        info = self.batch_info(index, keys, self.last_ids) if has_info else {}
        return fetched, info


class TaskSampler(Sampler):
    """Chooses whole tasks (trajectories), as AWorld's ``TaskSampler``.

    Implement :meth:`sample_task_ids`. :meth:`sample_tasks` fetches every row of each chosen
    task (ordered by step, then execute_time), and :meth:`sample` returns those rows flat.
    """

    @abstractmethod
    def sample_task_ids(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[str]:
        """Up to ``batch_size`` task ids among tasks with at least one matching row."""

    def sample_tasks(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> dict[str, list[DataRow]]:
        """The chosen tasks' rows, grouped by task id in the order the tasks were chosen."""
        task_ids = self.sample_task_ids(storage, batch_size, query_condition)
        grouped = storage.get_batch_by_task_ids(task_ids)
        return {t: grouped.get(t, []) for t in task_ids}

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[DataRow]:
        """Every row of up to ``batch_size`` chosen tasks, task by task."""
        tasks = self.sample_tasks(storage, batch_size, query_condition)
        return [row for task_rows in tasks.values() for row in task_rows]
