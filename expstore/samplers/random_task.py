"""RandomTaskSampler: whole tasks, each equally likely whatever its row count."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._args import seeded_rng
from ..sampling import Choice
from ..storage.base import QueryCondition, Storage
from ..storage.versions import check_staleness, fresh_mask
from .base import (
    DerivedArrays,
    TaskSampler,
    check_batch_size,
    empty_error,
    value_codes,
    with_current_version,
)

__all__ = ["RandomTaskSample", "RandomTaskSampler"]


class RandomTaskSampler(TaskSampler):
    """Distinct tasks chosen uniformly at random (AWorld's ``RandomTaskSample``).

    ``RandomTaskSampler(*, seed=None, max_staleness=None)``

    The condition decides which tasks are eligible: those with at least one matching row.
    With ``max_staleness=k`` a task's version is its oldest matching row's
    ``policy_version`` (rows without one left out), and tasks more than ``k`` versions
    behind the buffer's current version are not drawn.
    Each eligible task is equally likely, however many rows it has. A ``batch_size`` larger
    than the number of eligible tasks returns all of them (in random order); AWorld's
    version crashes there. The task list comes from the storage's cached key index, so the
    table is not scanned per batch; :meth:`ReplayBuffer.sample` fetches the chosen tasks'
    rows by key, like any other sampler's.

    >>> sampler = RandomTaskSampler(seed=0)
    """

    def __init__(self, *, seed: int | None = None, max_staleness: int | None = None) -> None:
        self.seed = seed
        self.rng = seeded_rng(seed)
        self.max_staleness = check_staleness(max_staleness)
        self._derived = DerivedArrays()

    @property
    def _columns(self) -> tuple[str, ...]:
        return ("task_id",) if self.max_staleness is None else ("task_id", "policy_version")

    def reseed(self, seed: Any) -> None:
        self.rng = np.random.default_rng(seed)

    def sample_task_ids(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> list[str]:
        index = storage.key_index(query_condition, self._columns)
        return self._choose(index, batch_size, storage, query_condition)

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        # The matching tasks and the whole buffer's rows, from one read.
        matching, whole = storage.key_indexes(
            [(query_condition, self._columns), (None, self.TASK_COLUMNS)]
        )
        task_ids = self._choose(matching, batch_size, storage, query_condition)
        return Choice(self.task_keys(whole, task_ids))

    def _choose(
        self,
        index: dict[str, np.ndarray],
        batch_size: int,
        storage: Storage,
        query_condition: QueryCondition,
    ) -> list[str]:
        batch_size = check_batch_size(batch_size)
        if not len(index["key"]):
            raise empty_error(storage, query_condition, "no rows match")
        task_ids = index["task_id"]
        # Distinct tasks in order of first insertion, computed once per change of the buffer.
        tasks = self._derived.get(
            "tasks",
            (task_ids,),
            lambda: np.array(list(dict.fromkeys(task_ids.tolist())), dtype=object),
        )
        if self.max_staleness is not None:
            index = with_current_version(storage, index)
            tasks = self._fresh_tasks(index, tasks)
            if not len(tasks):
                raise empty_error(
                    storage,
                    query_condition,
                    f"every matching task has rows more than max_staleness={self.max_staleness} "
                    f"policy versions behind the current version {index.get('current_version')}",
                )
        chosen = self.rng.choice(len(tasks), size=min(batch_size, len(tasks)), replace=False)
        return [str(tasks[i]) for i in chosen]

    def _fresh_tasks(self, index: dict[str, Any], tasks: np.ndarray) -> np.ndarray:
        """``tasks`` (in order of first insertion) whose oldest row is fresh."""
        current, k = index["current_version"], self.max_staleness
        assert k is not None

        def compute() -> np.ndarray:
            codes = value_codes(index["task_id"].tolist())  # numbered as ``tasks`` is
            oldest = np.full(len(tasks), np.inf)  # rows without a version left out (NaN)
            np.fmin.at(oldest, codes, index["policy_version"])
            oldest[np.isinf(oldest)] = np.nan  # a task without versions is never stale
            keep = fresh_mask(oldest, current, k)
            return tasks if keep is None else tasks[keep]

        sources = (index["task_id"], index["policy_version"])
        return self._derived.get(f"fresh:{current}:{k}", sources, compute)


#: AWorld's name for RandomTaskSampler.
RandomTaskSample = RandomTaskSampler
