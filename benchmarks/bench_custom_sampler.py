"""A sampler written against the public primitives alone, against the built-ins' cost.

``examples/long_messages_sampler.py``'s ``LongMessagesSampler`` (rows in proportion to
their messages, by rejection over the key space) against ``RewardWeightedSampler`` (the
built-in that draws the same way, by a column instead of a payload path) and
``UniformSampler``, at 1M rows of 0-15 messages each, on SQLite and Postgres, with and
without a condition (half the rows). Each figure: the first ``sample(256)`` of a fresh
process-level handle, then the median of ``--repeats`` warm ones, samplers taking turns.

    python benchmarks/bench_custom_sampler.py --rows 1000000 \
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres

The data sets are built once into ``--scratch`` (SQLite) and a database ``bench_custom``
(Postgres) and reused.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from expstore import QueryBuilder, ReplayBuffer
from expstore.samplers import RewardWeightedSampler, UniformSampler

ROOT = Path(__file__).resolve().parents[1]
BATCH = 256


def _example() -> Any:
    path = ROOT / "examples" / "long_messages_sampler.py"
    spec = importlib.util.spec_from_file_location("long_messages", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _pg_database(server: str, name: str) -> str:
    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
        if exists.first() is None:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return server.rsplit("/", 1)[0] + "/" + name


def build(url: str, rows: int, example: Any) -> None:
    with ReplayBuffer(url, name="custom") as buffer:
        have = len(buffer)
        if have >= rows:
            return
        started = time.perf_counter()
        step = 20_000
        for start in range(have, rows, step):
            batch = example.rows_with_messages(min(step, rows - start), seed=start)
            buffer.store_batch(batch)
        print(f"  built {rows - have} rows in {time.perf_counter() - started:.0f} s")


def measure(url: str, repeats: int, example: Any) -> list[tuple[str, str, float, float]]:
    agent1 = QueryBuilder().eq("agent_id", "agent1").build()
    makers = {
        "uniform": lambda: UniformSampler(seed=0),
        "reward_weighted": lambda: RewardWeightedSampler(temperature=2.0, seed=0),
        "long_messages": lambda: example.LongMessagesSampler(cap=15, seed=0),
    }
    out = []
    for condition_name, condition in (("all rows", None), ("agent1 (half)", agent1)):
        samplers = {}
        first = {}
        with ReplayBuffer(url, name="custom") as buffer:
            for name, make in makers.items():
                samplers[name] = make()
                t0 = time.perf_counter()
                buffer.sample(samplers[name], condition, batch_size=BATCH)
                first[name] = time.perf_counter() - t0
            warm: dict[str, list[float]] = {name: [] for name in makers}
            for _ in range(repeats):
                for name, sampler in samplers.items():  # taking turns
                    t0 = time.perf_counter()
                    rows = buffer.sample(sampler, condition, batch_size=BATCH)
                    warm[name].append(time.perf_counter() - t0)
                    assert len(rows) == BATCH
            for name in makers:
                out.append((condition_name, name, first[name], statistics.median(warm[name])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--scratch", default="/work/scratch/bench_custom")
    parser.add_argument("--pg", default=None, help="a Postgres server URL (its postgres db)")
    args = parser.parse_args()
    example = _example()
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    urls = {"sqlite": f"sqlite:///{args.scratch}/custom_{args.rows}.db"}
    if args.pg:
        urls["postgres"] = _pg_database(args.pg, f"bench_custom_{args.rows}")
    for backend, url in urls.items():
        print(f"{backend}, {args.rows} rows:")
        build(url, args.rows, example)
        results = measure(url, args.repeats, example)
        print(f"  {'rows':<15}{'sampler':<17}{'first ms':>10}{'warm ms':>10}{'x builtin':>11}")
        builtin = {c: w for c, n, _, w in results if n == "reward_weighted"}
        for condition, name, first, warm in results:
            ratio = warm / builtin[condition]
            print(
                f"  {condition:<15}{name:<17}{first * 1000:>10.1f}{warm * 1000:>10.2f}"
                f"{ratio:>10.2f}x"
            )


if __name__ == "__main__":
    main()
