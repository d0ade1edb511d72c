"""PrioritizedSampler: proportional PER over priorities stored in the database."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from expstore import ReplayBuffer
from expstore.converters import NumpyConverter, TensorConverter
from expstore.query import QueryBuilder
from expstore.samplers import PrioritizedSampler
from tests.helpers import make_rows
from tests.samplers.stats import chi_square_p, make_index, positions


def test_draws_are_proportional_to_priority_plus_eps_to_the_alpha() -> None:
    priority = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    index = make_index(6, priority=priority)
    sampler = PrioritizedSampler(alpha=0.7, eps=0.1, seed=0)
    drawn = positions(index, sampler.sample_keys(index, 30_000, sampler.rng))
    expected = (priority + 0.1) ** 0.7
    assert chi_square_p(np.bincount(drawn, minlength=6), expected) > 1e-3
    assert chi_square_p(np.bincount(drawn, minlength=6), priority + 0.1) < 1e-6


def test_unset_priorities_count_as_the_current_maximum() -> None:
    priority = np.array([1.0, np.nan, 3.0, np.nan])
    index = make_index(4, priority=priority)
    sampler = PrioritizedSampler(alpha=1.0, eps=0.0, seed=1)
    drawn = positions(index, sampler.sample_keys(index, 20_000, sampler.rng))
    assert chi_square_p(np.bincount(drawn, minlength=4), [1.0, 3.0, 3.0, 3.0]) > 1e-3


def test_with_no_priority_set_sampling_is_uniform() -> None:
    index = make_index(8, priority=np.full(8, np.nan))
    sampler = PrioritizedSampler(seed=2)
    drawn = positions(index, sampler.sample_keys(index, 16_000, sampler.rng))
    assert chi_square_p(np.bincount(drawn, minlength=8), np.ones(8)) > 1e-3


def test_importance_weights_are_n_p_to_minus_beta_normalised_by_the_maximum() -> None:
    priority = np.array([1.0, 2.0, 4.0, 8.0])
    index = make_index(4, priority=priority)
    sampler = PrioritizedSampler(alpha=1.0, beta=0.5, eps=0.0, seed=0)
    choice = sampler._choose_listed(index, 400, None)  # over the key index held in memory
    weights = sampler.weights_of(choice)
    assert weights is not None
    at = positions(index, choice.keys)
    probs = priority / priority.sum()
    raw = (4 * probs) ** -0.5
    np.testing.assert_allclose(weights, (raw / raw.max())[at], rtol=1e-6)
    assert weights.dtype == np.float32 and (weights[at == 0] == 1.0).all()
    assert set(at.tolist()) == {0, 1, 2, 3}


def test_one_million_rows_need_no_python_loop() -> None:
    """Choosing 256 keys among 1,000,000 rows and weighting them runs a fixed, small number
    of Python lines (counted with a line tracer), however many rows there are."""
    import sys

    rng = np.random.default_rng(0)
    index = make_index(1_000_000, priority=rng.random(1_000_000))
    sampler = PrioritizedSampler(seed=0)
    sampler._choose_listed(index, 256, None)  # builds the cumulative sum once
    lines = 0

    def tracer(frame, event, arg):  # noqa: ANN001, ANN202
        nonlocal lines
        if event == "line":
            lines += 1
        return tracer

    sys.settrace(tracer)
    try:
        choice = sampler._choose_listed(index, 256, None)
        weights = sampler.weights_of(choice)
    finally:
        sys.settrace(None)
    assert weights is not None
    assert len(choice.keys) == 256 and len(weights) == 256
    assert lines < 200, f"{lines} Python lines ran for one batch"


def test_the_distribution_is_built_once_per_change_of_the_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from expstore.samplers import flat

    built = []

    class Counted(flat.BlockedCdf):
        def __init__(self, cdf: np.ndarray) -> None:
            built.append(len(cdf))
            super().__init__(cdf)

    monkeypatch.setattr(flat, "BlockedCdf", Counted)
    index = make_index(100, priority=np.ones(100))
    sampler = PrioritizedSampler(seed=0)
    sampler.sample_keys(index, 8, sampler.rng)
    sampler.sample_keys(index, 8, sampler.rng)
    assert built == [100]
    changed = make_index(100, priority=np.ones(100))
    sampler.sample_keys(changed, 8, sampler.rng)
    assert built == [100, 100]


def test_priorities_persist_and_every_process_sees_them(db_url: str, buffer_name: str) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        rows = make_rows(10)
        buffer.store_batch(rows)
        assert buffer.update_priorities([rows[3].id], [1e9]) == 1
        assert buffer.update_priorities([r.id for r in rows[:3]], [0.0, 0.0, 0.0]) == 3
    with ReplayBuffer(db_url, name=buffer_name) as reopened:  # a restart
        sampler = PrioritizedSampler(alpha=1.0, eps=0.0, seed=0)
        ids = [r.id for r in sampler.sample(reopened.storage, 50)]
        # Unset rows count as the maximum (1e9) too, so rows[3] and rows[4:] share the draws.
        assert rows[3].id in ids
        assert not {r.id for r in rows[:3]} & set(ids)


def test_new_rows_get_the_current_maximum_priority(buffer: ReplayBuffer) -> None:
    old = make_rows(20)
    buffer.store_batch(old)
    buffer.update_priorities([r.id for r in old], [0.001] * 19 + [50.0])
    new = make_rows(1)
    buffer.store_batch(new)
    sampler = PrioritizedSampler(alpha=1.0, eps=0.0, seed=0)
    ids = [r.id for r in sampler.sample(buffer.storage, 400)]
    # new and old[-1] each carry 50 of the total 100.019
    assert 150 < ids.count(new[0].id) < 250
    assert 150 < ids.count(old[-1].id) < 250


def test_a_row_without_priority_counts_as_the_buffer_maximum_whatever_the_condition(
    buffer: ReplayBuffer,
) -> None:
    """The unset priority does not depend on the query: under a condition that matches only
    low-priority rows, a new row still counts as the buffer's largest priority."""
    old = make_rows(3, agents=3)  # agents agent0, agent1, agent2
    buffer.store_batch(old)
    buffer.update_priorities([r.id for r in old], [9.0, 1.0, 0.5])
    new = make_rows(3, agents=3)[2:]  # one more row of agent2, priority never set
    buffer.store_batch(new)
    sampler = PrioritizedSampler(alpha=1.0, eps=0.0, seed=0)
    agent2 = QueryBuilder().eq("exp_meta.agent_id", "agent2").build()
    rows, info = sampler.sample_with_info(buffer.storage, 950, agent2)
    # 9 against 0.5: the new row takes 9/9.5 of the draws, the old agent2 row the rest.
    assert 850 < sum(r.id == new[0].id for r in rows) < 950
    weights = dict(zip(info["ids"], info["weights"].tolist(), strict=True))
    assert weights[new[0].id] == pytest.approx((9.0 / 0.5) ** -0.4)  # normalised by the max
    # A later update lowers what unset rows count as, in this process and the next.
    buffer.update_priorities([old[0].id], [0.5])
    rows = sampler.sample(buffer.storage, 1000, agent2)
    assert 400 < sum(r.id == new[0].id for r in rows) < 800  # 1.0 against 0.5


def test_weights_and_ids_reach_the_training_loop_all_three_ways(buffer: ReplayBuffer) -> None:
    rows = make_rows(30, tensor=True)
    buffer.store_batch(rows)
    buffer.update_priorities([r.id for r in rows], np.linspace(0.1, 3.0, 30))
    sampler = PrioritizedSampler(seed=4)

    got, info = sampler.sample_with_info(buffer.storage, 16)
    assert info["ids"] == [r.id for r in got] == sampler.last_ids
    assert np.array_equal(info["weights"], sampler.last_weights)
    assert (
        info["weights"].shape == (16,) and 0 < info["weights"].min() <= info["weights"].max() <= 1
    )

    batch = buffer.sample(sampler, None, TensorConverter({"obs": "exp_data.state.obs"}), 16)
    assert isinstance(batch["weights"], torch.Tensor) and batch["weights"].dtype == torch.float32
    assert batch["weights"].shape == (16,) and len(batch["ids"]) == 16
    assert torch.equal(batch["weights"], torch.from_numpy(sampler.last_weights))
    by_id = {r.id: r for r in rows}
    for i, row_id in enumerate(batch["ids"]):  # ids are aligned with the batch
        assert torch.equal(batch["obs"][i], torch.from_numpy(by_id[row_id].exp_data.state["obs"]))

    as_numpy = buffer.sample(sampler, None, NumpyConverter({"i": "exp_data.state.i"}), 8)
    assert as_numpy["weights"].dtype == np.float32 and len(as_numpy["ids"]) == 8
    assert [by_id[i].exp_data.state["i"] for i in as_numpy["ids"]] == as_numpy["i"].tolist()


def test_the_training_loop_updates_priorities_from_the_batch(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(40, tasks=2))
    cond = QueryBuilder().eq("exp_meta.task_id", "task1").build()
    sampler = PrioritizedSampler(alpha=1.0, seed=0)
    conv = TensorConverter({"r": "exp_data.reward_t"})
    for _ in range(3):
        batch = buffer.sample(sampler, cond, conv, 8)
        buffer.update_priorities(batch["ids"], np.zeros(len(batch["ids"])))
    index = buffer.storage.key_index(cond, ("priority",))
    assert (index["priority"] == 0).any()


def test_a_name_clash_between_fields_and_sampler_extras_is_an_error(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(5))
    conv = NumpyConverter({"weights": "exp_data.reward_t"})
    with pytest.raises(ValueError, match=r"adds \['weights'\].*rename"):
        buffer.sample(PrioritizedSampler(seed=0), None, conv, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"alpha": -1}, "alpha"), ({"beta": float("nan")}, "beta"), ({"eps": "0"}, "eps")],
)
def test_parameters_are_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrioritizedSampler(**kwargs)  # type: ignore[arg-type]


def test_all_zero_priorities_with_zero_eps_raise_a_clear_error(buffer: ReplayBuffer) -> None:
    rows = make_rows(3)
    buffer.store_batch(rows)
    buffer.update_priorities([r.id for r in rows], [0, 0, 0])
    from expstore import EmptyBufferError

    with pytest.raises(EmptyBufferError, match="priority 0"):
        PrioritizedSampler(eps=0.0).sample(buffer.storage, 2)


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 1000, 4097])
def test_blocked_cdf_search_equals_searchsorted(n: int) -> None:
    from expstore.samplers.flat import BlockedCdf as _BlockedCdf

    rng = np.random.default_rng(n)
    weights = rng.random(n)
    weights[rng.random(n) < 0.3] = 0.0  # runs of equal cumulative values
    cdf = np.cumsum(weights) + 1e-9
    blocked = _BlockedCdf(cdf)
    targets = np.concatenate([rng.random(500) * cdf[-1], cdf[: min(n, 50)], [0.0, cdf[-1]]])
    expected = np.minimum(np.searchsorted(cdf, targets, side="right"), n - 1)
    assert np.array_equal(blocked.search(targets), expected)


# Over the key index (flat = False), the arrays a sampler derives from it after leaving out
# stale or spent rows follow priority updates and rows spent elsewhere (found by review:
# the weights and odds kept the priorities from before an update, and the normaliser
# could be a row another process had spent).


def _keyed(
    buffer: ReplayBuffer, n: int, version: int | None = None
) -> tuple[list[str], np.ndarray]:
    rows = make_rows(n)
    for row in rows:
        row.exp_meta.policy_version = version
    buffer.store_batch(rows)
    ids = [r.id for r in buffer.query()]
    return ids, buffer.storage.key_index(None, ())["key"]


def test_over_the_key_index_fresh_rows_follow_priority_updates(buffer: ReplayBuffer) -> None:
    ids, keys = _keyed(buffer, 4, version=0)
    buffer.set_policy_version(0)
    buffer.update_priorities(ids, [1.0] * 4)
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=0, max_staleness=0)
    sampler.flat = False
    sampler.sample(buffer.storage, 8)
    np.testing.assert_allclose(sampler.last_weights, 1.0)
    buffer.update_priorities([ids[0]], [0.1])
    sampler.sample(buffer.storage, 64)
    at = np.searchsorted(keys, sampler.last_keys)
    np.testing.assert_allclose(sampler.last_weights, np.where(at == 0, 1.0, 0.1), rtol=1e-6)
    assert (at == 0).sum() < 16  # odds 1 in 31


def test_over_the_key_index_unspent_rows_follow_priority_updates(buffer: ReplayBuffer) -> None:
    ids, keys = _keyed(buffer, 6)
    buffer.update_priorities(ids, [1.0] * 6)
    buffer.storage.count_draws(keys[:2], 1)  # spent before the sampler starts
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=0, consume_after=1)
    sampler.flat = False
    sampler.sample(buffer.storage, 1)
    buffer.update_priorities(ids[3:], [0.1] * 3)
    sampler.sample(buffer.storage, 3)
    at = np.searchsorted(keys, sampler.last_keys)
    assert (at >= 2).all()
    np.testing.assert_allclose(sampler.last_weights, np.where(at >= 3, 1.0, 0.1), rtol=1e-6)


def test_over_the_key_index_the_normaliser_is_an_unspent_rows(buffer: ReplayBuffer) -> None:
    ids, keys = _keyed(buffer, 4)
    buffer.update_priorities(ids, [0.01, 1.0, 1.0, 1.0])
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=1, consume_after=5)
    sampler.flat = False
    sampler.sample(buffer.storage, 1)
    for _ in range(5):  # another process spends the least likely row
        buffer.storage.count_draws(keys[:1], 5)
    sampler.sample(buffer.storage, 2)
    assert not np.isin(sampler.last_keys, keys[:1]).any()
    np.testing.assert_allclose(sampler.last_weights, 1.0)


def test_over_the_key_index_rows_spent_elsewhere_are_left_out_at_once(
    buffer: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The least likely rows spent by others (as learners that lower what they drew spend
    them) are all left out before one draw, in a round or two, not one round per row
    (found by review: 6,400 rounds and 17 s for one draw)."""
    ids, keys = _keyed(buffer, 300)
    buffer.update_priorities(ids, [0.01 * (i + 1) for i in range(300)])
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, seed=2, consume_after=1)
    sampler.flat = False
    sampler.sample(buffer.storage, 1)
    buffer.storage.count_draws(keys[:200], 1)  # the 200 least likely, spent elsewhere
    reads: list[bool] = []
    spent_keys = type(buffer.storage).spent_keys

    def counted(storage, limit, among=None):  # noqa: ANN001, ANN202
        reads.append(among is not None)
        return spent_keys(storage, limit, among)

    monkeypatch.setattr(type(buffer.storage), "spent_keys", counted)
    sampler.sample(buffer.storage, 4)
    assert len(reads) <= 4
    at = np.searchsorted(keys, sampler.last_keys)
    assert (at >= 200).all()
    np.testing.assert_allclose(sampler.last_weights, 2.01 / ((at + 1) * 0.01), rtol=1e-5)
