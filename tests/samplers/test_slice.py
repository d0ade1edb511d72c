"""SliceSampler: windows of consecutive steps of one task."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import EmptyBufferError, ReplayBuffer
from expstore.samplers import SliceSampler
from tests.helpers import make_row
from tests.samplers.stats import chi_square_p, make_index, positions


def _index(lengths: list[int]) -> dict[str, np.ndarray]:
    # Tasks interleaved in insertion order, steps stored out of order within a task.
    tasks, steps = [], []
    for t, n in enumerate(lengths):
        tasks += [f"t{t}"] * n
        steps += list(range(n))[::-1]
    order = np.random.default_rng(0).permutation(len(tasks))
    return make_index(
        len(tasks),
        task_id=np.array(tasks, dtype=object)[order],
        step=np.array(steps, dtype=np.int64)[order],
        execute_time=np.zeros(len(tasks)),
    )


def test_each_window_is_consecutive_steps_of_one_task() -> None:
    index = _index([7, 3, 10])
    sampler = SliceSampler(4, seed=0)
    keys = sampler.sample_keys(index, 4 * 50, sampler.rng)
    for window in positions(index, keys).reshape(50, 4):
        assert len(set(index["task_id"][window])) == 1
        steps = index["step"][window]
        assert np.array_equal(steps, np.arange(steps[0], steps[0] + 4))


def test_tasks_shorter_than_the_slice_are_never_sampled() -> None:
    index = _index([7, 3, 10])
    sampler = SliceSampler(4, seed=1)
    drawn = positions(index, sampler.sample_keys(index, 4 * 200, sampler.rng))
    assert "t1" not in set(index["task_id"][drawn])


def test_windows_are_uniform_over_all_windows_of_all_tasks() -> None:
    index = _index([7, 3, 10])  # windows: 4 in t0, 7 in t2
    sampler = SliceSampler(4, seed=2)
    drawn = positions(index, sampler.sample_keys(index, 4 * 11_000, sampler.rng)).reshape(-1, 4)
    starts = [(index["task_id"][w[0]], int(index["step"][w[0]])) for w in drawn]
    windows = [("t0", s) for s in range(4)] + [("t2", s) for s in range(7)]
    counts = [starts.count(w) for w in windows]
    assert sum(counts) == len(starts)
    assert chi_square_p(counts, np.ones(len(windows))) > 1e-3


def test_batch_size_must_be_a_multiple_of_the_slice() -> None:
    index = _index([8])
    sampler = SliceSampler(4)
    with pytest.raises(ValueError, match="multiple of 4; got 6"):
        sampler.sample_keys(index, 6, sampler.rng)


def test_no_task_long_enough_raises_empty_buffer_error(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("a", step=s) for s in range(3)])
    with pytest.raises(EmptyBufferError, match="no task has 4 or more matching rows"):
        SliceSampler(4).sample(buffer.storage, 8)


def test_slices_from_storage_are_ordered_by_step_then_time(buffer: ReplayBuffer) -> None:
    rows = [make_row("a", step=s, execute_time=100.0 - s) for s in (3, 0, 2, 1, 4)]
    rows += [make_row("b", step=0, execute_time=t) for t in (2.0, 1.0)]  # same step twice
    buffer.store_batch(rows)
    sampler = SliceSampler(2, seed=0)
    for _ in range(10):
        got = sampler.sample(buffer.storage, 2)
        if got[0].exp_meta.task_id == "a":
            assert got[1].exp_meta.step == got[0].exp_meta.step + 1
        else:
            assert [r.exp_meta.execute_time for r in got] == [1.0, 2.0]
