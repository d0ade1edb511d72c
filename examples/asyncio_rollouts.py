"""Rollouts and a learner on one asyncio event loop, through expstore.aio.

Sixteen agents (coroutines) each play episodes of a toy task, awaiting a model call per
step (here a short sleep, as an LLM request would be) and storing every step with
``await buffer.extend(...)``; a learner coroutine on the same loop claims batches of
finished steps as they arrive (``claim(wait=..., min_batch_size=...)``) and acks them with its
checkpoint. Nothing blocks the loop: the writes of all agents are committed together
(group commit) on the buffer's thread while the agents wait for their next model call.

    python examples/asyncio_rollouts.py [--url sqlite:///rollouts.db]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import numpy as np

from expstore import QueryBuilder
from expstore.aio import AsyncReplayBuffer

AGENTS = 16
EPISODES = 4
STEPS = 12
BATCH = 64


async def agent(buffer: AsyncReplayBuffer, k: int) -> int:
    rng = random.Random(k)
    stored = 0
    for episode in range(EPISODES):
        task = f"agent{k}-ep{episode}"
        position = 0.0
        for step in range(STEPS):
            await asyncio.sleep(rng.uniform(0.001, 0.004))  # the model answers
            action = rng.choice([-1, 1])
            position += action
            stored += await buffer.extend(
                {
                    "task_id": [task],
                    "agent_id": f"agent{k}",
                    "step": step,
                    "state": {"obs": np.array([[position, step]], np.float32)},
                    "actions": [action],
                    "reward_t": [1.0 if abs(position) < 3 else 0.0],
                    "done": [step == STEPS - 1],
                }
            )
    return stored


async def learner(buffer: AsyncReplayBuffer, total: int, finished: asyncio.Event) -> int:
    consumed, step = 0, 0
    while consumed < total:
        last = finished.is_set()
        claim = await buffer.claim(
            BATCH,
            consumer="learner",
            wait_s=0.5 if last else 5.0,
            min_batch_size=1 if last else BATCH,
        )
        async with claim:
            rewards = [row.exp_data.reward_t for row in claim.batch]
            step += 1
            consumed += await claim.ack(checkpoint={"step": step, "mean": float(np.mean(rewards))})
    return consumed


async def main(url: str) -> None:
    buffer = await AsyncReplayBuffer.open(url, name="rollouts")
    async with buffer:
        await buffer.clear()
        total = AGENTS * EPISODES * STEPS
        finished = asyncio.Event()
        start = time.perf_counter()

        async def agents() -> list[int]:
            try:
                return await asyncio.gather(*(agent(buffer, k) for k in range(AGENTS)))
            finally:
                finished.set()

        stored, consumed = await asyncio.gather(agents(), learner(buffer, total, finished))
        took = time.perf_counter() - start
        print(f"{AGENTS} agents stored {sum(stored)} steps in {took:.2f} s")
        print(
            f"the learner consumed {consumed} steps; checkpoint step > 0:",
            (await buffer.checkpoint("learner"))["step"] > 0,
        )
        done = QueryBuilder().eq("exp_data.done", True).build()
        print(f"episodes ended: {await buffer.count(done)}")
        stats = await buffer.queue_stats()
        print(f"unclaimed {stats.unclaimed}, leased {stats.leased}, consumed {stats.consumed}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="sqlite:///rollouts.db")
    asyncio.run(main(parser.parse_args().url))
