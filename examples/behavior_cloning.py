"""DigiRL-style behaviour cloning from a FIFO buffer of transitions.

DigiRL keeps a circular buffer of transitions (observation text, action, image features of
this screen and the next, reward, done, Monte Carlo return) and trains a policy on random
batches through a DataLoader. Here the buffer is a ReplayBuffer with a FIFO capacity, the
batch is DigiRL's dict from TransitionConverter, and the DataLoader is expstore's
SampledBatches.

    python examples/behavior_cloning.py
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.converters import TransitionConverter
from expstore.samplers import UniformSampler
from expstore.torch_data import SampledBatches

ACTIONS = ["click(100, 200)", "scroll(up)", "type('hello')", "press(HOME)"]
FEATURES = 32
GAMMA = 0.95


def expert_episode(episode: int, rng: np.random.Generator, prototypes: np.ndarray) -> list[DataRow]:
    """An expert demonstration: the screen's features reveal which action is right."""
    length = int(rng.integers(3, 8))
    actions = rng.integers(len(ACTIONS), size=length)
    features = prototypes[actions] + 2.5 * rng.standard_normal((length, FEATURES))
    rewards = np.zeros(length)
    rewards[-1] = 1.0
    returns = np.array(
        [sum(GAMMA**k * r for k, r in enumerate(rewards[i:])) for i in range(length)]
    )
    rows = []
    for i in range(length):
        nxt = features[i + 1] if i + 1 < length else features[i]
        rows.append(
            DataRow(
                exp_meta=ExpMeta(task_id=f"demo-{episode}", agent_id="expert", step=i),
                exp_data=Experience(
                    state={
                        "observation": f"screen {i} of demo {episode}",
                        "image_features": features[i].astype(np.float32),
                    },
                    actions=[ACTIONS[actions[i]]],
                    reward_t=float(rewards[i]),
                    done=i == length - 1,
                    next_state={
                        "observation": f"screen {i + 1} of demo {episode}",
                        "image_features": nxt.astype(np.float32),
                    },
                    ext_info={"mc_return": float(returns[i])},
                ),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="database URL (default: in memory)")
    parser.add_argument("--capacity", type=int, default=400)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    prototypes = rng.standard_normal((len(ACTIONS), FEATURES))

    # A circular buffer: FIFO eviction keeps the newest `capacity` transitions.
    buffer = ReplayBuffer(args.db, name="behavior_cloning", capacity=args.capacity, eviction="fifo")
    buffer.clear()
    inserted = 0
    for episode in range(150):
        rows = expert_episode(episode, rng, prototypes)
        buffer.store_batch(rows)
        inserted += len(rows)
    oldest = min(int(t.split("-")[1]) for t in buffer.task_ids())
    print(
        f"inserted {inserted} transitions; the buffer keeps the newest {len(buffer)} "
        f"(capacity {args.capacity}), from demo {oldest} on"
    )

    converter = TransitionConverter(tensors=True)
    batch = buffer.sample(UniformSampler(seed=0), converter=converter, batch_size=4)
    print("DigiRL batch keys:", ", ".join(batch))
    print(
        "image_features",
        tuple(batch["image_features"].shape),
        batch["image_features"].dtype,
        "| mc_return",
        [round(x, 3) for x in batch["mc_return"].tolist()],
    )

    # A DataLoader of sampled batches, and a behaviour-cloning loss on them.
    batches = SampledBatches(
        buffer, UniformSampler(seed=1), batch_size=64, converter=converter, num_batches=args.steps
    )
    policy = torch.nn.Linear(FEATURES, len(ACTIONS))
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
    index = {a: i for i, a in enumerate(ACTIONS)}
    for step, batch in enumerate(batches.loader()):
        target = torch.tensor([index[a] for a in batch["action"]])
        logits = policy(batch["image_features"])
        loss = torch.nn.functional.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in (0, args.steps - 1):
            accuracy = (logits.argmax(1) == target).float().mean().item()
            print(f"step {step + 1:>3}: BC loss {loss.item():.3f}, accuracy {accuracy:.0%}")
    buffer.close()


if __name__ == "__main__":
    main()
