"""AWorld's README example runs on expstore with only the import lines changed."""

from __future__ import annotations

import multiprocessing
import time

from pydantic import BaseModel

# AWorld:  from aworld.replay_buffer import ReplayBuffer, DataRow, ExpMeta, Experience
#          from aworld.replay_buffer.query_filter import QueryBuilder
from expstore import (
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    QueryBuilder,
    RandomTaskSample,
    ReplayBuffer,
)


class Observation(BaseModel):  # stands in for aworld.core.common.Observation
    content: str = "page"


class ActionModel(BaseModel):  # stands in for aworld.core.common.ActionModel
    action_name: str = "click"


def write_processing(replay_buffer: ReplayBuffer, task_id: str) -> None:
    for step in range(5):
        replay_buffer.store(
            DataRow(
                exp_meta=ExpMeta(
                    task_id=task_id, task_name="test_task", agent_id="agent_1", step=step
                ),
                exp_data=Experience(state=Observation(), action=ActionModel()),
            )
        )


def test_the_aworld_readme_example_runs_verbatim(tmp_path) -> None:
    replay_buffer = ReplayBuffer(f"sqlite:///{tmp_path / 'aworld.db'}")
    # Writing Data
    data = DataRow(
        exp_meta=ExpMeta(
            task_id="task_1",
            task_name="my_task",
            agent_id="agent_1",
            step=1,
            execute_time=time.time(),
        ),
        exp_data=Experience(state=Observation(), action=ActionModel()),
    )
    replay_buffer.store(data)

    # Multi-processing: writer processes share the buffer through its database file.
    processes = [
        multiprocessing.get_context("spawn").Process(
            target=write_processing, args=(replay_buffer, f"task_{i + 2}")
        )
        for i in range(4)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * 4

    # Reading Data
    query_condition = QueryBuilder().eq("exp_meta.task_name", "test_task").build()
    data = replay_buffer.sample(
        sampler=RandomTaskSample(),
        query_condition=query_condition,
        converter=DefaultConverter(),
        batch_size=1000,  # more than there are tasks: AWorld crashes here, expstore returns all
    )
    assert len(data) == 20 and {r.exp_meta.task_name for r in data} == {"test_task"}

    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    tasks = replay_buffer.sample_task(query_condition=query, batch_size=10)
    assert len(tasks) == 1 and tasks[0][0].exp_data.state == {"content": "page"}
    assert tasks[0][0].exp_data.actions == [{"action_name": "click"}]

    query = QueryBuilder().eq("exp_meta.agent_id", "agent_1").build()
    assert len(replay_buffer.sample_task(query_condition=query, batch_size=5)) == 5

    # The query builder examples
    QueryBuilder().eq("exp_meta.task_id", "123").build()
    QueryBuilder().eq("exp_meta.task_id", "123").and_().eq("exp_meta.agent_id", "456").build()
    nested = (
        QueryBuilder()
        .eq("exp_meta.task_id", "123")
        .and_()
        .nested(QueryBuilder().eq("exp_meta.agent_id", "111").or_().eq("exp_meta.agent_id", "222"))
        .build()
    )
    assert str(nested) == (
        "exp_meta.task_id = '123' AND (exp_meta.agent_id = '111' OR exp_meta.agent_id = '222')"
    )
