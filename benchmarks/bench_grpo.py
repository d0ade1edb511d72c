"""Benchmark: asynchronous GRPO, group claims against history (issue: GRPO in production).

For each backend and each size of consumed history (``--history``, rows; 0 is a freshly
created buffer), it builds a buffer whose history is groups of 8 rows already consumed
(marked acked in bulk, as a run that has gone a while leaves them), then runs the loop:

- ``--actors`` processes each store a GRPO group (8 completions of 16-511 int32 tokens,
  0/1 rewards, the policy version they read) every ``--gen-ms`` milliseconds of
  "generation", timing each ``store_batch``;
- one learner waits until 32 groups are ready (``buffer.ready_groups``), then claims them
  (``GroupSampler(varied_reward=True, max_staleness=2)``, oldest first), acks with its
  checkpoint, and bumps the policy version every 5 steps, for ``--steps`` steps, timing
  ``claim + ack``.

It prints, per run: the first ``ready_groups`` call on the buffer (the index built over the
history; once per buffer and spec), claim(32 groups) + ack p50 / p95 / max and p95/p50,
the actors' store p50 / p95 while the learner claims, groups stored and trained per second,
and at the end the ratio of p50 at the largest history over the smallest. No manual
``ANALYZE`` is run on Postgres. Histories are built once into ``--scratch`` (SQLite files)
or databases ``grpo_hist_<rows>`` (Postgres) and copied for each run.

Usage::

    python benchmarks/bench_grpo.py                                   # both, 0/10k/100k/1M
    python benchmarks/bench_grpo.py --backends sqlite --history 0,10000 --steps 40
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import create_engine, text

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.samplers import GroupSampler

GROUP = 8
GROUPS_PER_STEP = 32
NAME = "grpo"
PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


def group_rows(
    prompt: str, version: int | None, rng: np.random.Generator, short: bool
) -> list[DataRow]:
    rewards = rng.integers(0, 2, GROUP).astype(float)
    out = []
    for i in range(GROUP):
        n = 16 if short else int(rng.integers(16, 512))
        tokens = rng.integers(0, 50_000, n, dtype=np.int32)
        out.append(
            DataRow(
                exp_meta=ExpMeta(task_id=prompt, agent_id=f"c{i}", step=i, policy_version=version),
                exp_data=Experience(state={"tokens": tokens}, reward_t=float(rewards[i])),
            )
        )
    return out


def sampler() -> GroupSampler:
    return GroupSampler("task_id", GROUP, varied_reward=True, max_staleness=2)


def build_history(url: str, rows: int) -> None:
    """``rows`` rows of groups of 8, every one consumed."""
    rng = np.random.default_rng(0)
    with ReplayBuffer(url, name=NAME) as buffer:
        buffer.set_policy_version(0)
        groups = rows // GROUP
        for start in range(0, groups, 2000):
            batch = []
            for g in range(start, min(groups, start + 2000)):
                batch += group_rows(f"h{g}", 0, rng, short=True)
            buffer.store_batch(batch)
        buffer_id = buffer.storage.buffer_id  # type: ignore[attr-defined]
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO expstore_consumption (key, buffer_id, claim_id, consumer, "
                "claimed_at, acked_at, times_claimed) SELECT key, buffer_id, 'old', 'old', "
                "0, 0, 1 FROM expstore_rows WHERE buffer_id = :b"
            ),
            {"b": buffer_id},
        )
    engine.dispose()


def prepared(backend: str, rows: int, scratch: Path) -> str:
    """A copy of the history of ``rows`` rows (built once), for one run."""
    if backend == "sqlite":
        base = scratch / f"grpo_hist_{rows}.db"
        if not base.exists():
            build_history(f"sqlite:///{base}.tmp", rows)
            Path(f"{base}.tmp").rename(base)
        run = scratch / "grpo_run.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{run}{suffix}").unlink(missing_ok=True)
        shutil.copy(base, run)
        return f"sqlite:///{run}"
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    base, run = f"grpo_hist_{rows}", "grpo_run"
    with admin.connect() as conn:
        have = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": base})
        if have.first() is None:
            conn.execute(text(f"CREATE DATABASE {base}"))
            build_history(f"{PG}/{base}", rows)
        conn.execute(text(f"DROP DATABASE IF EXISTS {run} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {run} TEMPLATE {base}"))
    admin.dispose()
    return f"{PG}/{run}"


def actor(url: str, index: int, gen_s: float, stop: Any, out: Any) -> None:
    rng = np.random.default_rng(100 + index)
    times: list[float] = []
    stored = 0
    with ReplayBuffer(url, name=NAME) as buffer:
        while not stop.is_set():
            time.sleep(gen_s)
            rows = group_rows(f"a{index}-{stored}", buffer.policy_version(), rng, short=False)
            t0 = time.perf_counter()
            buffer.store_batch(rows)
            times.append(time.perf_counter() - t0)
            stored += 1
    out.put((stored, times))


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def run(backend: str, rows: int, args: argparse.Namespace) -> float:
    url = prepared(backend, rows, args.scratch)
    order = sampler()
    with ReplayBuffer(url, name=NAME) as buffer:
        t0 = time.perf_counter()
        buffer.ready_groups(order)
        build = time.perf_counter() - t0
        context = multiprocessing.get_context("spawn")
        stop, out = context.Event(), context.Queue()
        actors = [
            context.Process(target=actor, args=(url, i, args.gen_ms / 1000, stop, out))
            for i in range(args.actors)
        ]
        for p in actors:
            p.start()
        claims: list[float] = []
        waited = 0.0
        version = buffer.policy_version() or 0
        started = time.perf_counter()
        for step in range(args.steps):
            w0 = time.perf_counter()
            while buffer.ready_groups(order).ready < GROUPS_PER_STEP:
                time.sleep(0.005)
            t0 = time.perf_counter()
            waited += t0 - w0
            claim = buffer.claim(GROUP * GROUPS_PER_STEP, consumer="learner", order=order)
            claim.ack(checkpoint={"step": step})
            claims.append(time.perf_counter() - t0)
            assert len(claim) == GROUP * GROUPS_PER_STEP, len(claim)
            if step % 5 == 4:
                version += 1
                buffer.set_policy_version(version)
        elapsed = time.perf_counter() - started
        stop.set()
        results = [out.get() for _ in actors]
        for p in actors:
            p.join()
        counts = buffer.ready_groups(order)
    stored = sum(n for n, _ in results)
    store_times = [t for _, times in results for t in times]
    p50, p95 = pct(claims, 50), pct(claims, 95)
    print(
        f"{backend:8} history {rows:>9,}: index built in {build * 1000:8.1f} ms | "
        f"claim(32 groups)+ack p50 {p50:6.1f} p95 {p95:6.1f} max {pct(claims, 100):7.1f} ms "
        f"(p95/p50 {p95 / p50:.2f}) | actors' store p50 {pct(store_times, 50):5.1f} "
        f"p95 {pct(store_times, 95):5.1f} ms | groups stored {stored / elapsed:6.1f}/s, "
        f"trained {args.steps * GROUPS_PER_STEP / elapsed:6.1f}/s, learner waited "
        f"{waited / elapsed:.0%} of {elapsed:.1f} s | left: {counts.ready} ready, "
        f"{counts.filtered} filtered, {counts.stale} stale"
    )
    return p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--history", default="0,10000,100000,1000000")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--gen-ms", type=float, default=20.0)
    parser.add_argument("--scratch", type=Path, default=Path("/work/scratch/grpo"))
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.history.split(",")]
    for backend in args.backends.split(","):
        p50s = {rows: run(backend, rows, args) for rows in sizes}
        grown = [r for r in sizes if r]
        if len(grown) > 1:
            low, high = min(grown), max(grown)
            print(
                f"{backend:8} p50 at {high:,} rows of history over {low:,}: "
                f"{p50s[high] / p50s[low]:.2f}x (target <= 1.3x)"
            )


if __name__ == "__main__":
    main()
