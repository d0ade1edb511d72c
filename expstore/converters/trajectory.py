"""TrajectoryConverter: one task's rows in order, with discounted returns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._args import check_number
from ..errors import InvalidArgumentError
from ..model.rows import DataRow
from .base import Converter

__all__ = ["TrajectoryConverter"]


class TrajectoryConverter(Converter[dict[str, Any]]):
    """One task's rows, ordered by step then execute_time, with discounted returns.

    ``TrajectoryConverter(gamma=1.0)``

    Made for ``buffer.sample_task(converter=TrajectoryConverter(gamma=0.99))``, which calls
    it once per sampled task. Returns a dict:

    - ``task_id``: the task;
    - ``rows``: its rows in order;
    - ``steps`` (int64), ``rewards`` (float64; a missing ``reward_t`` counts 0), ``dones``
      (bool): one entry per row;
    - ``returns`` (float64): ``G_t = r_t + gamma * G_{t+1}``, computed backwards from the
      last row (Monte Carlo returns, DigiRL's ``mc_return``).

    Rows from more than one task raise ValueError: group them with ``sample_task`` first.

    >>> TrajectoryConverter(gamma=0.5).to_dataset_row([])["returns"]
    array([], dtype=float64)
    """

    def __init__(self, gamma: float = 1.0) -> None:
        self.gamma = check_number("gamma", gamma, minimum=0, maximum=1)

    def to_dataset_row(self, rows: Sequence[DataRow]) -> dict[str, Any]:
        tasks = list(dict.fromkeys(r.exp_meta.task_id for r in rows))
        if len(tasks) > 1:
            shown = ", ".join(repr(t) for t in tasks[:5])
            raise InvalidArgumentError(
                f"TrajectoryConverter turns one task's rows into a trajectory, got rows of "
                f"{len(tasks)} tasks ({shown}); use buffer.sample_task(...), which converts "
                "each task on its own"
            )
        ordered = sorted(rows, key=lambda r: (r.exp_meta.step, r.exp_meta.execute_time))
        rewards = np.array(
            [0.0 if r.exp_data.reward_t is None else r.exp_data.reward_t for r in ordered],
            dtype=np.float64,
        )
        returns = np.empty_like(rewards)
        running = 0.0
        for t in range(len(rewards) - 1, -1, -1):
            running = rewards[t] + self.gamma * running
            returns[t] = running
        return {
            "task_id": tasks[0] if tasks else None,
            "rows": ordered,
            "steps": np.array([r.exp_meta.step for r in ordered], dtype=np.int64),
            "rewards": rewards,
            "dones": np.array([bool(r.exp_data.done) for r in ordered], dtype=bool),
            "returns": returns,
        }
