"""SliceSampler: contiguous windows of consecutive steps of one trajectory, for sequence
models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
from typing_extensions import Unpack

from .._args import check_int
from ..errors import EmptyBufferError, InvalidArgumentError
from ..query.fields import resolve_field
from .base import KeySampler, SamplerOptions, value_codes

__all__ = ["SliceSampler"]


class SliceSampler(KeySampler):
    """Windows of ``slice_len`` consecutive steps of one trajectory.

    ``SliceSampler(slice_len, traj_key="task_id", *, seed=None, max_staleness=None, ...)``

    A trajectory is the rows sharing ``traj_key``: by default the task (AWorld's unit, the
    rows ``get_by_task_id`` returns), whichever agent wrote each step, so a task whose steps
    alternate between agents (multi-agent hand-offs) is one trajectory.
    ``traj_key=("task_id", "agent_id")`` splits each task by agent too; any columns (or
    payload paths) can be given, as TorchRL's ``traj_key``.

    The matching rows are cut into *runs*: the rows of one trajectory in order of step
    (then insertion), split wherever the step does not go up by exactly 1, that is at a
    missing step (deleted, evicted, or left out by the condition) and at a repeated step.
    A window is ``slice_len`` rows in a row of one run, so its steps are ``s, s + 1, ...,
    s + slice_len - 1`` of one trajectory. The batch holds ``batch_size // slice_len``
    windows, one after the other, so ``batch_size`` must be a multiple of ``slice_len``;
    row ``i`` of window ``j`` is ``rows[j * slice_len + i]`` (``TensorConverter`` output
    reshapes with ``.view(-1, slice_len, ...)``). Windows are drawn uniformly with
    replacement among all windows of all runs, so a longer run offers more windows.

    Runs shorter than ``slice_len`` are never sampled: a window never spans two runs (nor
    two trajectories) and is never padded. If no run is long enough, sampling raises
    :class:`~expstore.EmptyBufferError`.

    >>> sampler = SliceSampler(8, seed=0)
    >>> SliceSampler(8, traj_key=("task_id", "agent_id")).traj_key
    ('task_id', 'agent_id')
    """

    def __init__(
        self,
        slice_len: int,
        traj_key: str | Sequence[str] = "task_id",
        **options: Unpack[SamplerOptions],
    ) -> None:
        super().__init__(**options)
        self.slice_len = check_int("slice_len", slice_len, minimum=1)
        keys = (traj_key,) if isinstance(traj_key, str) else traj_key
        if (
            not isinstance(keys, (tuple, list))
            or not keys
            or not all(isinstance(k, str) and k for k in keys)
        ):
            raise InvalidArgumentError(
                'traj_key must be a column or path ("task_id"), or several '
                f'(("task_id", "agent_id")), got {traj_key!r}'
            )
        for key in keys:
            resolve_field(key)  # a field that does not exist fails here, with did-you-mean
        self.traj_key: tuple[str, ...] = tuple(keys)

    def index_columns(self) -> tuple[str, ...]:
        return (*self.traj_key, "step")

    def _windows(self, index: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        """(row positions in run order, positions in that order where windows start, the
        length of the longest run)."""
        steps = index["step"]
        sources = tuple(index[k] for k in self.traj_key)

        def compute() -> tuple[np.ndarray, np.ndarray, int]:
            if not len(steps):
                return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), 0
            # The sort is stable: rows with equal steps keep insertion (key) order.
            order, groups = _run_order(_trajectory_codes(sources), steps)
            ordered_steps = steps[order]
            # A run starts at the first row and wherever the trajectory changes or the
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

        name = f"windows:{self.slice_len}:{self.traj_key}"
        return self.derived(name, (*sources, steps), compute)

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
                f"no trajectory (by {', '.join(self.traj_key)}) has {self.slice_len} or more "
                f"consecutive steps among the matching rows (the longest run has {longest} "
                f"{'step' if longest == 1 else 'steps'})"
            )
        chosen = window_starts[rng.integers(0, len(window_starts), batch_size // self.slice_len)]
        positions = order[(chosen[:, None] + np.arange(self.slice_len)).reshape(-1)]
        return cast("np.ndarray", index["key"][positions])


def _trajectory_codes(sources: tuple[np.ndarray, ...]) -> np.ndarray:
    """One int64 code per row, equal for rows equal in every source array."""
    codes = value_codes(sources[0].tolist())
    for source in sources[1:]:
        more = value_codes(source.tolist())
        # Both codes are < len(rows), so the pair fits in int64 below 3e9 rows; renumber
        # so the next pair fits too.
        codes = np.unique(codes * (int(more.max()) + 1) + more, return_inverse=True)[1]
    return codes.astype(np.int64, copy=False)


def _run_order(groups: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row positions ordered by trajectory, step, then position; the trajectory code of
    each row in that order)."""
    top_step = int(steps.max())
    if int(groups.max()) * (top_step + 1) + top_step < 2**63:
        # One stable sort over a combined key is much faster than lexsort over two.
        order = np.argsort(groups * (top_step + 1) + steps, kind="stable")
    else:
        order = np.lexsort((steps, groups))
    return order, groups[order]
