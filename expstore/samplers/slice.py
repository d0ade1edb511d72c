"""SliceSampler: contiguous windows of consecutive steps of one trajectory, for sequence
models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from typing_extensions import Unpack

from .._args import check_int
from ..errors import EmptyBufferError, InvalidArgumentError
from ..query import QueryCondition
from ..query.fields import resolve_field
from ..storage.base import KeySpace
from .base import KeySampler, SamplerOptions
from .loop import Choice

__all__ = ["SliceSampler"]

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
        """Windows drawn by their first row: matching rows drawn uniformly, kept when their
        run holds ``slice_len`` rows from them on (:meth:`KeySpace.runs_from
        <expstore.storage.base.KeySpace.runs_from>`). Each window has one first row, so the
        kept ones are uniform draws among all windows: over the database by rejection
        (None, for the key index, when windows start at too few rows for that to pay),
        over the key index held in memory exactly, among every row that starts one."""
        length, columns = self.slice_len, (*self.traj_key, "step")
        if batch_size % length:  # refused as any draw is: once rows are found
            if self.draw_rows(space, 1, query_condition) is None:
                return None
            self._check_batch(batch_size)

        def starts(at: dict[str, np.ndarray]) -> np.ndarray:
            found = space.runs_from(self.traj_key, "step", at, length)
            chances: np.ndarray = (found == length).astype(np.float64)
            return chances

        name = f"windows:{length}:{self.traj_key}"
        drawn = self.draw_rows(
            space,
            batch_size // length,
            query_condition,
            columns=columns,
            accept=starts,
            name=name,
            min_tried=_MIN_TRIED,
        )
        if drawn is None:
            if space.listed is None:
                return None  # (no matching row, or few windows: the key index says which)
            longest = int(space.runs_from(self.traj_key, "step", space.listed, length).max())
            raise EmptyBufferError(
                f"no trajectory (by {', '.join(self.traj_key)}) has {length} or more "
                f"consecutive steps among the matching rows (the longest run has {longest} "
                f"{'step' if longest == 1 else 'steps'})"
            )
        at = {"key": drawn.keys, **drawn.columns}
        return Choice(space.windows(self.traj_key, "step", at, length).reshape(-1))

    def _check_batch(self, batch_size: int) -> None:
        if batch_size % self.slice_len:
            raise InvalidArgumentError(
                f"SliceSampler(slice_len={self.slice_len}) returns whole windows, so batch_size "
                f"must be a multiple of {self.slice_len}; got {batch_size}"
            )
