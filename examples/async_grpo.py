"""Asynchronous GRPO: rollout processes write groups of completions, a trainer draws whole
groups with varying reward under a staleness bound and a samples-per-insert budget.

Rollout processes each take prompts, generate ``G`` completions per prompt with the policy
version they last saw (they lag behind the trainer, as inference servers do), and store each
prompt's completions as one group, deduplicated (a retried prompt is stored once). The
trainer publishes a new policy version after every step; each step it draws complete
groups whose rewards vary (DAPO's dynamic sampling), no more than ``max_staleness`` versions
old, turns rewards into group-normalised advantages, and is held to ``samples_per_insert``
rows sampled per row inserted by a rate limit kept in the database (so it never overfits a
slow stream of rollouts). Every knob is shared by every process through the database.

    python examples/async_grpo.py                    # a SQLite file in a temp dir
    python examples/async_grpo.py --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

import numpy as np

from expstore import (
    DataRow,
    EmptyBufferError,
    Experience,
    ExpMeta,
    GroupAdvantageConverter,
    GroupSampler,
    NumpyConverter,
    RateLimiter,
    ReplayBuffer,
)


def rollouts(url: str, name: str, worker: int, group_size: int, stop_at: int) -> None:
    """Generate groups of completions until the trainer reaches its last version."""
    rng = np.random.default_rng(worker)
    with ReplayBuffer(url, name=name) as buffer:
        prompt = 0
        while True:
            version = buffer.policy_version() or 0  # the weights this worker has loaded
            if version >= stop_at:
                return
            time.sleep(0.02)  # generating G completions takes time
            difficulty = rng.random()  # easy prompts: every completion right (no signal)
            rewards = (rng.random(group_size) > difficulty).astype(float)
            group = [
                DataRow(
                    exp_meta=ExpMeta(
                        task_id=f"w{worker}-p{prompt}",
                        agent_id=f"completion-{i}",
                        step=0,
                        policy_version=version,
                    ),
                    exp_data=Experience(
                        state={"prompt": f"w{worker}-p{prompt}", "tokens": rng.integers(0, 50, 8)},
                        reward_t=float(r),
                    ),
                )
                for i, r in enumerate(rewards)
            ]
            # Completions finish at different times: the group waits until all are in.
            half = group_size // 2
            buffer.store_batch(group[:half], dedup="skip")
            time.sleep(0.01)
            buffer.store_batch(group[half:], dedup="skip")
            if rng.random() < 0.1:  # a retry after a lost acknowledgement: stored once
                buffer.store_batch(group, dedup="skip")
            prompt += 1


def train(url: str, name: str, args: argparse.Namespace) -> dict[str, int]:
    """The trainer loop: draw groups, compute advantages, step, publish the version."""
    sampler = GroupSampler(
        "task_id",
        args.group_size,
        varied_reward=True,
        max_staleness=args.max_staleness,
        seed=0,
    )
    converter = GroupAdvantageConverter(
        NumpyConverter({"reward": "exp_data.reward_t", "version": "exp_meta.policy_version"})
    )
    totals = {"steps": 0, "groups": 0, "waits": 0}
    with ReplayBuffer(url, name=name) as buffer:
        step = buffer.policy_version() or 0
        while step < args.steps:
            try:
                batch = buffer.sample(
                    sampler, converter=converter, batch_size=args.groups * args.group_size
                )
            except EmptyBufferError:
                totals["waits"] += 1  # no complete, varied, fresh group yet
                time.sleep(0.05)
                continue
            counts = sampler.last_counts
            assert counts is not None
            oldest = int(batch["version"].min())
            assert oldest >= step - args.max_staleness, "a stale group was drawn"
            time.sleep(0.02)  # a training step on batch["advantages"] (mean 0 per group)
            groups = len(batch["reward"]) // args.group_size
            print(
                f"step {step:2d}: {groups} groups (oldest v{oldest}); ready {counts.ready}, "
                f"waiting {counts.waiting}, filtered {counts.filtered} (rewards all equal), "
                f"stale {counts.stale}; |adv| mean {np.abs(batch['advantages']).mean():.2f}",
                flush=True,
            )
            step += 1
            buffer.set_policy_version(step)  # every rollout worker sees it at once
            totals["steps"] += 1
            totals["groups"] += groups
        totals["waits"] += buffer.sql.rate_limits.waits
        stats = buffer.rate_limit_stats()
        assert stats is not None
        limit = args.samples_per_insert * stats.inserted + stats.limiter.buffer
        print(
            f"rate limit: {stats.sampled} rows sampled for {stats.inserted} inserted "
            f"(at most {args.samples_per_insert:g} per insert); the trainer waited "
            f"{buffer.sql.rate_limits.waits} times for rollouts",
            flush=True,
        )
        assert stats.sampled <= limit
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--buffer", default="async_grpo")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4, help="groups per training step")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--samples-per-insert", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'grpo.db'}"
        with ReplayBuffer(url, name=args.buffer) as buffer:
            buffer.clear()
            buffer.set_policy_version(0, force=True)
            buffer.set_rate_limiter(
                RateLimiter(
                    min_size=args.groups * args.group_size,
                    samples_per_insert=args.samples_per_insert,
                    timeout_s=60,
                )
            )
        ctx = multiprocessing.get_context("spawn")
        workers = [
            ctx.Process(target=rollouts, args=(url, args.buffer, w, args.group_size, args.steps))
            for w in range(args.workers)
        ]
        for w in workers:
            w.start()
        try:
            totals = train(url, args.buffer, args)
        finally:
            for w in workers:
                w.join(timeout=30)
                if w.is_alive():
                    w.kill()
        with ReplayBuffer(url, name=args.buffer) as buffer:
            stored = len(buffer)
            prompts = len(buffer.task_ids())
            assert stored == prompts * args.group_size, "a retried group was stored twice"
            buffer.set_rate_limiter(None)
        print(
            f"done: {totals['steps']} steps, {totals['groups']} groups trained on, "
            f"{stored} rollouts stored (no duplicates), final policy version {args.steps}"
        )


if __name__ == "__main__":
    main()
