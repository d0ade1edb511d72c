"""Benchmark: a full buffer in steady state, one writer and one sampler.

The usual replay-buffer loop once the buffer is full: an actor stores a batch (evicting the
oldest rows, FIFO), the trainer samples 256 rows. Both handles are open on the same
database, as two processes would be. For each backend it prints, in ms per step:

- ``store``: the actor's ``store_batch`` of ``--write`` rows (the eviction included);
- ``sample after a write``: the trainer's ``sample(256)`` with TensorConverter right after
  that write, which must bring its cached key index up to date;
- ``sample, no write``: the same sample on an unchanged buffer (the cached index as it is);
- ``full index read``: what reading the whole key index again costs (what every sample
  after a write paid before FIFO eviction was followed from the buffer's min key).

The ratio ``sample after a write / sample, no write`` says what keeping the index current
costs; the index read shows what it would cost to reload it instead.

Usage::

    python benchmarks/bench_steady.py                    # 100,000 rows, both backends
    python benchmarks/bench_steady.py --rows 20000 --backends sqlite
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.converters import TensorConverter
from expstore.samplers import UniformSampler

DIM = 1024


def rows(n: int, start: int, rng: np.random.Generator) -> list[DataRow]:
    features = rng.random((n, DIM), dtype=np.float32)
    return [
        DataRow(
            exp_meta=ExpMeta(
                task_id=f"task{(start + i) // 10}", agent_id="a", step=(start + i) % 10
            ),
            exp_data=Experience(state={"image_features": features[i]}, reward_t=1.0),
        )
        for i in range(n)
    ]


def run(label: str, url: str, capacity: int, write: int, steps: int) -> None:
    name = f"steady_{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(0)
    converter = TensorConverter({"image_features": "exp_data.state.image_features"})
    sampler = UniformSampler(seed=0)
    with (
        ReplayBuffer(url, name=name, capacity=capacity) as actor,
        ReplayBuffer(url, name=name) as trainer,
    ):
        for start in range(0, capacity, 10_000):
            actor.store_batch(rows(min(10_000, capacity - start), start, rng))
        trainer.sample(sampler, None, converter, 256)  # builds the trainer's key index
        batches = [rows(write, capacity + i * write, rng) for i in range(steps)]
        store, after, still = [], [], []
        for batch in batches:
            t0 = time.perf_counter()
            actor.store_batch(batch)
            t1 = time.perf_counter()
            trainer.sample(sampler, None, converter, 256)
            t2 = time.perf_counter()
            trainer.sample(sampler, None, converter, 256)
            t3 = time.perf_counter()
            store.append(t1 - t0)
            after.append(t2 - t1)
            still.append(t3 - t2)
        reads = []
        for _ in range(3):
            with ReplayBuffer(url, name=name) as fresh:
                t0 = time.perf_counter()
                fresh.storage.key_index()
                reads.append(time.perf_counter() - t0)
        assert len(trainer) == capacity
        trainer.clear()

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    print(f"\n== {label}: {capacity:,} rows held, {write} written per step, {steps} steps ==")
    for what, value in (
        (f"store ({write} rows, evicting {write})", ms(store)),
        ("sample after a write", ms(after)),
        ("sample, no write", ms(still)),
        ("full index read (what a reload costs)", ms(reads)),
    ):
        print(f"  {what:<44}{value:9.2f} ms")
    print(f"  ratio sample after a write / no write: {ms(after) / ms(still):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="the buffer's capacity")
    parser.add_argument("--write", type=int, default=64, help="rows stored per step")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = {"sqlite": f"sqlite:///{Path(tmp) / 'steady.db'}", "postgres": args.pg_url}
        for backend in args.backends.split(","):
            run(backend, urls[backend], args.rows, args.write, args.steps)


if __name__ == "__main__":
    main()
