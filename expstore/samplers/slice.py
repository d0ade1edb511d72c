"""SliceSampler: contiguous windows of consecutive steps of one trajectory, for sequence
models."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from typing_extensions import Unpack

from .._args import check_int
from ..errors import EmptyBufferError, InvalidArgumentError
from ..query import QueryCondition
from ..query.fields import resolve_field
from ..storage.base import KeySpace
from .base import KeySampler, SamplerOptions
from .flat import MIN_KEPT, Drawn, draw_uniform
from .loop import Choice
from .state import value_codes

__all__ = ["SliceSampler"]

#: The largest step a row can have (BIGINT).
_TOP_STEP = 2**63 - 1
#: Candidates drawn before a draw over the key space may judge windows too rare.
_MIN_TRIED = 1024


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
        #: The shares of candidates kept by the last draw over the key space (as rows of
        #: the buffer, as window starts), which size the next one's first round.
        self._kept = 1.0
        self._kept_windows = 1.0

    #: A window's start and its rows are read on one snapshot of the buffer.
    flat_snapshot = True
    whole_units = True

    def index_columns(self) -> tuple[str, ...]:
        return (*self.traj_key, "step")

    def can_draw_flat(self, query_condition: QueryCondition) -> bool:
        """Over the key space when every trajectory key is a column that holds no NULL (a
        window's rows are then read by (trajectory, step))."""
        specs = [resolve_field(key).column for key in self.traj_key]
        return all(spec is not None and not spec.nullable for spec in specs)

    def choose_flat(
        self, space: KeySpace, batch_size: int, query_condition: QueryCondition
    ) -> Choice | None:
        """Windows over the key space: a matching row drawn uniformly is the start of a
        window when the next ``slice_len - 1`` rows of its run follow it (read by
        trajectory and step); each window has one start, so the kept ones are uniform
        draws among all windows, as over the key index. None (the key index serves) when
        windows start at too few rows for that to pay."""
        budget = self.probe_budget
        if batch_size % self.slice_len:  # refused as over the key index: once rows are found
            if draw_uniform(space, 1, self.rng, hint=self._kept, budget=budget) is None:
                return None
            self._check_batch(batch_size)
        want = batch_size // self.slice_len
        chosen: list[list[int]] = []
        tried = kept = 0
        while len(chosen) < want:
            rate = max(self._kept_windows, MIN_KEPT)
            size = min(math.ceil((want - len(chosen)) / rate * 1.2) + 4, budget)
            columns = (*self.traj_key, "step")
            drawn = draw_uniform(
                space, size, self.rng, columns=columns, hint=self._kept, budget=budget
            )
            if drawn is None:  # (no matching row, or too few: the key index says which)
                return None
            self._kept = drawn.kept
            windows = self._windows_at(space, drawn)
            found = [window for window in windows if window is not None]
            chosen += found[: want - len(chosen)]  # the first kept, in draw order
            tried, kept = tried + len(windows), kept + len(found)
            self._kept_windows = kept / tried
            # Given up on a budget, or once enough draws say windows start too rarely.
            rare = tried >= _MIN_TRIED and self._kept_windows < MIN_KEPT
            if len(chosen) < want and (tried >= budget or rare):
                return None
        return Choice(np.array([key for window in chosen for key in window], dtype=np.int64))

    def _windows_at(self, space: KeySpace, drawn: Drawn) -> list[list[int] | None]:
        """The window starting at each drawn row, or None where its run breaks first."""
        length = self.slice_len
        values = (drawn.columns[name].tolist() for name in self.traj_key)
        trajectories = list(zip(*values, strict=True))
        steps, keys = drawn.columns["step"].tolist(), drawn.keys.tolist()
        starts = list(zip(trajectories, steps, keys, strict=True))
        # (a window's last step never passes the largest step a row can have)
        spans = [(t, step, min(step + length - 1, _TOP_STEP)) for t, step, _ in starts]
        runs: dict[tuple[Any, ...], list[int]] = {}
        for *place, key in space.in_ranges(self.traj_key, "step", spans):
            runs.setdefault(tuple(place), []).append(key)
        return [_window(runs, trajectory, step, key, length) for trajectory, step, key in starts]

    def _check_batch(self, batch_size: int) -> None:
        if batch_size % self.slice_len:
            raise InvalidArgumentError(
                f"SliceSampler(slice_len={self.slice_len}) returns whole windows, so batch_size "
                f"must be a multiple of {self.slice_len}; got {batch_size}"
            )

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
        self._check_batch(batch_size)
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


def _window(
    runs: dict[tuple[Any, ...], list[int]],
    trajectory: tuple[Any, ...],
    step: int,
    key: int,
    length: int,
) -> list[int] | None:
    """The keys of the window starting at row ``key`` (at ``step`` of ``trajectory``), or
    None when its run breaks first. Rows of a trajectory go by step, then key, and a run
    breaks wherever the step does not go up by exactly 1: so the window's first row is the
    last of its step (unless the window is one row), each row after it the first of the
    next step, and each but the last also the only one of its step."""
    here = runs.get((*trajectory, step), [])
    if key not in here or (length > 1 and max(here) != key):
        return None
    window = [key]
    for j in range(1, length):
        at = sorted(runs.get((*trajectory, step + j), []))
        if not at or (j < length - 1 and len(at) > 1):
            return None
        window.append(at[0])
    return window


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
    if int(groups.max()) * (top_step + 1) + top_step < 2**63 and top_step + 1 < 2**63:
        # One stable sort over a combined key is much faster than lexsort over two.
        order = np.argsort(groups * (top_step + 1) + steps, kind="stable")
    else:
        order = np.lexsort((steps, groups))
    return order, groups[order]
