"""ExpstoreTrajectoryStorage under a real AWorld 0.3.2 agent run: an ``Agent`` whose model is a
fake OpenAI server on 127.0.0.1 (a tool call, then the answer), run by ``Runners`` with
``TaskConfig(trajectory_storage=ExpstoreTrajectoryStorage)``; a new process reads the
trajectory back through the storage and through ``expstore.ReplayBuffer``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.aworld.helpers import ANSWER, FakeOpenAI, require_aworld

require_aworld()

from aworld.agents.llm_agent import Agent  # noqa: E402
from aworld.config.conf import AgentConfig, TaskConfig  # noqa: E402
from aworld.core.storage.data import Data  # noqa: E402
from aworld.core.task import Task  # noqa: E402
from aworld.core.tool.func_to_tool import be_tool  # noqa: E402
from aworld.dataset.trajectory_storage import get_storage_instance  # noqa: E402
from aworld.dataset.types import (  # noqa: E402
    ExpMeta,
    TrajectoryAction,
    TrajectoryItem,
    TrajectoryReward,
    TrajectoryState,
)
from aworld.runner import Runners  # noqa: E402

from expstore import ReplayBuffer  # noqa: E402
from expstore.errors import StorageError  # noqa: E402
from expstore.integrations.aworld import ExpstoreTrajectoryStorage  # noqa: E402
from expstore.integrations.aworld.trajectory import DEFAULT_URL, ENV_BUFFER, ENV_URL  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


# AWorld runs a function tool's memory write in a thread of its own when the tool is
# synchronous, which races the agent's next turn (0.3.2 then fails the task with
# "tool_calls mismatch"); an async tool's write is awaited.
@be_tool(tool_name="expstore_test_calc", tool_desc="square a number")
async def square(x: str) -> str:
    """The square of ``x``."""
    return str(int(x) ** 2)


@pytest.fixture
def trajectories(db_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The database and buffer ExpstoreTrajectoryStorage() opens, by the environment."""
    monkeypatch.setenv(ENV_URL, db_url)
    monkeypatch.setenv(ENV_BUFFER, buffer_name)
    return db_url, buffer_name


def _task(server: FakeOpenAI) -> Task:
    agent = Agent(
        name="solver",
        conf=AgentConfig(
            llm_provider="openai",
            llm_model_name="fake",
            llm_base_url=server.base_url,
            llm_api_key="not-used",
        ),
        tool_names=["expstore_test_calc"],
    )
    return Task(
        input="What is 3 squared?",
        agent=agent,
        conf=TaskConfig(trajectory_storage=ExpstoreTrajectoryStorage),
    )


_READER = textwrap.dedent(
    """
    import asyncio, json, sys
    from expstore import ReplayBuffer
    from expstore.integrations.aworld import ExpstoreTrajectoryStorage

    url, name, tasks = sys.argv[1], sys.argv[2], sys.argv[3:]
    storage = ExpstoreTrajectoryStorage()
    out = {"items": {}, "rows": {}}
    for task in tasks:
        items = asyncio.run(storage.get_data_items(f"trajectory_{task}"))
        out["items"][task] = [[type(i).__name__, type(i.value).__name__,
                               i.value.model_dump(mode="json")] for i in items]
    with ReplayBuffer(url, name=name) as buffer:
        for task in tasks:
            out["rows"][task] = [
                {"task_id": r.exp_meta.task_id, "agent_id": r.exp_meta.agent_id,
                 "step": r.exp_meta.step, "messages": r.exp_data.messages,
                 "actions": r.exp_data.actions, "done": r.exp_data.done,
                 "reward_t": r.exp_data.reward_t,
                 "session_id": r.exp_data.ext_info["aworld"]["session_id"]}
                for r in buffer.get_by_task_id(task)]
    print("RESULT " + json.dumps(out))
    """
)


def _read_in_a_new_process(url: str, name: str, tasks: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _READER, url, name, *tasks],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def test_an_agent_run_keeps_every_step_and_a_new_process_reads_it_back(
    trajectories: tuple[str, str],
) -> None:
    url, name = trajectories
    with FakeOpenAI() as server:
        first, second = _task(server), _task(server)
        by_sync = Runners.sync_run_task(first)[first.id]
        by_async = asyncio.run(Runners.run_task(second))[second.id]
    responses = {first.id: by_sync, second.id: by_async}
    for response in responses.values():
        assert response.success and response.answer == ANSWER
        assert len(response.trajectory) == 2  # the tool call, then the answer
    read = _read_in_a_new_process(url, name, list(responses))
    for task, response in responses.items():
        expected = [TrajectoryItem.model_validate(step) for step in response.trajectory]
        items = read["items"][task]
        assert [(kind, value) for kind, value, _ in items] == [("Data", "TrajectoryItem")] * 2
        assert [TrajectoryItem.model_validate(dumped) for *_, dumped in items] == expected
        rows = read["rows"][task]
        assert [r["task_id"] for r in rows] == [task, task]
        assert [r["step"] for r in rows] == [s.meta.step for s in expected]
        assert len({r["agent_id"] for r in rows}) == 1 and rows[0]["agent_id"].startswith("solver")
        assert rows[0]["actions"][0]["function"]["name"] == "expstore_test_calc"
        assert [r["done"] for r in rows] == [False, True]  # each step's last version
        assert rows[0]["messages"] == expected[0].state.messages
        assert {r["session_id"] for r in rows} == {expected[0].meta.session_id}


def _item(task: str = "t1", **meta: Any) -> TrajectoryItem:
    return TrajectoryItem(
        id="step-1",
        meta=ExpMeta(
            session_id="s1",
            task_id=task,
            task_name="math",
            agent_id="solver",
            step=3,
            execute_time=1000.5,
            pre_agent="planner",
            **meta,
        ),
        state=TrajectoryState(
            input={"content": "What is 3 squared?", "images": None},
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 3 squared?"},
            ],
            context={"k": [1, 2]},
        ),
        action=TrajectoryAction(
            content="",
            tool_calls=[
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"x": "3"}'},
                }
            ],
            is_agent_finished=False,
            ext_info={"latency_ms": 12},
        ),
        reward=TrajectoryReward(
            tool_outputs=[{"tool_call_id": "c1", "content": "9"}], status="ok", score=0.75
        ),
    )


def test_a_trajectory_item_is_an_ordinary_row_field_by_field(trajectories: tuple[str, str]) -> None:
    url, name = trajectories
    item = _item()
    storage = ExpstoreTrajectoryStorage()
    asyncio.run(storage.create_data(Data(id=item.id, value=item, block_id="trajectory_t1")))
    with ReplayBuffer(url, name=name) as buffer:
        (row,) = buffer.get_by_task_id("t1")
    meta, data = row.exp_meta, row.exp_data
    assert (
        meta.task_id,
        meta.task_name,
        meta.agent_id,
        meta.step,
        meta.execute_time,
        meta.pre_agent,
    ) == ("t1", "math", "solver", 3, 1000.5, "planner")
    assert data.messages == item.state.messages
    assert data.state == {"input": item.state.input, "context": item.state.context}
    assert data.actions == item.action.tool_calls and data.done is False
    assert data.reward_t == 0.75
    stored = data.ext_info["aworld"]
    assert (stored["session_id"], stored["item_id"], stored["content"], stored["status"]) == (
        "s1",
        "step-1",
        "",
        "ok",
    )
    assert stored["tool_outputs"] == item.reward.tool_outputs
    assert stored["action_ext_info"] == {"latency_ms": 12}


def test_a_step_comes_back_equal_with_its_none_fields(trajectories: tuple[str, str]) -> None:
    item = _item()
    item.meta.agent_id = item.meta.task_name = item.meta.step = item.meta.execute_time = None
    item.reward.score = None
    odd_block = _item(task="not-the-block")

    async def round_trip() -> list[Any]:
        storage = ExpstoreTrajectoryStorage()
        await storage.create_data(Data(id=item.id, value=item), "trajectory_t1")
        await storage.create_data(Data(id="x", value=odd_block), "trajectory_t1")
        return await ExpstoreTrajectoryStorage().get_data_items("trajectory_t1")

    back = [d.value for d in asyncio.run(round_trip())]
    assert back == [item, odd_block]


def test_conditions_name_trajectory_fields_with_dots(trajectories: tuple[str, str]) -> None:
    async def select() -> list[str]:
        storage = ExpstoreTrajectoryStorage()
        for i in range(4):
            step = _item(task=f"t{i % 2}")
            step.id, step.meta.step, step.reward.score = f"s{i}", i, i / 4
            await storage.create_data(Data(id=step.id, value=step), f"trajectory_t{i % 2}")
        hits = await storage.select_data(
            {
                "and_": [
                    {"field": "meta.task_id", "value": "t1", "op": "eq"},
                    {"field": "reward.score", "value": 0.5, "op": "gt"},
                    {"field": "meta.session_id", "value": ["s1"], "op": "in"},
                    {"field": "state.input.content", "value": "squared", "op": "like"},
                ]
            }
        )
        return [d.id for d in hits]

    assert asyncio.run(select()) == ["s3"]


def test_an_overwrite_replaces_the_step(trajectories: tuple[str, str]) -> None:
    url, name = trajectories
    first, last = _item(), _item()
    last.action.is_agent_finished, last.action.content = True, ANSWER

    async def write() -> list[Any]:
        storage = ExpstoreTrajectoryStorage()
        for version in (first, last):
            await storage.create_datas([Data(id=version.id, value=version)], "trajectory_t1")
        return await storage.get_data_items("trajectory_t1")

    (kept,) = asyncio.run(write())
    assert kept.value == last
    with ReplayBuffer(url, name=name) as buffer:
        assert len(buffer) == 1  # one row: the last version


def test_a_write_whose_task_is_cancelled_at_once_is_stored(trajectories: tuple[str, str]) -> None:
    """AWorld writes each step in a task nothing awaits; sync_run_task's loop cancels what
    is pending when it ends. The write is done before the coroutine first yields."""
    item = _item()

    async def abandon() -> None:
        storage = ExpstoreTrajectoryStorage()
        task = asyncio.create_task(
            storage.create_datas([Data(id=item.id, value=item)], "trajectory_t1")
        )
        await asyncio.sleep(0)  # the task starts...
        task.cancel()  # ...and is cancelled at its first yield

    asyncio.run(abandon())
    got = asyncio.run(ExpstoreTrajectoryStorage().get_data_items("trajectory_t1"))
    assert [d.value for d in got] == [item]


def test_with_no_environment_the_database_is_the_documented_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv(ENV_BUFFER, raising=False)
    monkeypatch.chdir(tmp_path)
    storage = get_storage_instance(ExpstoreTrajectoryStorage)  # as AWorld's runner makes it
    assert type(storage) is ExpstoreTrajectoryStorage
    asyncio.run(storage.create_data(Data(id="s", value=_item()), "trajectory_t1"))
    assert DEFAULT_URL == "sqlite:///expstore_aworld.db"
    with ReplayBuffer(
        f"sqlite:///{tmp_path / 'expstore_aworld.db'}", name="aworld_trajectories"
    ) as buffer:
        assert buffer.task_ids() == ["t1"]


def test_a_database_that_cannot_be_opened_is_logged_and_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"
    monkeypatch.setenv(ENV_URL, url)
    with caplog.at_level(logging.ERROR, logger="expstore.integrations.aworld"):
        with pytest.raises(StorageError, match="cannot open buffer 'aworld_trajectories'") as err:
            get_storage_instance(ExpstoreTrajectoryStorage)  # not swapped for in-memory
    assert not isinstance(err.value, (TypeError, ValueError))
    assert f"set {ENV_URL}" in str(err.value)
    assert any(
        "cannot open" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records
    )


def test_expstore_imports_without_aworld_and_the_integration_says_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["aworld"] = None  # as if AWorld were not installed
        import expstore
        from expstore import *
        try:
            import expstore.integrations.aworld
        except expstore.MissingDependencyError as exc:
            print("MISSING", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "MISSING" in done.stdout and "pip install 'expstore[aworld]'" in done.stdout
