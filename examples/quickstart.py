"""Quickstart: AWorld's replay-buffer API on expstore.

Rows are DataRow = ExpMeta (task, agent, step) + Experience (state, actions, reward...).
Store them, query them with QueryBuilder by task and by agent, and sample with your own
Sampler and Converter, exactly as AWorld's README does.

    python examples/quickstart.py                      # an in-memory buffer
    python examples/quickstart.py --db sqlite:///quickstart.db
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from typing import Any

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.converters import Converter
from expstore.query import QueryBuilder
from expstore.samplers import Sampler, TaskSampler
from expstore.storage import Storage


class LastStepsSampler(Sampler):
    """A custom Sampler: the final step of random matching tasks (AWorld's interface)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def sample(
        self, storage: Storage, batch_size: int, query_condition: Any = None
    ) -> list[DataRow]:
        task_ids = storage.task_ids(query_condition)
        chosen = self.rng.sample(task_ids, min(batch_size, len(task_ids)))
        return [storage.get_by_task_id(task_id)[-1] for task_id in chosen]


class FirstTasksSampler(TaskSampler):
    """A custom TaskSampler: the first tasks stored (whole trajectories)."""

    def sample_task_ids(
        self, storage: Storage, batch_size: int, query_condition: Any = None
    ) -> list[str]:
        return storage.task_ids(query_condition)[:batch_size]


class PromptActionConverter(Converter):
    """A custom Converter: rows become {"prompt", "action", "reward"} dicts."""

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[dict[str, Any]]:
        return [
            {
                "prompt": row.exp_data.state["page"],
                "action": row.exp_data.actions[0],
                "reward": row.exp_data.reward_t,
            }
            for row in rows
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="database URL (default: in memory)")
    args = parser.parse_args()

    buffer = ReplayBuffer(args.db, name="quickstart")
    buffer.clear()

    # Writing: one DataRow per step, as in AWorld.
    for t in range(3):
        for agent in ("agent_1", "agent_2"):
            rows = [
                DataRow(
                    exp_meta=ExpMeta(
                        task_id=f"task_{t}_{agent}",
                        task_name="my_task",
                        agent_id=agent,
                        step=step,
                        execute_time=time.time(),
                    ),
                    exp_data=Experience(
                        state={"page": f"page {step} of task {t}"},
                        actions=[f"click #{step}"],  # AWorld's action="..." works too
                        reward_t=1.0 if step == 2 else 0.0,
                        done=step == 2,
                    ),
                )
                for step in range(3)
            ]
            buffer.store_batch(rows)  # or buffer.store(row) one at a time
    print(f"stored {len(buffer)} rows in {len(buffer.task_ids())} tasks")

    # Reading: QueryBuilder by task name, by task id, by agent.
    query = QueryBuilder().eq("exp_meta.task_name", "my_task").build()
    print(f"{buffer.count(query)} rows where {query}")

    by_task = QueryBuilder().eq("exp_meta.task_id", "task_1_agent_1").build()
    steps = buffer.get_by_task_id("task_1_agent_1")
    print(f"task_1_agent_1: {buffer.count(by_task)} rows, steps {[r.exp_meta.step for r in steps]}")

    by_agent = (
        QueryBuilder()
        .eq("exp_meta.agent_id", "agent_2")
        .and_()
        .nested(
            QueryBuilder()
            .gte("exp_meta.step", 2)
            .or_()
            .eq("exp_data.state.page", "page 0 of task 0")
        )
        .build()
    )
    print(f"{buffer.count(by_agent)} rows where {by_agent}")

    # Sampling with a custom Sampler and Converter.
    batch = buffer.sample(
        sampler=LastStepsSampler(seed=0),
        query_condition=query,
        converter=PromptActionConverter(),
        batch_size=2,
    )
    print("sample:", batch)

    # Whole tasks: the default RandomTaskSampler, then a custom TaskSampler.
    tasks = buffer.sample_task(query_condition=by_agent, batch_size=2)
    print("sample_task:", [[r.exp_meta.step for r in rows] for rows in tasks])
    firsts = buffer.sample_task(
        FirstTasksSampler(), query, converter=PromptActionConverter(), batch_size=1
    )
    print("first task as prompts:", [item["prompt"] for item in firsts[0]])
    buffer.close()


if __name__ == "__main__":
    main()
