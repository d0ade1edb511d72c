"""One buffer on PostgreSQL: many writer processes, one trainer reading while they write.

The code is the same as on SQLite; only the URL changes. Postgres is the choice when the
writers run on many machines: each opens the URL, and the trainer samples what has arrived
so far. The trainer here uses prioritized replay and writes priorities back.

    python examples/postgres.py --db postgresql+psycopg://user@host:5432/db
    EXPSTORE_URL=postgresql+psycopg://user@host/db python examples/postgres.py
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.converters import NumpyConverter
from expstore.samplers import PrioritizedSampler

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TRUE_WEIGHTS = np.array([0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 0.25, 1.0], dtype=np.float32)


def writer(url: str, buffer_name: str, worker: int, episodes: int) -> None:
    """An actor: plays episodes and stores each when it ends."""
    buffer = ReplayBuffer(url, name=buffer_name)
    rng = np.random.default_rng(worker)
    for episode in range(episodes):
        obs = rng.standard_normal((8, 8)).astype(np.float32)
        rewards = obs @ TRUE_WEIGHTS + 0.1 * rng.standard_normal(8)
        buffer.store_batch(
            [
                DataRow(
                    exp_meta=ExpMeta(
                        task_id=f"actor{worker}-ep{episode}", agent_id=f"actor{worker}", step=s
                    ),
                    exp_data=Experience(state={"obs": obs[s]}, reward_t=float(rewards[s])),
                )
                for s in range(8)
            ]
        )
        time.sleep(0.01)  # acting takes time
    buffer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=os.environ.get("EXPSTORE_URL", DEFAULT_URL))
    parser.add_argument("--buffer", default="postgres_example")
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the rows afterwards")
    args = parser.parse_args()

    buffer = ReplayBuffer(args.db, name=args.buffer)
    buffer.clear()
    print(f"buffer {args.buffer!r} on {buffer.storage!r}")

    context = multiprocessing.get_context("spawn")
    writers = [
        context.Process(target=writer, args=(args.db, args.buffer, w, args.episodes))
        for w in range(args.writers)
    ]
    for p in writers:
        p.start()

    # The trainer: learn a linear reward model from prioritized batches while rows arrive.
    sampler = PrioritizedSampler(alpha=0.6, beta=0.4, seed=0)
    converter = NumpyConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    weights = np.zeros(8)
    steps = 0
    seen_sizes = []
    while any(p.is_alive() for p in writers) or steps < 50:
        size = len(buffer)
        if size < 64:
            time.sleep(0.05)
            continue
        batch = buffer.sample(sampler, converter=converter, batch_size=64)
        error = batch["obs"] @ weights - batch["reward"]
        grad = (batch["weights"] * error) @ batch["obs"] / len(error)
        weights -= 0.1 * grad
        buffer.update_priorities(batch["ids"], np.abs(error) + 1e-3)
        steps += 1
        seen_sizes.append(size)
    for p in writers:
        p.join()
    if any(p.exitcode != 0 for p in writers):
        raise SystemExit("a writer failed")

    total = len(buffer)
    print(
        f"{args.writers} writers stored {total} rows; the trainer took {steps} batches while "
        f"the buffer grew from {seen_sizes[0]} to {seen_sizes[-1]} rows"
    )
    print(f"learned weights {np.round(weights, 2).tolist()}")
    print(f"true weights    {TRUE_WEIGHTS.tolist()}")
    if not args.keep:
        buffer.clear()
    buffer.close()


if __name__ == "__main__":
    main()
