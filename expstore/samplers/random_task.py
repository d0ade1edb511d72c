"""RandomTaskSampler: whole tasks, each equally likely whatever its row count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .._args import check_batch_size, check_staleness, seeded_rng
from ..policy_versions import fresh_mask
from ..query import QueryCondition
from ..storage.base import KeySpace, Storage
from .base import TaskSampler, with_current_version
from .flat import draw_uniform
from .loop import Choice, empty_error
from .state import DerivedArrays, value_codes

__all__ = ["RandomTaskSample", "RandomTaskSampler"]

_T = TypeVar("_T")
#: How a task's rows are ordered (then by insertion), as TaskSampler orders them.
_TASK_ORDER = ("step", "execute_time")


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

    #: Whether to draw tasks over the key space when it can (False: over the key index).
    flat: bool = True
    #: The share of candidate rows the last draw over the key space kept.
    _kept: float = 0.1

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
        chosen = self._over_key_space(storage, batch_size, query_condition, lambda _, ids: ids)
        if chosen is not None:
            return chosen
        index = storage.key_index(query_condition, self._columns)
        return self._choose(index, batch_size, storage, query_condition)

    def choose(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition = None
    ) -> Choice:
        choice = self._over_key_space(
            storage,
            batch_size,
            query_condition,
            lambda space, ids: Choice(space.rows_of("task_id", ids, _TASK_ORDER)),
        )
        if choice is not None:
            return choice
        # The matching tasks and the whole buffer's rows, from one read.
        matching, whole = storage.key_indexes(
            [(query_condition, self._columns), (None, self.TASK_COLUMNS)]
        )
        task_ids = self._choose(matching, batch_size, storage, query_condition)
        return Choice(self.task_keys(whole, task_ids))

    def _over_key_space(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: QueryCondition,
        use: Callable[[KeySpace, list[str]], _T],
    ) -> _T | None:
        """``use(space, task ids)`` of tasks drawn over the key space, on one snapshot (the
        counts and rows as the probes saw them); None where the key index serves."""
        if not self.flat or self.max_staleness is not None:
            return None
        batch_size = check_batch_size(batch_size)

        def draw(space: KeySpace) -> _T | None:
            chosen = self._task_ids_flat(space, batch_size)
            return None if chosen is None else use(space, chosen)

        return storage.key_space(query_condition, draw, snapshot=True)

    def _task_ids_flat(self, space: KeySpace, batch_size: int) -> list[str] | None:
        """Distinct tasks over the key space: matching rows drawn uniformly and kept with
        probability 1 / (the task's matching rows) are uniform draws among the eligible
        tasks; the first ``batch_size`` distinct ones are a uniformly random subset. None
        (the key index then serves) when the tasks are too few for that to pay, as when
        the batch asks for more tasks than there are, or too long (over ~128 matching rows
        each on average, a candidate is kept too rarely)."""
        counts: dict[str, int] = {}

        def accept(columns: dict[str, np.ndarray]) -> np.ndarray:
            tasks = columns["task_id"].tolist()
            counts.update(space.count_by("task_id", [t for t in set(tasks) if t not in counts]))
            return np.array([1.0 / counts.get(t, 1) for t in tasks])

        chosen: dict[str, None] = {}
        budget = 2 * batch_size + 16  # draws; more mean few tasks, which the key index lists
        while len(chosen) < batch_size and budget > 0:
            want = min(budget, batch_size - len(chosen) + 8)
            drawn = draw_uniform(
                space, want, self.rng, columns=("task_id",), accept=accept, hint=self._kept
            )
            if drawn is None:
                return None
            self._kept = drawn.kept  # sizes the next call's first round
            budget -= want
            for task in drawn.columns["task_id"].tolist():
                if len(chosen) < batch_size:
                    chosen.setdefault(task)
        if len(chosen) < batch_size:
            return None
        return [str(task) for task in chosen]

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
        tasks = self._derived_arrays().get(
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
        return self._derived_arrays().get(f"fresh:{current}:{k}", sources, compute)


#: AWorld's name for RandomTaskSampler.
RandomTaskSample = RandomTaskSampler
