"""Benchmark: GRPO groups, staleness and rate limits against plain sampling.

For each backend, over a buffer of ``--rows`` small rows in groups of 8 (one task per
group, 8 completions each), policy versions 0..99 in insertion order and 0/1 rewards, it
prints medians of ``--repeat`` interleaved warm calls, all with the same NumpyConverter:

1. ``GroupSampler(group_size=8)`` drawing 32 groups (256 rows), with and without
   ``varied_reward``, over the summaries of every group (the path up to
   ``GroupSampler.summaries_up_to`` rows) and over the key space (``summaries_up_to =
   0``, the path above it), against ``sample(256)`` with UniformSampler (target <= 2x);
   the first group draw after opening each way (over the summaries the database
   summarises every group once) and the draw after 64 rows were stored (only the touched
   groups are summarised again);
2. ``UniformSampler(max_staleness=49)`` at version 99 (half the rows fresh) against
   without (target <= 1.2x), the same with ``max_staleness=4`` (5% fresh) and its first
   draw after opening, and the first draw after the version moved;
3. rate-limited sampling: the per-call cost of counting a batch against a budget (one
   process), and 4 processes sampling at once for ``--seconds`` with and without a
   limit: calls per second, and on Postgres how often a sampler was seen waiting on a lock
   (``pg_stat_activity``, every 5 ms), which would show a convoy on the counter row.

Usage::

    python benchmarks/bench_coordination.py                   # 1M rows, both backends
    python benchmarks/bench_coordination.py --rows 100000 --backends sqlite
    python benchmarks/bench_coordination.py --scratch /var/tmp/expstore-bench  # reuse
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import LockWatch, ms
from sqlalchemy import create_engine, text

from expstore import (
    DataRow,
    Experience,
    ExpMeta,
    GroupSampler,
    NumpyConverter,
    QueryBuilder,
    RateLimiter,
    ReplayBuffer,
    UniformSampler,
)

CONVERTER = {"reward": "exp_data.reward_t", "version": "exp_meta.policy_version"}
BATCH, GROUP = 256, 8
VERSIONS = 100


def make(n: int, start: int, total: int, rng: np.random.Generator) -> list[DataRow]:
    rewards = (rng.random(n) < 0.5).astype(float)
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"p{(start + i) // GROUP}",
                agent_id=f"c{(start + i) % GROUP}",
                step=0,
                policy_version=(start + i) * VERSIONS // total,
            ),
            exp_data=Experience(state={"x": float(i)}, reward_t=float(rewards[i])),
        )
        for i in range(n)
    ]


def build(url: str, name: str, rows: int) -> None:
    """The buffer, unless a complete one of that name is already there (--scratch)."""
    with ReplayBuffer(url, name=name) as buffer:
        if len(buffer) == rows:
            print("  (reusing the buffer built earlier)", flush=True)
            return
        buffer.clear()
        started = time.perf_counter()
        rng = np.random.default_rng(0)
        for start in range(0, rows, 50_000):
            buffer.store_batch(make(min(50_000, rows - start), start, rows, rng))
        buffer.set_policy_version(VERSIONS - 1, force=True)
    engine = create_engine(url)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE expstore_rows"))
    engine.dispose()
    print(f"  (built in {time.perf_counter() - started:.0f} s)", flush=True)


def timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def groups_and_staleness(url: str, name: str, repeat: int) -> None:
    converter = NumpyConverter(CONVERTER)
    with ReplayBuffer(url, name=name) as buffer:
        uniform = UniformSampler(seed=0)
        groups = GroupSampler("task_id", GROUP, seed=0)
        varied = GroupSampler("task_id", GROUP, varied_reward=True, seed=0)
        # the same over the key space (the path taken above GroupSampler.summaries_up_to
        # rows; 1M rows are drawn over the summaries of every group)
        over_keys = GroupSampler("task_id", GROUP, seed=0)
        over_keys.summaries_up_to = 0
        fresh = UniformSampler(seed=0, max_staleness=49)
        recent = UniformSampler(seed=0, max_staleness=4)  # 5% of the rows fresh
        first_uniform = timed(lambda: buffer.sample(uniform, converter=converter, batch_size=BATCH))
        first_groups = timed(lambda: buffer.sample(groups, converter=converter, batch_size=BATCH))
        first_over_keys = timed(
            lambda: buffer.sample(over_keys, converter=converter, batch_size=BATCH)
        )
        buffer.sample(varied, converter=converter, batch_size=BATCH)
        buffer.sample(fresh, converter=converter, batch_size=BATCH)
        first_recent = timed(lambda: buffer.sample(recent, converter=converter, batch_size=BATCH))
        times: dict[str, list[float]] = {
            "uniform": [],
            "groups": [],
            "varied": [],
            "over_keys": [],
            "fresh": [],
            "recent": [],
        }
        samplers = {
            "uniform": uniform,
            "groups": groups,
            "varied": varied,
            "over_keys": over_keys,
            "fresh": fresh,
            "recent": recent,
        }
        for _ in range(repeat):
            for key, sampler in samplers.items():
                times[key].append(
                    timed(lambda s=sampler: buffer.sample(s, converter=converter, batch_size=BATCH))
                )
        batch = buffer.sample(fresh, converter=converter, batch_size=BATCH)
        assert batch["version"].min() >= VERSIONS - 1 - 49
        u = ms(times["uniform"])
        print(f"  first sample(256) after opening, uniform         {first_uniform * 1000:9.1f} ms")
        print(f"  first GroupSampler draw (summarises every group) {first_groups * 1000:9.1f} ms")
        print(
            f"  first GroupSampler draw over the key space       {first_over_keys * 1000:9.1f} ms"
        )
        print(f"  sample(256), UniformSampler                      {u:9.2f} ms")
        for key, label in (
            ("groups", "32 groups of 8"),
            ("varied", "32 varied groups of 8"),
            ("over_keys", "32 groups, over the key space"),
        ):
            g = ms(times[key])
            print(f"  GroupSampler, {label:<33} {g:9.2f} ms  ({g / u:.2f}x; target <= 2x)")
        f = ms(times["fresh"])
        print(
            f"  UniformSampler(max_staleness=49), half fresh      {f:9.2f} ms  "
            f"({f / u:.2f}x; target <= 1.2x)"
        )
        r = ms(times["recent"])
        print(f"  UniformSampler(max_staleness=4), 5% fresh        {r:9.2f} ms  ({r / u:.2f}x)")
        print(f"  first max_staleness=4 draw (finds its bound)     {first_recent * 1000:9.1f} ms")
        # After 64 new rows (8 groups): only those groups are summarised again.
        index = buffer.sql.group_index
        read = index.groups_read
        new = make(64, 10**9, 10**9 + 64, np.random.default_rng(1))
        buffer.store_batch(new)
        after = timed(lambda: buffer.sample(groups, converter=converter, batch_size=BATCH))
        print(
            f"  GroupSampler draw after 64 rows were stored       {after * 1000:9.2f} ms  "
            f"({index.groups_read - read} groups summarised again)"
        )
        version = buffer.policy_version() or 0
        moved = []
        for step in range(5):
            buffer.set_policy_version(version + step + 1)
            moved.append(timed(lambda: buffer.sample(fresh, converter=converter, batch_size=BATCH)))
        buffer.set_policy_version(version, force=True)
        print(f"  max_staleness draw right after the version moved  {ms(moved):9.2f} ms")
        buffer.delete(QueryBuilder().in_("id", [row.id for row in new]).build())


def sampler_loop(url: str, name: str, seconds: float, seed: int, done: Any) -> None:
    converter = NumpyConverter(CONVERTER)
    with ReplayBuffer(url, name=name) as buffer:
        sampler = UniformSampler(seed=seed)
        buffer.sample(sampler, converter=converter, batch_size=BATCH)
        calls, durations = 0, []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            durations.append(
                timed(lambda: buffer.sample(sampler, converter=converter, batch_size=BATCH))
            )
            calls += 1
    done.put((calls, durations))


def concurrent(url: str, name: str, seconds: float, processes: int) -> tuple[float, float, str]:
    spawn = multiprocessing.get_context("spawn")
    done = spawn.Queue()
    watch = LockWatch(url, spawn).start()
    procs = [
        spawn.Process(target=sampler_loop, args=(url, name, seconds, p, done))
        for p in range(processes)
    ]
    for p in procs:
        p.start()
    results = [done.get() for _ in procs]
    for p in procs:
        p.join()
    calls = sum(c for c, _ in results)
    median = ms([d for _, ds in results for d in ds])
    return calls / seconds, median, watch.note("a sampler")


def rate_limits(url: str, name: str, repeat: int, seconds: float) -> None:
    converter = NumpyConverter(CONVERTER)
    budget = RateLimiter(min_size=1, samples_per_insert=1e6, timeout_s=60)
    with ReplayBuffer(url, name=name) as buffer:
        sampler = UniformSampler(seed=0)
        buffer.sample(sampler, converter=converter, batch_size=BATCH)
        free, limited = [], []
        for _ in range(repeat):
            buffer.set_rate_limiter(None)
            free.append(
                timed(lambda: buffer.sample(sampler, converter=converter, batch_size=BATCH))
            )
            buffer.set_rate_limiter(budget)
            limited.append(
                timed(lambda: buffer.sample(sampler, converter=converter, batch_size=BATCH))
            )
        f, lim = ms(free), ms(limited)
        print(
            f"  sample(256) without a rate limit / with one     {f:9.2f} / {lim:.2f} ms "
            f"(+{lim - f:.2f} ms per call)"
        )
        for limit in (None, budget):
            buffer.set_rate_limiter(limit)
            rate, median, note = concurrent(url, name, seconds, 4)
            label = "with a rate limit" if limit else "without a limit "
            print(f"  4 samplers {label}: {rate:8,.0f} calls/s, median {median:.2f} ms{note}")
        stats = buffer.rate_limit_stats()
        assert stats is not None
        print(f"  (the limit counted {stats.sampled:,} rows sampled, all of them)")
        buffer.set_rate_limiter(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--scratch", default=None, help="folder to keep the SQLite file in")
    parser.add_argument("--no-rate-limits", action="store_true", help="groups and staleness only")
    args = parser.parse_args()
    scratch = Path(args.scratch or "/tmp/expstore-bench")
    scratch.mkdir(parents=True, exist_ok=True)
    for backend in args.backends.split(","):
        url = f"sqlite:///{scratch / 'coordination.db'}" if backend == "sqlite" else args.pg_url
        name = f"bench_coordination_{args.rows}"
        print(f"== {backend}: {args.rows:,} rows in groups of {GROUP} ==", flush=True)
        build(url, name, args.rows)
        groups_and_staleness(url, name, args.repeat)
        if not args.no_rate_limits:
            rate_limits(url, name, args.repeat, args.seconds)


if __name__ == "__main__":
    main()
