"""SliceSampler: windows of consecutive steps of one task."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import EmptyBufferError, InvalidArgumentError, QueryError, ReplayBuffer
from expstore.query import QueryBuilder
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
        agent_id=np.full(len(tasks), "a", dtype=object),
        step=np.array(steps, dtype=np.int64)[order],
    )


def _drawn_windows(
    index: dict[str, np.ndarray], sampler: SliceSampler, windows: int
) -> set[tuple[tuple[str, str, int], ...]]:
    keys = sampler.sample_keys(index, sampler.slice_len * windows, sampler.rng)
    drawn = positions(index, keys).reshape(windows, sampler.slice_len)
    return {
        tuple((index["task_id"][p], index["agent_id"][p], int(index["step"][p])) for p in w)
        for w in drawn
    }


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


def test_no_run_long_enough_raises_empty_buffer_error(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("a", step=s) for s in (0, 1, 2, 4, 5)])
    with pytest.raises(
        EmptyBufferError,
        match=r"no trajectory \(by task_id\) has 4 or more consecutive steps among the matching "
        r"rows \(the longest run has 3 steps\)",
    ):
        SliceSampler(4).sample(buffer.storage, 8)


def test_windows_never_cross_a_gap_in_the_steps() -> None:
    steps = np.array([0, 1, 3, 4, 5, 7, 9, 10], dtype=np.int64)
    index = make_index(
        len(steps),
        task_id=np.full(len(steps), "t", dtype=object),
        agent_id=np.full(len(steps), "a", dtype=object),
        step=steps,
    )
    got = _drawn_windows(index, SliceSampler(2, seed=0), 300)
    assert {tuple(s for _, _, s in w) for w in got} == {(0, 1), (3, 4), (4, 5), (9, 10)}


def test_windows_split_by_agent_never_mix_agents_that_share_a_task_id() -> None:
    index = make_index(
        8,
        task_id=np.full(8, "t", dtype=object),
        agent_id=np.array(["a", "b"] * 4, dtype=object),
        step=np.array([0, 0, 1, 1, 2, 2, 3, 3], dtype=np.int64),
    )
    got = _drawn_windows(index, SliceSampler(3, ("task_id", "agent_id"), seed=0), 300)
    assert got == {
        tuple(("t", agent, s) for s in range(start, start + 3))
        for agent in ("a", "b")
        for start in (0, 1)
    }


def test_a_repeated_step_splits_the_run() -> None:
    # steps 0 1 2 2 3 4: runs [0 1 2] and [2 3 4], no window holds step 2 twice.
    index = make_index(
        6,
        task_id=np.full(6, "t", dtype=object),
        agent_id=np.full(6, "a", dtype=object),
        step=np.array([0, 1, 2, 2, 3, 4], dtype=np.int64),
    )
    got = _drawn_windows(index, SliceSampler(2, seed=0), 300)
    assert {tuple(s for _, _, s in w) for w in got} == {(0, 1), (1, 2), (2, 3), (3, 4)}
    sampler = SliceSampler(4)
    with pytest.raises(EmptyBufferError, match=r"\(the longest run has 3 steps\)"):
        sampler.sample_keys(index, 4, sampler.rng)


def test_windows_from_storage_skip_deleted_steps(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("A", step=s) for s in range(5)] + [make_row("B", step=0)])
    buffer.delete(QueryBuilder().eq("exp_meta.task_id", "A").and_().eq("exp_meta.step", 2).build())
    sampler = SliceSampler(2, seed=0)
    got = set()
    for _ in range(60):
        rows = sampler.sample(buffer.storage, 2)
        got.add(tuple((r.exp_meta.task_id, r.exp_meta.step) for r in rows))
    assert got == {(("A", 0), ("A", 1)), (("A", 3), ("A", 4))}


def test_a_task_whose_steps_alternate_between_agents_is_one_trajectory() -> None:
    # AWorld's multi-agent hand-offs: step 0 by a, 1 by b, 2 by a, ...
    index = make_index(
        6,
        task_id=np.full(6, "t", dtype=object),
        agent_id=np.array(["a", "b"] * 3, dtype=object),
        step=np.arange(6, dtype=np.int64),
    )
    got = _drawn_windows(index, SliceSampler(3, seed=0), 300)
    assert {tuple(s for _, _, s in w) for w in got} == {(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 5)}
    with pytest.raises(EmptyBufferError, match=r"by task_id, agent_id\) has 3"):
        split = SliceSampler(3, traj_key=("task_id", "agent_id"))
        split.sample_keys(index, 3, split.rng)


def test_hand_offs_from_storage_give_windows_across_agents(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("H", "ab"[s % 2], step=s) for s in range(4)])
    got = {
        tuple(
            (r.exp_meta.agent_id, r.exp_meta.step)
            for r in SliceSampler(4).sample(buffer.storage, 4)
        )
    }
    assert got == {(("a", 0), ("b", 1), ("a", 2), ("b", 3))}


def test_an_unknown_trajectory_key_is_refused() -> None:
    with pytest.raises(QueryError, match="task_idd"):
        SliceSampler(2, traj_key="task_idd")
    with pytest.raises(InvalidArgumentError, match="traj_key"):
        SliceSampler(2, traj_key=())


def test_windows_from_storage_keep_to_one_agent(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("C", agent, step=s) for s in range(3) for agent in ("a", "b")])
    sampler = SliceSampler(3, traj_key=("task_id", "agent_id"), seed=0)
    got = set()
    for _ in range(40):
        rows = sampler.sample(buffer.storage, 3)
        got.add(tuple((r.exp_meta.agent_id, r.exp_meta.step) for r in rows))
    assert got == {(("a", 0), ("a", 1), ("a", 2)), (("b", 0), ("b", 1), ("b", 2))}


def test_a_condition_that_leaves_out_steps_splits_runs(buffer: ReplayBuffer) -> None:
    buffer.store_batch([make_row("a", step=s, reward=float(s % 3)) for s in range(7)])
    cond = QueryBuilder().ne("exp_data.reward_t", 2.0).build()  # leaves out steps 2 and 5
    sampler = SliceSampler(2, seed=0)
    got = set()
    for _ in range(60):
        got.add(tuple(r.exp_meta.step for r in sampler.sample(buffer.storage, 2, cond)))
    assert got == {(0, 1), (3, 4)}


def test_slices_from_storage_are_ordered_by_step(buffer: ReplayBuffer) -> None:
    rows = [make_row("a", step=s, execute_time=100.0 - s) for s in (3, 0, 2, 1, 4)]
    rows += [make_row("b", step=0, execute_time=t) for t in (2.0, 1.0)]  # same step twice
    buffer.store_batch(rows)
    sampler = SliceSampler(2, seed=0)
    for _ in range(20):
        got = sampler.sample(buffer.storage, 2)
        assert [r.exp_meta.task_id for r in got] == ["a", "a"]  # b's runs are 1 step long
        assert got[1].exp_meta.step == got[0].exp_meta.step + 1
