"""torchgfn-style reward-prioritized replay: keep the best, sample by reward.

torchgfn's ReplayBuffer can keep only the highest-reward items when full ("prioritized
capacity") and sample with probability proportional to reward (softmax over log-rewards);
its diverse variant also rejects an item too close to one already kept. Here:

- ``ReplayBuffer(capacity=..., eviction="max_reward")`` keeps the top rows by ``reward_t``;
- ``reward_t`` holds the log-reward, so ``RewardWeightedSampler(temperature=1)`` draws with
  probability proportional to the reward;
- a few lines of numpy give the p-norm diversity filter.

    python examples/reward_prioritized.py
"""

from __future__ import annotations

import argparse

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.converters import NumpyConverter
from expstore.samplers import RewardWeightedSampler, UniformSampler

H = 16  # a 16 x 16 hypergrid


def hypergrid_reward(
    x: np.ndarray, r0: float = 1e-3, r1: float = 0.5, r2: float = 2.0
) -> np.ndarray:
    """torchgfn's HyperGrid reward: high in the corners' rings, low elsewhere."""
    ax = np.abs(x / (H - 1) - 0.5)
    return (
        r0
        + r1 * np.all((ax > 0.25) & (ax <= 0.5), axis=-1)
        + r2 * np.all((ax > 0.3) & (ax < 0.4), axis=-1)
    )


def diverse(candidates: np.ndarray, kept: np.ndarray, cutoff: float, p: float = 1.0) -> np.ndarray:
    """Which candidates are farther than ``cutoff`` (p-norm) from every kept item and from the
    candidates accepted before them (torchgfn's diversity filter)."""
    accepted: list[int] = []
    pool = list(kept)
    for i, c in enumerate(candidates):
        if all(np.linalg.norm(c - k, ord=p) > cutoff for k in pool):
            accepted.append(i)
            pool.append(c)
    return np.array(accepted, dtype=int)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="database URL (default: in memory)")
    parser.add_argument("--capacity", type=int, default=200)
    parser.add_argument("--cutoff", type=float, default=0.0, help="diversity cutoff (0: off)")
    args = parser.parse_args()

    buffer = ReplayBuffer(
        args.db, name="reward_prioritized", capacity=args.capacity, eviction="max_reward"
    )
    buffer.clear()
    rng = np.random.default_rng(0)
    seen_rewards: list[float] = []
    for iteration in range(20):
        states = rng.integers(0, H, size=(100, 2))  # terminating states of a batch of rollouts
        if args.cutoff > 0:
            kept = np.array([r.exp_data.state["x"] for r in buffer.query()]).reshape(-1, 2)
            states = states[diverse(states, kept, args.cutoff)]
            if not len(states):
                continue
        rewards = hypergrid_reward(states)
        seen_rewards.extend(rewards)
        buffer.store_batch(
            [
                DataRow(
                    exp_meta=ExpMeta(task_id=f"it{iteration}-{i}", agent_id="sampler", step=0),
                    exp_data=Experience(
                        state={"x": x.astype(np.int64)},
                        reward_t=float(np.log(r)),  # the log-reward, as torchgfn stores it
                        done=True,
                    ),
                )
                for i, (x, r) in enumerate(zip(states, rewards, strict=True))
            ]
        )
    kept_rewards = np.exp([float(r.exp_data.reward_t or 0.0) for r in buffer.query()])
    print(
        f"saw {len(seen_rewards)} states, mean reward {np.mean(seen_rewards):.3f}; "
        f"the buffer keeps the best {len(buffer)}, mean reward {kept_rewards.mean():.3f}, "
        f"lowest {kept_rewards.min():.3f}"
    )

    conv = NumpyConverter({"x": "exp_data.state.x", "log_reward": "exp_data.reward_t"})
    for sampler in (UniformSampler(seed=0), RewardWeightedSampler(temperature=1.0, seed=0)):
        batch = buffer.sample(sampler, converter=conv, batch_size=512)
        reward = np.exp(batch["log_reward"])
        share = float(np.mean(reward > 2))
        print(
            f"{type(sampler).__name__:<21} batch of 512: mean reward {reward.mean():.3f}, "
            f"{share:.0%} from the top mode (reward > 2)"
        )
    buffer.close()


if __name__ == "__main__":
    main()
