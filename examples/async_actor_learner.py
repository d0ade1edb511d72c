"""Asynchronous actors and learners sharing one buffer through claims, surviving kill -9.

Actor processes write episodes as they finish them; two learner processes claim batches
(no row goes to both), train on them and ack each batch together with their checkpoint, in
one transaction (a training step). Halfway through, one learner is killed with SIGKILL and
started again: it opens its consumer again with takeover=True, which fences out anything
the dead incarnation could still send and gives back the batch it held at once (no
waiting out the lease); it resumes from its checkpoint, and in the end every row was
consumed exactly once.

    python examples/async_actor_learner.py                    # a SQLite file in a temp dir
    python examples/async_actor_learner.py --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path

import numpy as np

from expstore import DataRow, Experience, ExpMeta, NumpyConverter, ReplayBuffer

#: How long a learner may hold a batch; a dead learner's batch comes back after this (or at
#: once, when it restarts with takeover=True).
LEASE_S = 2.0


def actor(url: str, name: str, worker: int, episodes: int, steps: int) -> None:
    """Roll out episodes and store each one whole when it ends."""
    rng = np.random.default_rng(worker)
    with ReplayBuffer(url, name=name) as buffer:
        for e in range(episodes):
            time.sleep(0.02)  # the environment and the policy take time
            buffer.store_batch(
                [
                    DataRow(
                        exp_meta=ExpMeta(
                            task_id=f"a{worker}-ep{e}", agent_id=f"actor-{worker}", step=s
                        ),
                        exp_data=Experience(
                            state={"obs": rng.standard_normal(4).astype(np.float32)},
                            reward_t=float(rng.random()),
                            done=s == steps - 1,
                        ),
                    )
                    for s in range(steps)
                ]
            )


def learner(url: str, name: str, consumer: str, batch_size: int, expected: int) -> None:
    """Claim, train, ack with the checkpoint; resume from the checkpoint after a restart."""
    converter = NumpyConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    with ReplayBuffer(url, name=name) as buffer:
        # A new epoch: an older incarnation's late acks are refused from now on, and the
        # batch it held is claimable again at once.
        me = buffer.consumer(consumer, takeover=True)
        state = me.checkpoint(default={"step": 0, "rows": 0})
        if state["step"]:
            print(
                f"{consumer}: resumed from its checkpoint at step {state['step']} "
                f"(generation {me.generation}, took back {me.taken_back} rows)",
                flush=True,
            )
        while buffer.queue_stats().consumed < expected:
            claim = me.claim(batch_size, lease_s=LEASE_S, converter=converter)
            if not len(claim):
                time.sleep(0.05)  # actors still rolling out, or the other learner's lease
                continue
            time.sleep(0.03)  # a training step on claim.batch["obs"], claim.batch["reward"]
            state = {"step": state["step"] + 1, "rows": state["rows"] + len(claim)}
            with me.step() as step:  # consumed + checkpoint: one transaction
                step.ack(claim)
                step.save_checkpoint(state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--buffer", default="async_actor_learner")
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'async.db'}"
        with ReplayBuffer(url, name=args.buffer) as buffer:
            buffer.clear()
        expected = args.actors * args.episodes * args.steps
        spawn = multiprocessing.get_context("spawn")

        def start_learner(consumer: str) -> multiprocessing.process.BaseProcess:
            process = spawn.Process(
                target=learner, args=(url, args.buffer, consumer, args.batch, expected)
            )
            process.start()
            return process

        actors = [
            spawn.Process(target=actor, args=(url, args.buffer, w, args.episodes, args.steps))
            for w in range(args.actors)
        ]
        for process in actors:
            process.start()
        learners = {c: start_learner(c) for c in ("learner-0", "learner-1")}

        with ReplayBuffer(url, name=args.buffer) as buffer:
            # Kill learner-1 once it has acked a few batches, at whatever it is doing.
            while buffer.checkpoint("learner-1", default={"step": 0})["step"] < 3:
                time.sleep(0.01)
            os.kill(learners["learner-1"].pid, signal.SIGKILL)
            learners["learner-1"].join()
            at_death = buffer.checkpoint("learner-1")
            print(f"learner-1: killed with SIGKILL after step {at_death['step']}", flush=True)
            learners["learner-1"] = start_learner("learner-1")

            for process in [*actors, *learners.values()]:
                process.join()
            if any(p.exitcode != 0 for p in [*actors, *learners.values()]):
                raise SystemExit("an actor or a learner failed")

            ids = [row.id for row in buffer.query()]
            lineage = buffer.lineage(ids)
            consumed = [r for r in lineage.values() if r.state == "consumed"]
            stats = buffer.queue_stats()
            per = {c: stats.per_consumer[c]["consumed"] for c in sorted(stats.per_consumer)}
            checkpoints = {c: buffer.checkpoint(c)["rows"] for c in per}
            print(f"{args.actors} actors stored {len(ids)} rows ({expected} expected)")
            print(f"consumed per learner: {per}; their checkpoints say {checkpoints}")
            exactly_once = (
                len(ids) == expected == len(consumed) == sum(per.values()) and per == checkpoints
            )
            if not exactly_once:
                raise SystemExit("some row was lost or consumed twice")
            print(f"every one of {len(ids)} rows was consumed exactly once")


if __name__ == "__main__":
    main()
