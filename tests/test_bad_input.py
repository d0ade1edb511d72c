"""The bad-input catalogue: every public entry point given wrong types, out-of-range
numbers and hostile strings raises a typed ExpstoreError (or pydantic's ValidationError
for model fields) with a message, and nothing stored changes, on both backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from expstore import (
    ChatConverter,
    Condition,
    Experience,
    ExpMeta,
    ExpstoreError,
    GroupAdvantageConverter,
    GroupSampler,
    ImageConverter,
    NumpyConverter,
    PrioritizedSampler,
    QueryBuilder,
    RandomTaskSampler,
    RateLimiter,
    RecencySampler,
    ReplayBuffer,
    RewardWeightedSampler,
    SliceSampler,
    StalenessAwareSampler,
    StratifiedSampler,
    TensorConverter,
    TrajectoryConverter,
    UniformSampler,
)
from tests.helpers import make_rows

H = "\ud800"  # a lone surrogate: no database can store it


def catalogue(b: ReplayBuffer) -> dict[str, Callable[[], Any]]:
    return {
        # buffer methods
        "store None": lambda: b.store(None),
        "store str": lambda: b.store("row"),
        "store_batch dict": lambda: b.store_batch({"a": 1}),
        "store_batch [1]": lambda: b.store_batch([1]),
        "delete None": lambda: b.delete(None),
        "query limit str": lambda: list(b.query(limit="5")),
        "query order_by bad": lambda: list(b.query(order_by="nosuch")),
        "query order_by surrogate": lambda: list(b.query(order_by=H)),
        "sample batch 0": lambda: b.sample(batch_size=0),
        "sample batch float": lambda: b.sample(batch_size=2.5),
        "sample batch str": lambda: b.sample(batch_size="8"),
        "sample converter str": lambda: b.sample(converter="numpy"),
        "sample cond str": lambda: b.sample(UniformSampler(), "task_id = 1"),
        "sample_task batch 0": lambda: b.sample_task(batch_size=0),
        "update_priorities neg": lambda: b.update_priorities(
            [r.id for r in b.query(limit=1)], [-1.0]
        ),
        "update_priorities len": lambda: b.update_priorities(["a", "b"], [1.0]),
        "update_priorities 2d": lambda: b.update_priorities(["a"], np.ones((2, 2))),
        "set_retention 0": lambda: b.set_retention(0),
        "set_retention bad ev": lambda: b.set_retention(5, "lifo"),
        "set_retention str": lambda: b.set_retention("5"),
        "claim consumer ''": lambda: b.claim(1, consumer=""),
        "claim lease neg": lambda: b.claim(1, consumer="c", lease_s=-1),
        "claim lease nan": lambda: b.claim(1, consumer="c", lease_s=float("nan")),
        "claim order bad": lambda: b.claim(1, consumer="c", order="lifo"),
        "claim wait neg": lambda: b.claim(1, consumer="c", wait_s=-1),
        "wait_for 0": lambda: b.wait_for(0),
        "wait_for timeout str": lambda: b.wait_for(1, timeout_s="x"),
        "checkpoint 5": lambda: b.checkpoint(5),
        "consumer ''": lambda: b.consumer(""),
        "consumer 5": lambda: b.consumer(5),
        "consumer takeover str": lambda: b.consumer("c", takeover="yes"),
        "consumer claim 0": lambda: b.consumer("c").claim(0),
        "step checkpoint object": lambda: b.consumer("c").step().save_checkpoint(object()),
        "step version -1": lambda: b.consumer("c").step().set_policy_version(-1),
        "step version str": lambda: b.consumer("c").step().set_policy_version("3"),
        "step priorities str": lambda: b.consumer("c").step().update_priorities("a", [1.0]),
        "step ack str": lambda: b.consumer("c").step().ack("claim"),
        "lineage str": lambda: b.lineage("abc"),
        "lineage [5]": lambda: b.lineage([5]),
        "queue_stats str": lambda: b.queue_stats("x"),
        "get_batch str": lambda: b.get_batch_by_task_ids("task0"),
        "task_ids bad": lambda: b.task_ids({"field": "x"}),
        "set_policy_version -1": lambda: b.set_policy_version(-1),
        "set_rate_limiter bad": lambda: b.set_rate_limiter(RateLimiter(min_size=-1)),
        "ReplayBuffer url int": lambda: ReplayBuffer(5),
        "ReplayBuffer url bad": lambda: ReplayBuffer("mysql://x"),
        "ReplayBuffer name ''": lambda: ReplayBuffer(name=""),
        "ReplayBuffer capacity -1": lambda: ReplayBuffer(capacity=-1),
        # samplers
        "Uniform seed str": lambda: UniformSampler(seed="x"),
        "Uniform unknown opt": lambda: UniformSampler(bogus=1),
        "Prioritized alpha neg": lambda: PrioritizedSampler(alpha=-1),
        "Prioritized beta str": lambda: PrioritizedSampler(beta="x"),
        "Recency power nan": lambda: RecencySampler(power=float("nan")),
        "Reward temp 0": lambda: RewardWeightedSampler(temperature=0),
        "Stratified by bad": lambda: StratifiedSampler(by="nosuch"),
        "Slice len 0": lambda: SliceSampler(0),
        "Slice traj int": lambda: SliceSampler(2, traj_key=5),
        "Group size 0": lambda: GroupSampler(group_size=0),
        "Staleness power neg": lambda: StalenessAwareSampler(power=-1),
        "RandomTask seed str": lambda: RandomTaskSampler(seed="x"),
        # converters
        "Numpy fields empty": lambda: NumpyConverter({}),
        "Numpy fields list": lambda: NumpyConverter(["a"]),
        "Numpy path bad": lambda: NumpyConverter({"a": "nosuch.path"}),
        "Numpy path surrogate": lambda: NumpyConverter({"a": "exp_data.state." + H}),
        "Tensor fields empty": lambda: TensorConverter({}),
        "Trajectory bad": lambda: TrajectoryConverter(5),
        "Chat bad": lambda: ChatConverter(5),
        "GroupAdv scale": lambda: GroupAdvantageConverter(scale="max"),
        "GroupAdv eps neg": lambda: GroupAdvantageConverter(eps=-1),
        "Image paths int": lambda: ImageConverter(5),
        "Image output bad": lambda: ImageConverter("state.obs", output="chw"),
        "Image path surrogate": lambda: ImageConverter("exp_data.state." + H),
        "Image not an image": lambda: b.sample(converter=ImageConverter("state.obs")),
        # images out
        "to_arrow images int": lambda: b.to_arrow(images=5),
        "to_arrow images column": lambda: b.to_arrow(images=["reward_t"]),
        "to_arrow not an image": lambda: b.to_arrow(images=["exp_data.state.obs"]),
        # query
        "QB eq field int": lambda: QueryBuilder().eq(5, 1),
        "QB eq bad field": lambda: QueryBuilder().eq("nosuch", 1),
        "QB eq value list": lambda: QueryBuilder().eq("step", [1]),
        "QB eq nan": lambda: QueryBuilder().eq("reward_t", float("nan")),
        "QB like int": lambda: QueryBuilder().like("task_id", 5),
        "QB in_ str": lambda: QueryBuilder().in_("task_id", "abc"),
        "QB between order": lambda: QueryBuilder().between("step", 5, "x"),
        "QB nested None": lambda: QueryBuilder().nested(None),
        "QB value surrogate": lambda: QueryBuilder().eq("task_id", H),
        "from_dict list": lambda: Condition.from_dict([1]),
        "from_dict op bad": lambda: Condition.from_dict({"field": "step", "op": "zz", "value": 1}),
        "parse garbage": lambda: Condition.parse("step ==== 1"),
        "parse int": lambda: Condition.parse(5),
        # models
        "ExpMeta step -1": lambda: ExpMeta(task_id="t", agent_id="a", step=-1),
        "ExpMeta task ''": lambda: ExpMeta(task_id="", agent_id="a", step=0),
        "ExpMeta surrogate": lambda: ExpMeta(task_id=H, agent_id="a", step=0),
        "Experience reward inf": lambda: Experience(reward_t=float("inf")),
        "Experience set": lambda: Experience(state={1, 2}),
        "Experience obj": lambda: Experience(state=object()),
    }


NAMES = list(catalogue(ReplayBuffer()))


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_a_typed_error_and_changes_nothing(
    db_url: str, buffer_name: str, name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(10, tensor=True))
        before = sorted(r.id for r in buffer.query())
        with pytest.raises((ExpstoreError, ValidationError)) as info:
            catalogue(buffer)[name]()
        assert str(info.value).strip()
        assert "unexpected" not in str(info.value)
        assert sorted(r.id for r in buffer.query()) == before
