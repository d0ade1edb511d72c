"""Minari datasets out of a buffer and back: record CartPole episodes with
``EpisodeRecorder``, export them as a Minari dataset that ``minari.load_dataset`` opens,
import that dataset into another buffer and export it again: the same episodes.

    python examples/minari_roundtrip.py                   # SQLite and Minari files in a temp dir
    python examples/minari_roundtrip.py --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np

from expstore import ReplayBuffer, TransitionConverter, UniformSampler, import_minari
from expstore.integrations.gymnasium import EpisodeRecorder


def same_episodes(a: minari.MinariDataset, b: minari.MinariDataset) -> bool:
    parts = ("observations", "actions", "rewards", "terminations", "truncations")
    return a.total_steps == b.total_steps and all(
        np.array_equal(getattr(x, p), getattr(y, p)) and getattr(x, p).dtype == getattr(y, p).dtype
        for x, y in zip(a.iterate_episodes(), b.iterate_episodes(), strict=True)
        for p in parts
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--buffer", default="cartpole", help="buffer name (and <name>_back)")
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MINARI_DATASETS_PATH"] = str(Path(tmp) / "minari")  # keep ~/.minari clean
        url = args.db or f"sqlite:///{Path(tmp) / 'episodes.db'}"
        back_name = f"{args.buffer}_back"
        with (
            ReplayBuffer(url, name=args.buffer) as buffer,
            ReplayBuffer(url, name=back_name) as back,
        ):
            buffer.clear()
            back.clear()

            # 1. Record: each episode a task, each step a row (the final observation is
            #    the last row's next observation, as Minari's DataCollector keeps it).
            env = EpisodeRecorder(gym.make("CartPole-v1"), buffer)
            rng = np.random.default_rng(0)
            for seed in range(args.episodes):
                env.reset(seed=seed)
                done = False
                while not done:
                    _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
                    done = terminated or truncated
            env.close()
            print(f"recorded {buffer.count()} steps in {len(buffer.task_ids())} episodes")
            batch = buffer.sample(UniformSampler(seed=0), None, TransitionConverter(), 32)
            print(f"a DQN batch from the same rows: observation {batch['observation'].shape}")

            # 2. Out: a Minari dataset (spaces and env spec were recorded with the rows).
            dataset = buffer.to_minari("cartpole/expstore-v0", author="expstore example")
            loaded = minari.load_dataset("cartpole/expstore-v0")
            print(
                f"minari.load_dataset: {loaded.total_episodes} episodes, "
                f"{loaded.total_steps} steps, env {loaded.spec.env_spec.id}"
            )

            # 3. In and out again: the same episodes.
            stored = import_minari(back, "cartpole/expstore-v0")
            again = back.to_minari("cartpole/again-v0")
            print(
                f"imported {stored} steps, exported again: same episodes: "
                f"{same_episodes(dataset, again)}"
            )


if __name__ == "__main__":
    main()
