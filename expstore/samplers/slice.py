"""SliceSampler: contiguous windows of consecutive steps of one task, for sequence models."""

from __future__ import annotations

import numpy as np

from ..errors import EmptyBufferError
from .base import KeySampler

__all__ = ["SliceSampler"]


class SliceSampler(KeySampler):
    """Windows of ``slice_len`` consecutive steps of one task.

    ``SliceSampler(slice_len, *, seed=None)``

    The matching rows of each task are put in order of step, then execute_time (then
    insertion); a window is ``slice_len`` rows in a row of that order. The batch holds
    ``batch_size // slice_len`` windows, one after the other, so ``batch_size`` must be a
    multiple of ``slice_len``; row ``i`` of window ``j`` is ``rows[j * slice_len + i]``
    (``TensorConverter`` output reshapes with ``.view(-1, slice_len, ...)``). Windows are
    drawn uniformly with replacement among all windows of all tasks, so a task with more
    steps offers more windows.

    Tasks shorter than ``slice_len`` (counting matching rows) are never sampled: a window
    never spans two tasks and is never padded. If no task is long enough, sampling raises
    :class:`~expstore.EmptyBufferError`. A condition that filters out some steps of a task
    leaves windows of consecutive *matching* rows, which may skip steps.

    >>> sampler = SliceSampler(8, seed=0)
    """

    columns = ("task_id", "step", "execute_time")

    def __init__(self, slice_len: int, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        if isinstance(slice_len, bool) or not isinstance(slice_len, int) or slice_len < 1:
            raise ValueError(f"slice_len must be an int >= 1, got {slice_len!r}")
        self.slice_len = slice_len

    def _windows(self, index: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(row positions in task/step order, positions in that order where windows start)."""
        task_ids, steps, times = index["task_id"], index["step"], index["execute_time"]

        def compute() -> tuple[np.ndarray, np.ndarray]:
            seen: dict[object, int] = {}
            codes = np.fromiter(
                (seen.setdefault(t, len(seen)) for t in task_ids.tolist()),
                dtype=np.int64,
                count=len(task_ids),
            )
            # lexsort sorts by the last key first; the stable sort keeps insertion order.
            order = np.lexsort((times, steps, codes))
            counts = np.bincount(codes)
            ends = np.cumsum(counts)
            starts = ends - counts
            long_enough = counts >= self.slice_len
            per_task = (counts - self.slice_len + 1)[long_enough]
            first = starts[long_enough]
            # Every start position first .. first + per_task - 1 of every long-enough task.
            window_starts = np.repeat(first - np.cumsum(per_task) + per_task, per_task)
            window_starts += np.arange(int(per_task.sum()), dtype=np.int64)
            return order, window_starts

        return self.derived(f"windows:{self.slice_len}", (task_ids, steps, times), compute)

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        if batch_size % self.slice_len:
            raise ValueError(
                f"SliceSampler(slice_len={self.slice_len}) returns whole windows, so batch_size "
                f"must be a multiple of {self.slice_len}; got {batch_size}"
            )
        order, window_starts = self._windows(index)
        if not len(window_starts):
            raise EmptyBufferError(f"no task has {self.slice_len} or more matching rows")
        chosen = window_starts[rng.integers(0, len(window_starts), batch_size // self.slice_len)]
        positions = order[(chosen[:, None] + np.arange(self.slice_len)).reshape(-1)]
        return index["key"][positions]
