"""SliceSampler: contiguous windows of consecutive steps of one task, for sequence models."""

from __future__ import annotations

import numpy as np

from .._args import check_int
from ..errors import EmptyBufferError, InvalidArgumentError
from .base import KeySampler, value_codes

__all__ = ["SliceSampler"]


class SliceSampler(KeySampler):
    """Windows of ``slice_len`` consecutive steps of one task and agent.

    ``SliceSampler(slice_len, *, seed=None)``

    The matching rows are cut into *runs*: the rows of one ``(task_id, agent_id)`` in order
    of step (then insertion), split wherever the step does not go up by exactly 1, that is
    at a missing step (deleted, evicted, or left out by the condition) and at a repeated
    step. A window is ``slice_len`` rows in a row of one run, so its steps are ``s, s + 1,
    ..., s + slice_len - 1`` of one agent in one task. The batch holds
    ``batch_size // slice_len`` windows, one after the other, so ``batch_size`` must be a
    multiple of ``slice_len``; row ``i`` of window ``j`` is ``rows[j * slice_len + i]``
    (``TensorConverter`` output reshapes with ``.view(-1, slice_len, ...)``). Windows are
    drawn uniformly with replacement among all windows of all runs, so a longer run offers
    more windows.

    Runs shorter than ``slice_len`` are never sampled: a window never spans two runs (nor
    two tasks or agents) and is never padded. If no run is long enough, sampling raises
    :class:`~expstore.EmptyBufferError`.

    >>> sampler = SliceSampler(8, seed=0)
    """

    columns = ("task_id", "agent_id", "step")

    def __init__(
        self, slice_len: int, *, seed: int | None = None, consume_after: int | None = None
    ) -> None:
        super().__init__(seed=seed, consume_after=consume_after)
        self.slice_len = check_int("slice_len", slice_len, minimum=1)

    def _windows(self, index: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        """(row positions in run order, positions in that order where windows start, the
        length of the longest run)."""
        task_ids, agent_ids, steps = index["task_id"], index["agent_id"], index["step"]

        def compute() -> tuple[np.ndarray, np.ndarray, int]:
            if not len(steps):
                return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), 0
            # The sort is stable: rows with equal steps keep insertion (key) order.
            order, groups = _run_order(
                value_codes(task_ids.tolist()), value_codes(agent_ids.tolist()), steps
            )
            ordered_steps = steps[order]
            # A run starts at the first row and wherever the task or agent changes or the
            # step does not go up by exactly 1. (The difference of two steps >= 0 cannot
            # overflow int64.)
            breaks = np.ones(len(order), dtype=bool)
            breaks[1:] = (groups[1:] != groups[:-1]) | (np.diff(ordered_steps) != 1)
            starts = np.flatnonzero(breaks)
            counts = np.diff(np.append(starts, len(order)))
            long_enough = counts >= self.slice_len
            per_run = (counts - self.slice_len + 1)[long_enough]
            first = starts[long_enough]
            # Every start position first .. first + per_run - 1 of every long-enough run.
            window_starts = np.repeat(first - np.cumsum(per_run) + per_run, per_run)
            window_starts += np.arange(int(per_run.sum()), dtype=np.int64)
            return order, window_starts, int(counts.max())

        return self.derived(f"windows:{self.slice_len}", (task_ids, agent_ids, steps), compute)

    def sample_keys(
        self, index: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> np.ndarray:
        if batch_size % self.slice_len:
            raise InvalidArgumentError(
                f"SliceSampler(slice_len={self.slice_len}) returns whole windows, so batch_size "
                f"must be a multiple of {self.slice_len}; got {batch_size}"
            )
        order, window_starts, longest = self._windows(index)
        if not len(window_starts):
            raise EmptyBufferError(
                f"no task has {self.slice_len} or more consecutive steps of one agent among "
                f"the matching rows (the longest run has {longest} "
                f"{'step' if longest == 1 else 'steps'})"
            )
        chosen = window_starts[rng.integers(0, len(window_starts), batch_size // self.slice_len)]
        positions = order[(chosen[:, None] + np.arange(self.slice_len)).reshape(-1)]
        return index["key"][positions]


def _run_order(
    task_codes: np.ndarray, agent_codes: np.ndarray, steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(row positions ordered by task, agent, step, then position; the (task, agent) group
    code of each row in that order)."""
    # Codes are < len(steps), so one group code per (task, agent) fits in int64.
    groups = task_codes * (int(agent_codes.max()) + 1) + agent_codes
    top_step = int(steps.max())
    if int(groups.max()) * (top_step + 1) + top_step < 2**63:
        # One stable sort over a combined key is much faster than lexsort over two.
        order = np.argsort(groups * (top_step + 1) + steps, kind="stable")
    else:
        order = np.lexsort((steps, groups))
    return order, groups[order]
