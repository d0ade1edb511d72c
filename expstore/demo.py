"""The demo behind ``expstore demo``: many agent processes, one store, a trainer.

:func:`run_demo` plays a whole (small) training pipeline on the embedded default, a SQLite
file:

1. Several agent *processes* (``multiprocessing``, spawn) play episodes of a tiny grid world
   at the same time, each storing every finished episode as one atomic ``store_batch``.
   Each agent is the same noisy greedy policy with a different amount of noise.
2. The main process queries the store by task and by agent.
3. It samples batches of successful steps with two samplers (uniform and stratified by
   agent) through a ``TensorConverter`` (or ``NumpyConverter`` without torch).
4. It trains a small policy on sampled batches by behaviour cloning (torch when installed,
   else numpy) and plays it in the environment.

The episodes depend only on ``seed``, so the writing and querying parts print the same
numbers on every run; sampling and training vary slightly because the writers' rows
interleave differently each time.

>>> run_demo(workdir="/tmp/expstore-demo")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.engine import make_url

from .buffer import ReplayBuffer
from .converters import NumpyConverter, TensorConverter
from .demo_world import (
    BUFFER,
    GRID,
    AgentSpec,
    NumpyPolicy,
    TorchPolicy,
    observe,
    run_agents,
    success_rate,
    torch_available,
)
from .errors import InvalidArgumentError
from .query import Condition, QueryBuilder
from .samplers import StratifiedSampler, UniformSampler

__all__ = ["DemoResult", "run_demo"]


@dataclass
class DemoResult:
    """What the demo measured (the numbers it prints)."""

    rows: int
    episodes: int
    write_seconds: float
    per_agent: dict[str, dict[str, float]]
    trained_success: float
    baseline_success: float
    backend: str
    seconds: float


# -- the demo ---------------------------------------------------------------------------------


def run_demo(
    db: str | None = None,
    workdir: str | os.PathLike[str] = "expstore-demo",
    *,
    agents: int = 4,
    episodes: int = 40,
    train_steps: int = 150,
    batch_size: int = 128,
    seed: int = 0,
    backend: str | None = None,
    start_method: str | None = None,
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo, printing an account through ``echo``; returns what it measured.

    ``db`` defaults to ``sqlite:///<workdir>/demo.db``; the demo uses (and first empties)
    the buffer named ``demo`` there. ``backend`` is ``"torch"``, ``"numpy"`` or None (torch
    when installed); ``start_method`` how the agent processes start (``"fork"`` or
    ``"spawn"``; default: fork on Linux, else spawn).
    """
    began = time.perf_counter()
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    url = db or f"sqlite:///{folder / 'demo.db'}"
    if backend is None:
        backend = "torch" if torch_available() else "numpy"
    if backend not in ("torch", "numpy"):
        raise InvalidArgumentError(f"backend must be 'torch' or 'numpy', got {backend!r}")
    shown = make_url(url).render_as_string(hide_password=True)
    _empty(url, shown, agents, echo)
    specs = _agent_specs(url, agents, episodes, seed)
    written = _write_section(url, specs, start_method, echo)
    with ReplayBuffer(url, name=BUFFER) as buffer:
        _query_section(buffer, specs, echo)
        successful = QueryBuilder().eq("exp_data.ext_info.success", True).build()
        converter, stratified = _sample_section(
            buffer, successful, backend, seed, written.per_agent, echo
        )
        trained, baseline = _train_section(
            buffer, successful, converter, stratified, backend, seed, train_steps,
            batch_size, written.per_agent, echo,
        )  # fmt: skip
    seconds = time.perf_counter() - began
    _closing(shown, seconds, echo)
    return DemoResult(
        rows=written.stored,
        episodes=agents * episodes,
        write_seconds=written.seconds,
        per_agent=written.per_agent,
        trained_success=trained,
        baseline_success=baseline,
        backend=backend,
        seconds=seconds,
    )


def _empty(url: str, shown: str, agents: int, echo: Callable[[str], None]) -> None:
    """Empty the demo's buffer (an earlier run's rows) and say what the demo will do."""
    with ReplayBuffer(url, name=BUFFER) as buffer:
        old = buffer.count()
        buffer.clear()
    echo(f"expstore demo: {agents} agent processes play a {GRID}x{GRID} grid world into {shown}")
    if old:
        echo(f"  (emptied buffer {BUFFER!r}, which held {old} rows from an earlier run)")


def _agent_specs(url: str, agents: int, episodes: int, seed: int) -> list[AgentSpec]:
    """One spec per agent, each acting at random a little more often than the last."""
    epsilons = np.linspace(0.1, 0.8, agents) if agents > 1 else np.array([0.1])
    return [
        AgentSpec(f"agent-{i}", round(float(epsilons[i]), 2), episodes, seed * 1000 + i, url)
        for i in range(agents)
    ]


@dataclass
class _Written:
    stored: int
    seconds: float
    per_agent: dict[str, dict[str, float]]


def _write_section(
    url: str, specs: list[AgentSpec], start_method: str | None, echo: Callable[[str], None]
) -> _Written:
    """1. Several processes write at once; every row they wrote must be there."""
    echo("")
    echo(
        f"1. Writing: {len(specs)} processes, {specs[0].episodes} episodes each, one "
        "store_batch per episode"
    )
    t0 = time.perf_counter()
    reports = run_agents(specs, start_method=start_method)  # they open their own connections
    seconds = time.perf_counter() - t0
    with ReplayBuffer(url, name=BUFFER) as buffer:
        stored = buffer.count()
    expected = sum(r["rows"] for r in reports)
    overlap = min(r["finished"] for r in reports) - max(r["started"] for r in reports)
    per_agent: dict[str, dict[str, float]] = {}
    for r in reports:
        per_agent[r["agent_id"]] = {
            "epsilon": r["epsilon"],
            "rows": r["rows"],
            "success_rate": r["successes"] / r["episodes"],
        }
        echo(
            f"   {r['agent_id']} (pid {r['pid']}, acts at random {r['epsilon']:.0%} of the time): "
            f"{r['episodes']} episodes, {r['rows']} steps, reached the goal "
            f"{r['successes']}/{r['episodes']}"
        )
    lost = "none lost" if stored == expected else f"{expected - stored} MISSING"
    echo(
        f"   {stored} rows stored of {expected} written ({lost}) in {seconds:.1f} s; "
        f"all {len(specs)} writers were writing at once for {max(overlap, 0):.1f} s"
    )
    return _Written(stored, seconds, per_agent)


def _query_section(
    buffer: ReplayBuffer, specs: list[AgentSpec], echo: Callable[[str], None]
) -> None:
    """2. Query by task and by agent."""
    echo("")
    echo("2. Querying")
    task_id = buffer.task_ids(QueryBuilder().eq("exp_meta.agent_id", "agent-0").build())[0]
    trajectory = buffer.get_by_task_id(task_id)
    moves = " ".join(str(r.exp_data.actions[0]["name"]) for r in trajectory)
    first, final = trajectory[0].exp_data, trajectory[-1].exp_data
    echo(
        f"   by task:  get_by_task_id({task_id!r}) -> {len(trajectory)} steps from "
        f"{tuple(first.state['pos'])} to the goal {tuple(first.state['goal'])}: {moves}; "
        f"reward {final.reward_t:g} at step {trajectory[-1].exp_meta.step}"
    )
    successful = QueryBuilder().eq("exp_data.ext_info.success", True).build()
    for agent_id in (specs[0].agent_id, specs[-1].agent_id):
        mine = QueryBuilder().eq("exp_meta.agent_id", agent_id).build()
        mine_ok = (
            QueryBuilder()
            .eq("exp_meta.agent_id", agent_id)
            .and_()
            .eq("exp_data.ext_info.success", True)
            .build()
        )
        echo(
            f"   by agent: {agent_id} -> {buffer.count(mine)} rows in "
            f"{len(buffer.task_ids(mine))} tasks, {buffer.count(mine_ok)} rows from successful "
            "episodes"
        )
    echo(f"   where {successful} -> {buffer.count(successful)} rows to learn from")


def _sample_section(
    buffer: ReplayBuffer,
    successful: Condition | None,
    backend: str,
    seed: int,
    per_agent: dict[str, dict[str, float]],
    echo: Callable[[str], None],
) -> tuple[NumpyConverter, StratifiedSampler]:
    """3. Sample successful steps with two samplers through a converter."""
    fields = {"obs": "exp_data.state.obs", "action": "exp_data.actions.0.index"}
    converter = TensorConverter(fields) if backend == "torch" else NumpyConverter(fields)
    echo("")
    echo(
        f"3. Sampling successful steps through {type(converter).__name__}"
        f"({{'obs': float32[B, 4], 'action': int64[B]}})"
    )
    uniform = UniformSampler(seed=seed)
    stratified = StratifiedSampler(by="exp_meta.agent_id", seed=seed)
    # A buffer of hundreds of rows: over the key index, faster warm than over the key
    # space, and the r-th row of an agent is the same row however the writers'
    # episodes interleaved, so the training that follows learns the same on every run.
    stratified.flat = False
    for sampler in (uniform, stratified):
        rows = buffer.sample(sampler, successful, batch_size=512)
        agents_in = [r.exp_meta.agent_id for r in rows]
        shares = ", ".join(f"{a} {agents_in.count(a) / len(agents_in):.0%}" for a in per_agent)
        echo(f"   {type(sampler).__name__:<17} batch of 512 by agent: {shares}")
    return converter, stratified


def _train_section(
    buffer: ReplayBuffer,
    successful: Condition | None,
    converter: NumpyConverter,
    sampler: StratifiedSampler,
    backend: str,
    seed: int,
    train_steps: int,
    batch_size: int,
    per_agent: dict[str, dict[str, float]],
    echo: Callable[[str], None],
) -> tuple[float, float]:
    """4. Train on sampled batches, then play: (trained success, random success)."""
    echo("")
    policy: Any = TorchPolicy(seed) if backend == "torch" else NumpyPolicy(seed)
    what = "a 4-32-4 MLP (torch)" if backend == "torch" else "softmax regression (numpy)"
    echo(
        f"4. Training {what} by behaviour cloning on {train_steps} stratified batches of "
        f"{batch_size}"
    )
    t0 = time.perf_counter()
    marks = {0, train_steps // 3, 2 * train_steps // 3, train_steps - 1}
    for step in range(train_steps):
        batch = buffer.sample(sampler, successful, converter, batch_size)
        loss = policy.train_step(batch["obs"], batch["action"])
        if step in marks:
            echo(f"   step {step + 1:>4}: cross-entropy {loss:.3f}")
    train_seconds = time.perf_counter() - t0
    trained = success_rate(lambda p, g: policy.act(observe(p, g)), seed + 99)
    baseline_rng = np.random.default_rng(seed + 7)
    baseline = success_rate(lambda p, g: int(baseline_rng.integers(4)), seed + 99)
    best = max(per_agent.values(), key=lambda a: a["success_rate"])
    echo(
        f"   trained in {train_seconds:.1f} s; playing 200 new episodes it reaches the goal "
        f"{trained:.0%} of the time (random moves: {baseline:.0%}; best agent: "
        f"{best['success_rate']:.0%})"
    )
    return trained, baseline


def _closing(shown: str, seconds: float, echo: Callable[[str], None]) -> None:
    echo("")
    echo(f"Done in {seconds:.1f} s. Look around:")
    echo(f"   expstore stats --db {shown} --buffer {BUFFER} --by agent")
    echo(
        f"   expstore query --db {shown} --buffer {BUFFER} --where "
        "\"agent_id = 'agent-0' and reward_t > 0\" --limit 5"
    )
