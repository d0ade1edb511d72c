"""Benchmark: sampling cost and memory as the buffer grows (issue: Scale I).

For buffers of 100k, 1M and 10M small rows (built once by ``scale_data.py`` into a scratch
directory / scratch databases and reused), on SQLite and Postgres, each figure is taken in
a fresh process (nothing cached, nothing shared with another measurement):

- ``first``: the first ``sample(256)`` after opening the buffer (whole rows, the default
  converter), for uniform, uniform filtered by agent (10%), filtered by a JSON path (10%,
  ``exp_data.state.difficulty == 3``, no index on it), recency (power 1), prioritized (10%
  of the rows hold a priority), stratified by agent (10 agents), slices of 4 steps, and
  epochs (uniform without replacement) over the whole buffer and over one agent's rows,
  groups (GroupSampler: 32 tasks of 8 rows whose rewards vary), uniform with
  ``consume_after=2`` (each draw counted in the database) and uniform with
  ``max_staleness`` 49 and 4 (half and 5% of the rows fresh: policy versions 0-99 grow
  with insertion);
- ``rss``: the growth of that process's resident memory from before opening the buffer to
  after the first sample and 30 more;
- ``warm``: the median of 30 more ``sample(256)`` calls;
- the same with ``sampler.flat = False`` (the key-index path every sampler used before),
  where it finishes in reasonable time (see ``--index-up-to``);
- ``update_priorities(256)`` (median of 30, each time the ids of a new prioritized batch);
- ``expstore stats`` computed over the buffer;
- DataLoader start-up: 4 workers (fork) of ``SampledBatches`` with a uniform sampler,
  from creating the iterator to the first batch of every worker.

With ``--prewarm`` the data set is read into the operating system's page cache first
(Postgres: ``pg_prewarm(..., 'buffer')`` of every expstore table and index, into shared
buffers as far as they reach and the page cache; SQLite: the
file read through once), so that what is measured at 10M is the work per sample with the
data in memory, as at 100k, rather than this machine's disk; without it a figure at 10M
depends on what earlier work left cached.

Ratios (10M over 100k) are printed at the end of each backend. Usage::

    python benchmarks/scale_data.py                     # build the data sets once
    python benchmarks/bench_scale.py                    # 100k, 1M, 10M on both backends
    python benchmarks/bench_scale.py --sizes 100000 --backends sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

REPEATS = 30
BATCH = 256

SAMPLERS = (
    "uniform",
    "by_agent",
    "by_json_path",
    "recency",
    "prioritized",
    "stratified",
    "slice",
    "epochs",
    "epochs_by_agent",
    "groups",
    "consume",
    "fresh_half",
    "fresh_5pct",
    "prioritized_by_agent",
    "prioritized_by_json_path",
    "prioritized_fresh",
    "stratified_by_json_path",
    "stratified_fresh",
)


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _sampler(name: str, flat: bool) -> tuple[Any, Any]:
    from expstore.query import QueryBuilder
    from expstore.samplers import (
        GroupSampler,
        PrioritizedSampler,
        RecencySampler,
        SliceSampler,
        StratifiedSampler,
        UniformSampler,
    )

    condition = None
    if name.endswith("by_agent"):
        condition = QueryBuilder().eq("exp_meta.agent_id", "agent3").build()
    elif name.endswith("by_json_path"):
        condition = QueryBuilder().eq("exp_data.state.difficulty", 3).build()
    sampler = {
        "recency": lambda: RecencySampler(power=1.0, seed=0),
        "prioritized": lambda: PrioritizedSampler(seed=0),
        "stratified": lambda: StratifiedSampler(by="exp_meta.agent_id", seed=0),
        # windows of 4 consecutive steps (5 per task of 8 steps)
        "slice": lambda: SliceSampler(4, seed=0),
        # uniform without replacement: each (matching) row once per epoch
        "epochs": lambda: UniformSampler(replacement=False, seed=0),
        "epochs_by_agent": lambda: UniformSampler(replacement=False, seed=0),
        # GRPO: 32 whole tasks of 8 rows whose rewards vary, distinct in a batch
        "groups": lambda: GroupSampler("task_id", 8, varied_reward=True, seed=0),
        # each row drawn at most twice, counted in the database (the counts are removed
        # after the measurement)
        "consume": lambda: UniformSampler(seed=0, consume_after=2),
        # asynchronous RL: rows at most 49 / 4 policy versions behind the current one (the
        # data sets' versions 0-99 grow with insertion: half / 5% of the rows fresh)
        "fresh_half": lambda: UniformSampler(seed=0, max_staleness=49),
        "fresh_5pct": lambda: UniformSampler(seed=0, max_staleness=4),
        # prioritized under a condition and under max_staleness (5% fresh), over the
        # priorities the data set holds (every tenth key's, one agent's) and those the
        # prioritized measurement set
        "prioritized_by_agent": lambda: PrioritizedSampler(seed=0),
        "prioritized_by_json_path": lambda: PrioritizedSampler(seed=0),
        "prioritized_fresh": lambda: PrioritizedSampler(seed=0, max_staleness=4),
        # stratified by agent under a condition and under max_staleness (5% fresh)
        "stratified_by_json_path": lambda: StratifiedSampler(by="exp_meta.agent_id", seed=0),
        "stratified_fresh": lambda: StratifiedSampler(
            by="exp_meta.agent_id", seed=0, max_staleness=4
        ),
    }.get(name, lambda: UniformSampler(seed=0))()
    sampler.flat = flat
    if name == "groups" and flat:
        sampler.summaries_up_to = 0  # over the key space at every size, to compare sizes
    return sampler, condition


def child_sample(url: str, name: str, flat: bool) -> dict[str, Any]:
    from expstore import ReplayBuffer

    sampler, condition = _sampler(name, flat)
    before = _rss_mib()
    started = time.perf_counter()
    with ReplayBuffer(url, name="scale") as buffer:
        buffer.sample(sampler, condition, batch_size=BATCH)
        first = time.perf_counter() - started
        times = []
        index = buffer.storage.index  # type: ignore[attr-defined]
        spaces = buffer.storage.spaces  # type: ignore[attr-defined]
        probed, read = spaces.keys_probed, index.rows_read
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            rows = buffer.sample(sampler, condition, batch_size=BATCH)
            times.append(time.perf_counter() - t0)
        # (with consume_after a row drawn twice in a batch is returned once)
        assert len(rows) == BATCH or (name == "consume" and len(rows) > BATCH - 8)
        out = {
            "first": first,
            "warm": statistics.median(times),
            "rss": _rss_mib() - before,
            # rows the database looks at per warm sample: candidate keys probed, key-index
            # rows read, and the batch fetched
            "touched": (spaces.keys_probed - probed + index.rows_read - read) / REPEATS + BATCH,
        }
        if name == "prioritized" and flat:
            # A training loop: each step a new batch, then new priorities for its rows.
            rng = __import__("numpy").random.default_rng(0)
            times = []
            for _ in range(REPEATS):
                buffer.sample(sampler, condition, batch_size=BATCH)
                ids = list(sampler.last_ids)
                t0 = time.perf_counter()
                buffer.update_priorities(ids, rng.random(len(ids)) * 5)
                times.append(time.perf_counter() - t0)
            out["update_priorities"] = statistics.median(times)
        if name == "consume":
            _forget_draws(buffer)
    return out


def _forget_draws(buffer: Any) -> None:
    """Remove the draw counts a consume_after measurement left in the data set."""
    from sqlalchemy import delete

    from expstore.db.schema import sample_counts

    handle = buffer.storage._handle
    with handle.write() as conn:
        conn.execute(delete(sample_counts).where(sample_counts.c.buffer_id == handle.buffer_id))


def child_stats(url: str) -> dict[str, Any]:
    from expstore import ReplayBuffer
    from expstore.cli.stats import compute_stats

    before = _rss_mib()
    started = time.perf_counter()
    with ReplayBuffer(url, name="scale") as buffer:
        stats = compute_stats(buffer)
    assert stats["rows"] > 0
    return {"stats": time.perf_counter() - started, "stats_rss": _rss_mib() - before}


def child_loader(url: str, flat: bool = True) -> dict[str, Any]:
    from expstore import ReplayBuffer
    from expstore.samplers import UniformSampler
    from expstore.torch_data import SampledBatches

    with ReplayBuffer(url, name="scale") as buffer:
        sampler = UniformSampler(seed=0)
        sampler.flat = flat
        batches = SampledBatches(buffer, sampler, BATCH, num_batches=8)
        started = time.perf_counter()
        got = list(batches.loader(num_workers=4, multiprocessing_context="fork"))
        elapsed = time.perf_counter() - started
    assert len(got) == 8
    return {"loader": elapsed}


def _run_child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def ensure_priorities(url: str) -> None:
    """Give 10% of the rows a priority (every tenth key, values 0-9.99), once."""
    from sqlalchemy import create_engine, insert, select, update

    from expstore.db.schema import buffers, priorities, rows

    engine = create_engine(url)
    with engine.begin() as conn:
        buffer_id = conn.execute(select(buffers.c.id).where(buffers.c.name == "scale")).scalar_one()
        mine = rows.c.buffer_id == buffer_id
        if conn.execute(
            select(priorities.c.key).where(priorities.c.buffer_id == buffer_id).limit(1)
        ).first():
            return
        conn.execute(
            insert(priorities).from_select(
                ["key", "buffer_id", "priority"],
                select(rows.c.key, rows.c.buffer_id, (rows.c.key % 1000) / 100.0).where(
                    mine, rows.c.key % 10 == 0
                ),
            )
        )
        conn.execute(
            update(buffers).where(buffers.c.id == buffer_id).values(version=buffers.c.version + 1)
        )
    engine.dispose()


def prewarm(url: str) -> float:
    """Read the data set at ``url`` into the page cache; returns the seconds it took."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    started = time.perf_counter()
    if url.startswith("sqlite"):
        path = make_url(url).database
        assert path is not None
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    else:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_prewarm"))
            conn.execute(
                text(
                    "SELECT pg_prewarm(c.oid::regclass, 'buffer') FROM pg_class c "
                    "WHERE c.relname LIKE 'expstore%' AND c.relkind IN ('r', 'i')"
                )
            )
        engine.dispose()
    return time.perf_counter() - started


def run(
    backend: str,
    sizes: list[int],
    scratch: Path,
    pg_url: str,
    index_up_to: int,
    samplers: tuple[str, ...] = SAMPLERS,
    extras: bool = True,
    warm_first: bool = False,
    rounds: int = 1,
) -> None:
    from scale_data import built, dataset_url

    urls = {n: built(dataset_url(backend, n, scratch, pg_url), n) for n in sizes}
    for n, url in urls.items():
        ensure_priorities(url)
        if warm_first:
            print(f"{backend} {n:,}: read into the page cache in {prewarm(url):.1f} s")
    # The flat samplers' figures, sizes taking turns for each sampler and round, so that
    # the machine's drift (other work, what is cached) falls on every size alike; each
    # figure is the median over the rounds.
    taken: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for name in samplers:
            for n, url in urls.items():
                taken.setdefault((n, name), []).append(_run_child(url, name, "flat"))
    table: dict[int, dict[str, Any]] = {}
    for n, url in urls.items():
        figures: dict[str, Any] = {}
        for name in samplers:
            runs = taken[(n, name)]
            figures[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            if n <= index_up_to:
                figures[name + ":index"] = _run_child(url, name, "index")
        if extras:
            figures["stats"] = _run_child(url, "stats", "-")
            figures["loader"] = _run_child(url, "loader", "flat")
            if n <= index_up_to:
                figures["loader:index"] = _run_child(url, "loader", "index")
        table[n] = figures
        print(f"\n{backend}, {n:,} rows")
        print(f"{'sampler':<24}{'first ms':>10}{'warm ms':>10}{'RSS MiB':>10}")
        for name, f in figures.items():
            if "first" in f:
                print(
                    f"{name:<24}{f['first'] * 1e3:>10.1f}{f['warm'] * 1e3:>10.2f}{f['rss']:>10.1f}"
                )
        if "prioritized" in figures:
            update = figures["prioritized"]["update_priorities"]
            print(f"update_priorities(256): {update * 1e3:.2f} ms")
        if extras:
            s = figures["stats"]
            print(f"stats: {s['stats']:.2f} s, RSS +{s['stats_rss']:.0f} MiB")
            print(f"DataLoader, 4 workers, first 8 batches: {figures['loader']['loader']:.2f} s")
        if "loader:index" in figures:
            print(f"  the same over the key index: {figures['loader:index']['loader']:.2f} s")
    if len(sizes) > 1:
        small, large = table[sizes[0]], table[sizes[-1]]
        print(f"\n{backend}: {sizes[-1]:,} rows over {sizes[0]:,} rows")
        for name in samplers:
            touched = large[name].get("touched", 0) / max(small[name].get("touched", 1), 1)
            print(
                f"  {name:<14} warm {large[name]['warm'] / small[name]['warm']:.2f}x, "
                f"first {large[name]['first'] / small[name]['first']:.2f}x, "
                f"rows touched per sample {touched:.2f}x"
            )
        if "prioritized" in samplers:
            ratio = (
                large["prioritized"]["update_priorities"]
                / small["prioritized"]["update_priorities"]
            )
            print(f"  update_priorities {ratio:.2f}x")
    print(json.dumps({str(k): v for k, v in table.items()}), flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, what, path = sys.argv[2:5]
        if what == "stats":
            out = child_stats(url)
        elif what == "loader":
            out = child_loader(url, path == "flat")
        else:
            out = child_sample(url, what, path == "flat")
        print(json.dumps(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--scratch", type=Path, default=Path("/work/scratch"))
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--index-up-to",
        type=int,
        default=1_000_000,
        help="also measure the key-index path up to this many rows",
    )
    parser.add_argument("--samplers", default=",".join(SAMPLERS), help="which samplers")
    parser.add_argument(
        "--no-extras", action="store_true", help="leave out stats and DataLoader start-up"
    )
    parser.add_argument(
        "--prewarm", action="store_true", help="read each data set into the page cache first"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="median of this many runs per sampler and size"
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for backend in args.backends.split(","):
        run(
            backend,
            [int(s) for s in args.sizes.split(",")],
            args.scratch,
            args.pg_url,
            args.index_up_to,
            tuple(args.samplers.split(",")),
            not args.no_extras,
            args.prewarm,
            args.rounds,
        )


if __name__ == "__main__":
    main()
