"""TrajectoryConverter and DefaultConverter."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.converters import DefaultConverter, TrajectoryConverter
from expstore.samplers import RandomTaskSampler
from tests.helpers import make_row


def test_returns_are_discounted_backwards_from_the_last_step() -> None:
    rows = [make_row("t", step=s, reward=r) for s, r in [(2, 1.0), (0, 0.0), (1, None)]]
    traj = TrajectoryConverter(gamma=0.5).to_dataset_row(rows)
    assert traj["task_id"] == "t"
    assert traj["steps"].tolist() == [0, 1, 2]
    assert traj["rewards"].tolist() == [0.0, 0.0, 1.0]
    np.testing.assert_allclose(traj["returns"], [0.25, 0.5, 1.0])
    assert [r.exp_meta.step for r in traj["rows"]] == [0, 1, 2]


def test_sample_task_gives_one_trajectory_per_task(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row(t, step=s, reward=1.0) for t in "abc" for s in range(3)])
    trajs = buffer.sample_task(RandomTaskSampler(seed=0), None, TrajectoryConverter(1.0), 2)
    assert len(trajs) == 2 and len({t["task_id"] for t in trajs}) == 2
    for traj in trajs:
        assert traj["returns"].tolist() == [3.0, 2.0, 1.0]


def test_rows_of_several_tasks_are_refused() -> None:
    with pytest.raises(ValueError, match="rows of 2 tasks.*sample_task"):
        TrajectoryConverter().to_dataset_row([make_row("a"), make_row("b")])


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.9"])
def test_gamma_must_be_in_the_unit_interval(bad: object) -> None:
    with pytest.raises(ValueError, match="gamma"):
        TrajectoryConverter(gamma=bad)  # type: ignore[arg-type]


def test_default_converter_returns_the_rows_as_they_are() -> None:
    rows = [make_row(), make_row()]
    assert DefaultConverter().to_dataset_row(rows) == rows
    assert DefaultConverter().to_dataset_row(tuple(rows)) == rows
