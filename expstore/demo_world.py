"""The demo's world: a tiny grid world, the agent processes that play it into a buffer,
and the policies the demo trains (see :mod:`expstore.demo`)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffer import ReplayBuffer
from .errors import ExpstoreError
from .model.rows import DataRow, Experience, ExpMeta

__all__ = ["ACTIONS", "GRID", "AgentSpec", "play_episode", "run_agents"]

#: The grid world: GRID x GRID cells; each episode has its own start and goal.
GRID = 5
ACTIONS = ("up", "down", "left", "right")
_MOVES = ((0, 1), (0, -1), (-1, 0), (1, 0))
MAX_STEPS = 12
GAMMA = 0.9
#: How long the simulated environment takes per step, so agents write while others do.
STEP_SECONDS = 0.002
BUFFER = "demo"


@dataclass(frozen=True)
class AgentSpec:
    """One agent process: its name, how often it acts at random, how many episodes."""

    agent_id: str
    epsilon: float
    episodes: int
    seed: int
    url: str


def observe(pos: tuple[int, int], goal: tuple[int, int]) -> np.ndarray:
    """The observation: agent and goal coordinates scaled to [0, 1], float32[4]."""
    return np.array([*pos, *goal], dtype=np.float32) / (GRID - 1)


def greedy_action(pos: tuple[int, int], goal: tuple[int, int], rng: np.random.Generator) -> int:
    """A move that brings the agent closer to the goal (at random among those that do)."""
    good = [
        a
        for a, (dx, dy) in enumerate(_MOVES)
        if abs(pos[0] + dx - goal[0]) + abs(pos[1] + dy - goal[1])
        < abs(pos[0] - goal[0]) + abs(pos[1] - goal[1])
    ]
    return int(rng.choice(good)) if good else int(rng.integers(4))


def _step(pos: tuple[int, int], action: int) -> tuple[int, int]:
    dx, dy = _MOVES[action]
    return (min(max(pos[0] + dx, 0), GRID - 1), min(max(pos[1] + dy, 0), GRID - 1))


def _start_and_goal(rng: np.random.Generator) -> tuple[tuple[int, int], tuple[int, int]]:
    while True:
        start = (int(rng.integers(GRID)), int(rng.integers(GRID)))
        goal = (int(rng.integers(GRID)), int(rng.integers(GRID)))
        if start != goal:
            return start, goal


def play_episode(
    policy: Callable[[tuple[int, int], tuple[int, int]], int], rng: np.random.Generator
) -> tuple[list[tuple[tuple[int, int], tuple[int, int], int, float]], bool]:
    """One episode: [(pos, goal, action, reward)] and whether the goal was reached."""
    pos, goal = _start_and_goal(rng)
    steps = []
    for _ in range(MAX_STEPS):
        action = policy(pos, goal)
        new = _step(pos, action)
        reward = 1.0 if new == goal else 0.0
        steps.append((pos, goal, action, reward))
        pos = new
        if reward:
            return steps, True
    return steps, False


def episode_rows(
    agent_id: str, episode: int, steps: list[Any], success: bool, epsilon: float
) -> list[DataRow]:
    """The rows of one episode: state, action, reward, Monte Carlo return, success flag."""
    task_id = f"{agent_id}/ep{episode:03d}"
    returns = np.zeros(len(steps))
    running = 0.0
    for i in range(len(steps) - 1, -1, -1):
        running = steps[i][3] + GAMMA * running
        returns[i] = running
    rows = []
    for i, (pos, goal, action, reward) in enumerate(steps):
        nxt = _step(pos, action)
        rows.append(
            DataRow(
                exp_meta=ExpMeta(
                    task_id=task_id,
                    task_name=f"grid-{GRID}x{GRID}",
                    agent_id=agent_id,
                    step=i,
                    pre_agent=None,
                ),
                exp_data=Experience(
                    state={"obs": observe(pos, goal), "pos": list(pos), "goal": list(goal)},
                    actions=[{"name": ACTIONS[action], "index": action}],
                    reward_t=reward,
                    done=i == len(steps) - 1,
                    next_state={"obs": observe(nxt, goal), "pos": list(nxt)},
                    ext_info={
                        "success": success,
                        "mc_return": float(returns[i]),
                        "epsilon": epsilon,
                    },
                ),
            )
        )
    return rows


def agent_process(spec: AgentSpec, start: Any = None, reports: Any = None) -> dict[str, Any]:
    """The body of one agent process: play episodes and store each one as it ends.

    ``start`` (a multiprocessing Barrier) lines the agents up so they write at the same
    time; the report goes to ``reports`` (a Queue) and is returned.
    """
    rng = np.random.default_rng(spec.seed)
    buffer = ReplayBuffer(spec.url, name=BUFFER)

    def policy(pos: tuple[int, int], goal: tuple[int, int]) -> int:
        time.sleep(STEP_SECONDS)  # the environment takes a moment to answer
        if rng.random() < spec.epsilon:
            return int(rng.integers(4))
        return greedy_action(pos, goal, rng)

    if start is not None:
        start.wait()
    rows = successes = 0
    started = time.time()
    for episode in range(spec.episodes):
        steps, success = play_episode(policy, rng)
        batch = episode_rows(spec.agent_id, episode, steps, success, spec.epsilon)
        buffer.store_batch(batch)  # one transaction per episode
        rows += len(batch)
        successes += success
    finished = time.time()
    buffer.close()
    report = {
        "agent_id": spec.agent_id,
        "epsilon": spec.epsilon,
        "episodes": spec.episodes,
        "rows": rows,
        "successes": successes,
        "started": started,
        "finished": finished,
        "pid": os.getpid(),
    }
    if reports is not None:
        reports.put(report)
    return report


def _start_method() -> str:
    """fork where it is safe and fast (Linux), else spawn (macOS, Windows)."""
    methods = multiprocessing.get_all_start_methods()
    return "fork" if sys.platform.startswith("linux") and "fork" in methods else "spawn"


def run_agents(
    specs: list[AgentSpec], timeout: float = 120.0, start_method: str | None = None
) -> list[dict[str, Any]]:
    """Run one process per agent, all writing at once; their reports in agent order.
    ``start_method`` is multiprocessing's (default: fork on Linux, else spawn)."""
    context: Any = multiprocessing.get_context(start_method or _start_method())
    start = context.Barrier(len(specs))
    reports = context.Queue()
    processes = [
        context.Process(target=agent_process, args=(spec, start, reports), daemon=True)
        for spec in specs
    ]
    for process in processes:
        process.start()
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(specs):
            try:
                report = reports.get(timeout=0.5)
            except queue.Empty:
                failed = [p for p in processes if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise ExpstoreError(
                        f"an agent process failed (exit code {failed[0].exitcode})"
                        if failed
                        else f"the agent processes did not finish within {timeout:.0f} s"
                    ) from None
                continue
            got[report["agent_id"]] = report
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    return [got[spec.agent_id] for spec in specs]


# -- training -------------------------------------------------------------------------------


class NumpyPolicy:
    """Softmax regression from the observation to the action, trained with plain SGD."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0, 0.1, size=(5, 4))
        self.lr = 1.0

    def _features(self, obs: np.ndarray) -> np.ndarray:
        return np.concatenate([obs, np.ones((len(obs), 1))], axis=1)

    def train_step(self, obs: np.ndarray, action: np.ndarray) -> float:
        x = self._features(obs)
        logits = x @ self.w
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        n = len(action)
        loss = float(-np.log(p[np.arange(n), action] + 1e-12).mean())
        grad = p.copy()
        grad[np.arange(n), action] -= 1
        self.w -= self.lr * x.T @ grad / n
        return loss

    def act(self, obs: np.ndarray) -> int:
        return int((self._features(obs[None]) @ self.w).argmax())


class TorchPolicy:
    """A small MLP trained with Adam and cross-entropy (behaviour cloning)."""

    def __init__(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.torch = torch
        self.model = torch.nn.Sequential(
            torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.02)

    def train_step(self, obs: Any, action: Any) -> float:
        logits = self.model(obs)
        loss = self.torch.nn.functional.cross_entropy(logits, action)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return float(loss.item())

    def act(self, obs: np.ndarray) -> int:
        with self.torch.no_grad():
            return int(self.model(self.torch.from_numpy(obs)[None]).argmax())


def torch_available() -> bool:
    # find_spec, not import: torch is imported after the agent processes have forked.
    return importlib.util.find_spec("torch") is not None


def success_rate(policy: Callable[[tuple[int, int], tuple[int, int]], int], seed: int) -> float:
    rng = np.random.default_rng(seed)
    return float(np.mean([play_episode(policy, rng)[1] for _ in range(200)]))
