"""Benchmark: a CleanRL-style DQN on CartPole, end to end, with its replay buffer in
expstore (SQLite, Postgres) and in TorchRL's ``ReplayBuffer(LazyTensorStorage)``, the same
loop and seeds, side by side in one run (issue 44).

The loop: gymnasium's ``CartPole-v1``, 8 vector envs (same-step autoreset), each step
stores the 8 transitions (``extend``: observation, action, reward, next observation,
termination) and, once ``--learning-starts`` steps are in, samples 128 (uniform, with
replacement) and takes one gradient step of CleanRL's Q-network (120-84 MLP, Adam 2.5e-4,
gamma 0.99, target network copied every 100 steps, epsilon 1 to 0.05 over half the
steps). The buffers hold 10,000 transitions (CleanRL's ``buffer_size``): expstore with
``capacity=10_000`` (FIFO eviction), TorchRL with ``LazyTensorStorage(10_000)``. Default
settings otherwise.

Printed for each store: the whole loop's seconds, the seconds inside the buffer (storing,
sampling), the ratio to TorchRL's loop, and whether it learned (the mean return of the
last 20 episodes, against a random policy's ~22: "learned" above 100). Target: the loop
≤ 1.5x TorchRL's on SQLite, ≤ 2x on Postgres.

Needs ``pip install '.[bench]'`` (gymnasium, torchrl) and torch::

    python benchmarks/bench_dqn_loop.py [--steps 4000] [--pg URL] [--skip-pg]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fresh_pg_database  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
CAPACITY = 10_000
BATCH = 128
ENVS = 8


class QNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


class TorchRLStore:
    name = "TorchRL LazyTensorStorage"

    def __init__(self) -> None:
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        self.rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY), batch_size=BATCH)

    def add(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, dones: Any) -> None:
        from tensordict import TensorDict

        self.rb.extend(
            TensorDict(
                {
                    "obs": torch.as_tensor(obs),
                    "action": torch.as_tensor(actions),
                    "reward": torch.as_tensor(rewards, dtype=torch.float32),
                    "next_obs": torch.as_tensor(next_obs),
                    "done": torch.as_tensor(dones, dtype=torch.float32),
                },
                batch_size=[len(obs)],
            )
        )

    def sample(self) -> tuple[torch.Tensor, ...]:
        b = self.rb.sample()
        return b["obs"], b["action"], b["reward"], b["next_obs"], b["done"]

    def close(self) -> None:
        pass


class ExpstoreStore:
    def __init__(self, url: str, name: str, seed: int) -> None:
        from expstore import ReplayBuffer, TensorConverter, UniformSampler

        self.name = name
        self.buffer = ReplayBuffer(url, name="dqn", capacity=CAPACITY)
        self.sampler = UniformSampler(seed=seed)
        self.converter = TensorConverter(
            {
                "obs": "exp_data.state.obs",
                "action": "exp_data.actions",
                "reward": "exp_data.reward_t",
                "next_obs": "exp_data.next_state.obs",
                "done": "exp_data.done",
            }
        )
        self.step = 0

    def add(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, dones: Any) -> None:
        self.step += 1
        self.buffer.extend(
            {
                "task_id": [f"env{i}" for i in range(len(obs))],
                "agent_id": "dqn",
                "step": self.step,
                "state": {"obs": obs},
                "actions": actions,
                "reward_t": rewards,
                "next_state": {"obs": next_obs},
                "done": dones,
            }
        )

    def sample(self) -> tuple[torch.Tensor, ...]:
        b = self.buffer.sample(self.sampler, None, self.converter, BATCH)
        return b["obs"], b["action"], b["reward"], b["next_obs"], b["done"].float()

    def close(self) -> None:
        self.buffer.close()


def run(store: Any, steps: int, seed: int, learning_starts: int) -> dict[str, Any]:
    import gymnasium as gym

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=ENVS,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    q = QNetwork()
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=2.5e-4)
    obs, _ = envs.reset(seed=seed)
    returns: list[float] = []
    running = np.zeros(ENVS)
    storing = sampling = 0.0
    start = time.perf_counter()
    for step in range(steps):
        epsilon = max(0.05, 1.0 - 0.95 * step / (steps / 2))
        if random.random() < epsilon:
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                actions = q(torch.as_tensor(obs)).argmax(dim=1).numpy()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        running += rewards
        real_next = next_obs.copy()
        for i in np.flatnonzero(np.logical_or(terminations, truncations)):
            returns.append(float(running[i]))
            running[i] = 0
            real_next[i] = infos["final_obs"][i]
        t0 = time.perf_counter()
        store.add(
            obs.astype(np.float32),
            np.asarray(actions, dtype=np.int64),
            rewards.astype(np.float32),
            real_next.astype(np.float32),
            terminations,
        )
        storing += time.perf_counter() - t0
        obs = next_obs
        if step >= learning_starts:
            t0 = time.perf_counter()
            b_obs, b_act, b_rew, b_next, b_done = store.sample()
            sampling += time.perf_counter() - t0
            with torch.no_grad():
                best = target(b_next.float()).max(dim=1).values
                td_target = b_rew.float().flatten() + 0.99 * best * (1 - b_done.flatten())
            chosen = q(b_obs.float()).gather(1, b_act.long().view(-1, 1)).squeeze(1)
            loss = nn.functional.mse_loss(chosen, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                target.load_state_dict(q.state_dict())
    total = time.perf_counter() - start
    envs.close()
    last = returns[-20:]
    return {
        "total": total,
        "storing": storing,
        "sampling": sampling,
        "episodes": len(returns),
        "last20": statistics.mean(last) if last else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--learning-starts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pg", default=os.environ.get("EXPSTORE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--skip-pg", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: list[tuple[str, dict[str, Any]]] = []

    def measure(store: Any) -> None:
        try:
            found = run(store, args.steps, args.seed, args.learning_starts)
        finally:
            store.close()
        results.append((store.name, found))
        print(
            f"{store.name:28s} loop {found['total']:7.1f} s | storing {found['storing']:6.1f} s "
            f"| sampling {found['sampling']:6.1f} s | episodes {found['episodes']:5d} "
            f"| last 20 returns {found['last20']:6.1f}",
            flush=True,
        )

    measure(TorchRLStore())
    with tempfile.TemporaryDirectory() as folder:
        measure(ExpstoreStore(f"sqlite:///{folder}/dqn.db", "expstore SQLite", args.seed))
    if not args.skip_pg:
        url, drop = fresh_pg_database(args.pg)
        try:
            measure(ExpstoreStore(url, "expstore Postgres", args.seed))
        finally:
            drop()
    base = results[0][1]["total"]
    print()
    print("| store | loop | in the buffer (store + sample) | ratio to TorchRL | target | learned |")
    print("|---|---|---|---|---|---|")
    targets = {"expstore SQLite": 1.5, "expstore Postgres": 2.0}
    for name, found in results:
        ratio = found["total"] / base
        target = targets.get(name)
        print(
            f"| {name} | {found['total']:.1f} s | {found['storing'] + found['sampling']:.1f} s "
            f"| **{ratio:.2f}x** | {'' if target is None else f'≤ {target}x'} "
            f"| {'yes' if found['last20'] > 100 else 'no'} ({found['last20']:.0f}) |"
        )


if __name__ == "__main__":
    main()
