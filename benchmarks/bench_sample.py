"""Benchmark: sample(256) with TensorConverter, against the floor measured in the same run.

Each row holds a 1,024-element float32 tensor (``exp_data.state.image_features``). For each
backend it times ``buffer.sample(sampler, condition, TensorConverter(...), 256)``:

- unfiltered and filtered to 10% of tasks (``exp_meta.task_name == "group3"``),
- with ``UniformSampler`` and ``PrioritizedSampler``,

beside the floor: numpy picks 256 keys from an array already in memory, one
``SELECT key, tensors ... WHERE key IN (...)`` on a raw DB-API connection to the same
database (no SQLAlchemy), ``np.frombuffer`` and a stack into one tensor. Targets: within
1.5x of the floor; filtered no slower than 1.2x unfiltered.

Usage::

    python benchmarks/bench_sample.py                      # 1,000,000 rows, both backends
    python benchmarks/bench_sample.py 100000 --backends sqlite
    python benchmarks/bench_sample.py --pg-url postgresql+psycopg://postgres@127.0.0.1/postgres

The database is built once (``store_batch`` in chunks of 10,000) and reused by later runs
with the same row count (SQLite: ``--sqlite-path``; Postgres: buffer ``bench_<rows>``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sqlalchemy import func, select

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.codec import HEADER_SIZE
from expstore.converters import TensorConverter
from expstore.db.schema import rows as rows_table
from expstore.query import QueryBuilder
from expstore.samplers import PrioritizedSampler, UniformSampler
from expstore.storage import create_sql_engine

DIM = 1024
BATCH = 256
CHUNK = 10_000
STEPS_PER_TASK = 10
GROUPS = 10  # task_name groups; one group is 10% of the tasks
PRIORITIZED_ROWS = 10_000  # rows given an explicit priority (the rest count as the maximum)


def build(buffer: ReplayBuffer, n: int) -> None:
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for first in range(0, n, CHUNK):
        count = min(CHUNK, n - first)
        features = rng.random((count, DIM), dtype=np.float32)
        batch = []
        for j in range(count):
            i = first + j
            task = i // STEPS_PER_TASK
            batch.append(
                DataRow(
                    exp_meta=ExpMeta(
                        task_id=f"task{task}",
                        task_name=f"group{task % GROUPS}",
                        agent_id=f"agent{task % 4}",
                        step=i % STEPS_PER_TASK,
                    ),
                    exp_data=Experience(
                        state={"image_features": features[j]}, reward_t=float(rng.random())
                    ),
                )
            )
        buffer.store_batch(batch)
        done = first + count
        if done % 100_000 == 0 or done == n:
            rate = done / (time.perf_counter() - start)
            print(f"  stored {done:,} rows ({rate:,.0f} rows/s)", flush=True)
    chosen = rng.choice(n, size=min(PRIORITIZED_ROWS, n), replace=False)
    ids = [r.id for r in buffer.storage.fetch_keys(_all_keys(buffer)[chosen])]
    buffer.update_priorities(ids, rng.random(len(ids)) * 10)


def _all_keys(buffer: ReplayBuffer, condition: Any = None) -> np.ndarray:
    return np.array(buffer.storage.key_index(condition)["key"])


class Floor:
    """numpy picks keys; one ``SELECT key, tensors ... WHERE key IN (...)`` on the driver's
    own connection (no SQLAlchemy, no pool); ``np.frombuffer``; a stack into one tensor."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        engine = create_sql_engine(buffer.storage.url)  # the same database
        self.connection = engine.raw_connection()
        self.mark = "?" if engine.dialect.name == "sqlite" else "%s"

    def fetch(
        self, keys: np.ndarray, rng: np.random.Generator, columns: str
    ) -> tuple[list[int], list[Any]]:
        """BATCH keys picked from ``keys``, and ``columns`` of their rows (key first)."""
        chosen = keys[rng.integers(0, len(keys), BATCH)].tolist()
        unique = list(dict.fromkeys(chosen))
        sql = (
            f"SELECT {columns} FROM {rows_table.name} "
            f"WHERE key IN ({', '.join([self.mark] * len(unique))})"
        )
        cursor = self.connection.cursor()
        cursor.execute(sql, unique)
        fetched = cursor.fetchall()
        cursor.close()
        return chosen, fetched

    def __call__(self, keys: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        chosen, fetched = self.fetch(keys, rng, "key, tensors")
        found = dict(fetched)
        out = np.stack([np.frombuffer(found[k], np.float32, DIM, HEADER_SIZE) for k in chosen])
        return torch.from_numpy(out)

    def close(self) -> None:
        self.connection.close()


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds per call after two warm-up calls."""
    return interleaved({"fn": fn}, repeats)["fn"]


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, run round-robin (rotating the order each
    round) so that all of them meet the same cache and disk conditions."""
    for fn in fns.values():
        fn()
        fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def prewarm(buffer: ReplayBuffer, url: str) -> None:
    """Read the whole table once, so timings measure the sampling path, not the disk."""
    start = time.perf_counter()
    if url.startswith("sqlite:///"):
        with open(url.removeprefix("sqlite:///"), "rb") as f:
            while f.read(1 << 24):
                pass
    else:
        engine = create_sql_engine(buffer.storage.url)
        # get_byte() detoasts each blob (length() would read only the TOAST pointer).
        stmt = select(func.count(), func.sum(func.get_byte(rows_table.c.tensors, 0)))
        with engine.connect() as conn:
            conn.execute(stmt).one()
    print(f"  prewarmed the page cache in {time.perf_counter() - start:.1f} s", flush=True)


def run_backend(label: str, url: str, n: int, repeats: int) -> dict[str, float]:
    buffer = ReplayBuffer(url, name=f"bench_{n}")
    have = buffer.count()
    if have != n:
        if have:
            buffer.clear()
        print(f"{label}: building {n:,} rows ...", flush=True)
        build(buffer, n)
    else:
        print(f"{label}: reusing {n:,} rows", flush=True)
    prewarm(buffer, url)
    converter = TensorConverter({"image_features": "exp_data.state.image_features"})
    condition = QueryBuilder().eq("exp_meta.task_name", "group3").build()
    rng = np.random.default_rng(1)
    results: dict[str, float] = {}

    buffer.storage.close()
    buffer = ReplayBuffer(url, name=f"bench_{n}")  # an empty key-index cache
    start = time.perf_counter()
    buffer.sample(UniformSampler(seed=0), None, converter, BATCH)
    results["cold first sample (builds the key index)"] = time.perf_counter() - start

    fns: dict[str, Callable[[], Any]] = {}
    floor = Floor(buffer)
    for where, cond in (("unfiltered", None), ("filtered", condition)):
        fns[f"floor {where}"] = partial(floor, _all_keys(buffer, cond), rng)
        fns[f"uniform {where}"] = partial(
            buffer.sample, UniformSampler(seed=0), cond, converter, BATCH
        )
        fns[f"prioritized {where}"] = partial(
            buffer.sample, PrioritizedSampler(seed=0), cond, converter, BATCH
        )
    results.update(interleaved(fns, repeats))
    floor.close()

    # Where the time of one uniform unfiltered sample goes.
    keys = _all_keys(buffer)
    chosen = keys[rng.integers(0, len(keys), BATCH)]
    fetched = buffer.storage.fetch_keys(chosen)
    results["  part: key_index() freshness check"] = timed(buffer.storage.key_index, repeats)
    results["  part: fetch_keys(256) -> DataRows"] = timed(
        partial(buffer.storage.fetch_keys, chosen), repeats
    )
    results["  part: TensorConverter on 256 rows"] = timed(
        partial(converter.to_dataset_row, fetched), repeats
    )

    # A PER training step: sample, then write back priorities for the batch.
    per = PrioritizedSampler(seed=0)

    def per_step() -> None:
        batch = buffer.sample(per, None, converter, BATCH)
        buffer.update_priorities(batch["ids"], np.ones(len(batch["ids"])))

    results["prioritized step incl. update_priorities"] = timed(per_step, 5)
    buffer.close()
    return results


def report(label: str, r: dict[str, float]) -> None:
    print(f"\n== {label} ==")
    for name, seconds in r.items():
        print(f"  {name:<44} {seconds * 1000:9.2f} ms")
    print("  ratios (target: vs floor <= 1.5, filtered/unfiltered <= 1.2)")
    for sampler in ("uniform", "prioritized"):
        for where in ("unfiltered", "filtered"):
            ratio = r[f"{sampler} {where}"] / r[f"floor {where}"]
            print(f"    {sampler} {where} / floor {where}: {ratio:5.2f}x")
        ratio = r[f"{sampler} filtered"] / r[f"{sampler} unfiltered"]
        print(f"    {sampler} filtered / unfiltered:   {ratio:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument(
        "--sqlite-path", default=None, help="default: /tmp/expstore_bench_<rows>.db"
    )
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    sqlite_path = args.sqlite_path or Path("/tmp") / f"expstore_bench_{args.rows}.db"
    urls = {
        "sqlite": f"sqlite:///{sqlite_path}",
        "postgres": args.pg_url,
    }
    print(f"sample({BATCH}) with TensorConverter over {args.rows:,} rows of {DIM} float32")
    for backend in args.backends.split(","):
        report(backend, run_backend(backend, urls[backend], args.rows, args.repeats))


if __name__ == "__main__":
    main()
