"""StratifiedSampler: an equal share of the batch per group."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from expstore import ReplayBuffer
from expstore.samplers import StratifiedSampler
from tests.helpers import make_row
from tests.samplers.stats import chi_square_p, make_index, positions


def _agents(sizes: dict[str, int]) -> dict[str, np.ndarray]:
    values = [a for a, n in sizes.items() for _ in range(n)]
    order = np.random.default_rng(0).permutation(len(values))
    return make_index(len(values), agent_id=np.array(values, dtype=object)[order])


def test_every_group_gets_an_equal_share_whatever_its_size() -> None:
    index = _agents({"a": 2, "b": 50, "c": 500})
    sampler = StratifiedSampler(by="exp_meta.agent_id", seed=0)
    drawn = positions(index, sampler.sample_keys(index, 30, sampler.rng))
    assert Counter(index["agent_id"][drawn]) == {"a": 10, "b": 10, "c": 10}


def test_the_remainder_goes_to_distinct_random_groups() -> None:
    index = _agents({"a": 5, "b": 5, "c": 5})
    sampler = StratifiedSampler(by="agent_id", seed=1)
    extra: Counter[str] = Counter()
    for _ in range(3000):
        drawn = positions(index, sampler.sample_keys(index, 4, sampler.rng))
        counts = Counter(index["agent_id"][drawn])
        assert sorted(counts.values()) == [1, 1, 2]
        extra[counts.most_common(1)[0][0]] += 1
    assert chi_square_p([extra[g] for g in "abc"], [1, 1, 1]) > 1e-3


def test_within_a_group_rows_are_uniform() -> None:
    index = _agents({"a": 6, "b": 1})
    sampler = StratifiedSampler(by="agent_id", seed=2)
    drawn = positions(index, sampler.sample_keys(index, 12_000, sampler.rng))
    in_a = drawn[index["agent_id"][drawn] == "a"]
    assert len(in_a) == 6000
    counts = np.bincount(in_a, minlength=len(index["key"]))
    counts = counts[np.flatnonzero(index["agent_id"] == "a")]
    assert chi_square_p(counts, np.ones(6)) > 1e-3


def test_groups_by_numbers_with_null_as_one_group() -> None:
    index = make_index(6, reward_t=np.array([1.0, np.nan, 1.0, 2.0, np.nan, 2.0]))
    sampler = StratifiedSampler(by="exp_data.reward_t", seed=0)
    drawn = positions(index, sampler.sample_keys(index, 30, sampler.rng))
    rewards = index["reward_t"][drawn]
    assert (rewards == 1.0).sum() == (rewards == 2.0).sum() == np.isnan(rewards).sum() == 10


def test_by_any_metadata_column_through_storage(buffer: ReplayBuffer) -> None:
    buffer.store_batch(
        [make_row(f"t{i % 3}", step=i, reward=None) for i in range(30)] + [make_row("rare")]
    )
    rows = StratifiedSampler(by="exp_meta.task_id", seed=0).sample(buffer.storage, 40)
    assert Counter(r.exp_meta.task_id for r in rows) == {"t0": 10, "t1": 10, "t2": 10, "rare": 10}


def test_by_a_payload_path_every_json_value_is_a_group(buffer: ReplayBuffer) -> None:
    values: list[object] = ["easy"] * 40 + ["hard"] * 3 + [1] * 2 + [1.0] * 2 + [True] * 2
    values += [[1, 2]] * 2 + [{"a": 1}] * 2 + [None] * 2
    rows = [make_row(f"t{i}", state={"level": v}) for i, v in enumerate(values)]
    rows += [make_row("no-level", state={"other": 1}), make_row("scalar", state=5)]
    buffer.store_batch(rows)
    sampler = StratifiedSampler(by="exp_data.state.level", seed=0)
    got = sampler.sample(buffer.storage, 70)

    def group(row: object) -> str:
        state = row.exp_data.state  # type: ignore[attr-defined]
        value = state.get("level") if isinstance(state, dict) else None
        # 1 and 1.0 are one group; True is another; null and "nothing there" are one
        return "number" if type(value) in (int, float) else repr(value)

    assert Counter(map(group, got)) == {
        "'easy'": 10,
        "'hard'": 10,
        "number": 10,
        "True": 10,
        "[1, 2]": 10,
        "{'a': 1}": 10,
        "None": 10,
    }


def test_a_payload_path_under_a_condition_groups_only_matching_rows(buffer: ReplayBuffer) -> None:
    from expstore import QueryBuilder

    rows = [make_row("a", step=i, state={"env": f"e{i % 2}"}) for i in range(10)]
    rows += [make_row("b", step=i, state={"env": "e9"}) for i in range(10)]
    buffer.store_batch(rows)
    condition = QueryBuilder().eq("exp_meta.task_id", "a").build()
    got = StratifiedSampler(by="exp_data.state.env", seed=3).sample(buffer.storage, 8, condition)
    assert Counter(r.exp_data.state["env"] for r in got) == {"e0": 4, "e1": 4}


@pytest.mark.parametrize(
    ("by", "message"),
    [
        ("exp_meta.colour", r"unknown field 'exp_meta.colour'; the valid fields"),
        ("priority", r"unknown field 'priority'; the valid fields"),
        ("exp_data.state..url", r"empty path segment"),
        ("exp_data.unknown.x", r"unknown field 'exp_data.unknown.x'; the valid fields"),
        (7, r"a field name must be a string"),
    ],
)
def test_a_field_that_cannot_be_grouped_is_refused(by: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StratifiedSampler(by=by)  # type: ignore[arg-type]
