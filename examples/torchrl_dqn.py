"""A TorchRL DQN on CartPole whose replay buffer is an expstore buffer: two collector
processes write it, the learner samples it, and every transition is in the database.

TorchRL's pieces as they are: ``TensorDictReplayBuffer`` over
``expstore.integrations.torchrl.ExpstoreStorage`` (instead of ``LazyTensorStorage``),
``QValueActor``, ``DQNLoss``, ``SoftUpdate``. The two collectors are processes with the
replay buffer handed to them (TorchRL shares its writer's cursor, the storage reconnects
to the database) and the Q-network's weights in shared memory; each steps CartPole with
an epsilon-greedy policy and extends the buffer with 32 transitions at a time. When the
run ends (or is killed), the transitions are still there: the last lines reopen the
buffer in a fresh storage and query it with expstore.

    python examples/torchrl_dqn.py                     # a SQLite file in a temp dir
    python examples/torchrl_dqn.py --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import RandomSampler
from torchrl.modules import QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from expstore import ReplayBuffer
from expstore.integrations.torchrl import ExpstoreStorage

CHUNK = 32  # transitions per rb.extend (one transaction)
LEARNING_STARTS = 500  # steps per collector before the learner starts
FRAMES_PER_STEP = 4  # steps per collector per gradient step


def q_network() -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)
    )


def collect(
    rb: TensorDictReplayBuffer, net: nn.Module, worker: int, frames: int, learned: Any
) -> None:
    """One collector process: CartPole steps into the shared buffer, CHUNK at a time,
    at most FRAMES_PER_STEP steps ahead of the learner's gradient steps."""
    torch.set_num_threads(1)
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(worker)
    obs, _ = env.reset(seed=worker)
    rows: list[dict[str, Any]] = []
    episode_return, returns = 0.0, []
    for t in range(frames):
        while t > LEARNING_STARTS + FRAMES_PER_STEP * learned.value:
            time.sleep(0.01)  # the learner is behind: let it catch up
        epsilon = max(0.05, 1.0 - t / (0.5 * frames))
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        episode_return += float(reward)
        rows.append(
            {
                "observation": torch.as_tensor(obs),
                "action": nn.functional.one_hot(torch.tensor(action), 2),
                ("next", "observation"): torch.as_tensor(next_obs),
                ("next", "reward"): torch.tensor([float(reward)]),
                ("next", "done"): torch.tensor([terminated or truncated]),
                ("next", "terminated"): torch.tensor([terminated]),
                "worker": torch.tensor(worker),
            }
        )
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
        if len(rows) == CHUNK:
            batch = TensorDict({k: torch.stack([r[k] for r in rows]) for k in rows[0]}, [CHUNK])
            rb.extend(batch)
            rows = []
    last = returns[-10:] or [episode_return]
    print(
        f"collector {worker}: {frames} steps, {len(returns)} episodes, "
        f"mean return of the last 10: {np.mean(last):.0f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--buffer", default="torchrl_dqn")
    parser.add_argument("--frames", type=int, default=3000, help="steps per collector")
    parser.add_argument("--max-size", type=int, default=20_000)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # three processes share the machine

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'dqn.db'}"
        storage = ExpstoreStorage(args.max_size, url=url, name=args.buffer)
        rb = TensorDictReplayBuffer(
            storage=storage, sampler=RandomSampler(), batch_size=128, shared=True
        )
        rb.empty()

        actor = QValueActor(q_network(), in_keys=["observation"], spec=None, action_space="one_hot")
        actor.share_memory()  # the collectors act with the learner's latest weights
        loss = DQNLoss(actor, action_space="one_hot", delay_value=True)
        loss.make_value_estimator(gamma=0.99)
        target = SoftUpdate(loss, eps=0.99)
        optim = torch.optim.Adam(loss.parameters(), lr=1e-3)

        ctx = mp.get_context("fork")
        learned = ctx.Value("q", 0)
        net = q_network_of(actor)
        collectors = [
            ctx.Process(target=collect, args=(rb, net, w, args.frames, learned)) for w in range(2)
        ]
        start = time.perf_counter()
        for p in collectors:
            p.start()
        while any(p.is_alive() for p in collectors):
            if len(rb) < LEARNING_STARTS:
                time.sleep(0.01)
                continue
            batch = rb.sample()
            value = loss(batch)["loss"]
            optim.zero_grad()
            value.backward()
            optim.step()
            target.step()
            learned.value += 1
        for p in collectors:
            p.join()
            assert p.exitcode == 0, f"a collector failed ({p.exitcode})"
        seconds = time.perf_counter() - start
        print(
            f"learner: {learned.value} gradient steps on batches of 128 sampled from the "
            f"database while the collectors wrote it ({seconds:.1f} s)"
        )

        # Everything the collectors wrote is in the database: another storage, or plain
        # expstore, reads it back (a new process would too).
        again = ExpstoreStorage(args.max_size, url=url, name=args.buffer)
        written = min(2 * (args.frames // CHUNK) * CHUNK, args.max_size)
        print(f"buffer: {len(again)} transitions in the database ({written} expected)")
        workers = again[:]["worker"]
        print(f"per collector: {[int((workers == w).sum()) for w in range(2)]}")
        with ReplayBuffer(url, name=args.buffer) as buffer:
            print(
                f"expstore sees {buffer.count()} rows, slots 0..{args.max_size - 1} as task 'slots'"
            )


def q_network_of(actor: QValueActor) -> nn.Module:
    """The Q-network inside the actor (its parameters are the shared ones)."""
    return next(m for m in actor.modules() if isinstance(m, nn.Sequential))


if __name__ == "__main__":
    main()
