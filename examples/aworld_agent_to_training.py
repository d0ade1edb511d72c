"""An AWorld agent's runs recorded into expstore, then read by learners: SFT records drawn
from the trajectories, and whole trajectories claimed in groups for an RL step.

The agent is an AWorld 0.3.2 ``Agent`` with one tool (``square``), whose model is a fake
OpenAI-compatible server this script starts on 127.0.0.1 (it calls the tool, then answers,
and gets one answer in three wrong), so it runs offline. Each task is run by AWorld's
``Runners`` with ``TaskConfig(trajectory_storage=ExpstoreTrajectoryStorage)``: every step
AWorld records becomes an expstore row (task, agent, step, chat messages, tool calls as
actions; see expstore.integrations.aworld.rows), in the database ``$EXPSTORE_URL`` names.

    pip install 'expstore[aworld]'
    python examples/aworld_agent_to_training.py              # a SQLite file in a temp dir
    EXPSTORE_URL=postgresql+psycopg://postgres@127.0.0.1/postgres \
        python examples/aworld_agent_to_training.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# AWorld writes log files under ./logs unless told where (read when it is imported).
LOGS = os.path.join(tempfile.gettempdir(), "expstore-aworld-logs")
os.environ.setdefault("AWORLD_LOG_PATH", LOGS)

from aworld.agents.llm_agent import Agent  # noqa: E402
from aworld.config.conf import AgentConfig, TaskConfig  # noqa: E402
from aworld.core.task import Task  # noqa: E402
from aworld.core.tool.func_to_tool import be_tool  # noqa: E402
from aworld.runner import Runners  # noqa: E402

from expstore import GroupSampler, QueryBuilder, ReplayBuffer  # noqa: E402
from expstore.integrations.aworld import ExpstoreTrajectoryStorage  # noqa: E402


# -- a fake OpenAI-compatible model ---------------------------------------------------------
class FakeModel(BaseHTTPRequestHandler):
    """Chat completions: a call of the offered tool with the question's number, then (once
    the tool answered) the answer, wrong for one question in three."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        messages, tools = body["messages"], body.get("tools") or []
        question = next(m["content"] for m in messages if m["role"] == "user")
        number = int(question.split()[2])
        if tools and not any(m["role"] == "tool" for m in messages):
            call = {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {
                    "name": tools[0]["function"]["name"],
                    "arguments": json.dumps({"x": str(number)}),
                },
            }
            message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
        else:
            answer = number**2 + (1 if number % 3 == 0 else 0)  # a slip, now and then
            message = {"role": "assistant", "content": f"The answer is {answer}."}
        reply = json.dumps(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def start_model() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- the actor: AWorld runs the agent, expstore keeps every step ---------------------------
# (AWorld copies a tool function's source into a module of its own: it must be defined at
# the top level. Async, because AWorld awaits the memory write of an async tool's result.)
@be_tool(tool_name="square", tool_desc="square a whole number")
async def square(x: str) -> str:
    """The square of x."""
    return str(int(x) ** 2)


def run_agent(model_url: str, numbers: list[int]) -> list[str]:
    """Run one AWorld task per number; returns the task ids."""
    agent = Agent(
        name="math_agent",
        conf=AgentConfig(
            llm_provider="openai",
            llm_model_name="fake-model",
            llm_base_url=model_url,
            llm_api_key="not-used",
        ),
        tool_names=["square"],
    )
    tasks = [
        Task(
            input=f"What is {n} squared?",
            agent=agent,
            conf=TaskConfig(trajectory_storage=ExpstoreTrajectoryStorage),
        )
        for n in numbers
    ]

    async def run_all() -> None:
        for task in tasks:
            response = (await Runners.run_task(task))[task.id]
            print(f"task {task.id[:8]}: {response.answer!r}, {len(response.trajectory)} steps")

    asyncio.run(run_all())
    return [task.id for task in tasks]


# -- the learners ---------------------------------------------------------------------------
def chat_record(steps: list[Any]) -> dict[str, Any]:
    """An SFT record of one trajectory: the question, the tool call, the tool's answer and
    the agent's final answer, as OpenAI chat messages."""
    first, last = steps[0], steps[-1]
    tool_output = last.exp_data.state["input"]["content"]  # what the next step observed
    question = next(m for m in first.exp_data.messages if m["role"] == "user")
    call = first.exp_data.actions[0]
    return {
        "messages": [
            {"role": "user", "content": question["content"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": tool_output},
            {"role": "assistant", "content": last.exp_data.ext_info["aworld"]["content"]},
        ]
    }


def reward(steps: list[Any]) -> float:
    """1 for the right answer, else 0 (the number is in the question)."""
    question = next(m for m in steps[0].exp_data.messages if m["role"] == "user")["content"]
    number = int(question.split()[2])
    answer = steps[-1].exp_data.ext_info["aworld"]["content"]  # the final action's text
    return float(answer == f"The answer is {number**2}.")


def learn(url: str, name: str) -> None:
    with ReplayBuffer(url, name=name) as buffer:
        tasks = buffer.task_ids()
        print(f"expstore holds {len(buffer)} steps of {len(tasks)} AWorld tasks")

        # SFT: trajectories whose final answer is right, as chat records (a JSONL file).
        finished = QueryBuilder().eq("done", True).build()
        records = []
        for row in buffer.query(finished):
            steps = buffer.get_by_task_id(row.exp_meta.task_id)
            if reward(steps) == 1.0:
                records.append(chat_record(steps))
        print(f"SFT: {len(records)} records of right answers, e.g.")
        print("  " + json.dumps(records[0])[:300] + " ...")

        # RL: whole trajectories (2 steps each) claimed in groups, each claimed once.
        order = GroupSampler(group_by="task_id", group_size=2)
        while True:
            claim = buffer.claim(4, consumer="rl-learner", order=order)
            rows = claim.batch  # the claimed rows, whole groups one after the other
            if not rows:
                break
            groups = [rows[i : i + 2] for i in range(0, len(rows), 2)]
            rewards = [reward(group) for group in groups]
            mean = sum(rewards) / len(rewards)
            print(
                f"RL step: {len(groups)} trajectories, rewards {rewards}, "
                f"advantages {[round(r - mean, 2) for r in rewards]}"
            )
            claim.ack()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=6, help="how many tasks the agent runs")
    parser.add_argument("--workdir", help="where the SQLite file goes (default: a temp dir)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="expstore-aworld-"))
    os.environ.setdefault("EXPSTORE_URL", f"sqlite:///{workdir / 'trajectories.db'}")
    name = os.environ.setdefault("EXPSTORE_BUFFER", f"aworld_{uuid.uuid4().hex[:8]}")
    server = start_model()
    model_url = f"http://127.0.0.1:{server.server_port}/v1"
    started = time.perf_counter()
    run_agent(model_url, list(range(2, 2 + args.tasks)))
    print(f"the agent ran {args.tasks} tasks in {time.perf_counter() - started:.1f} s")
    server.shutdown()
    learn(os.environ["EXPSTORE_URL"], name)


if __name__ == "__main__":
    main()
