"""Benchmark: writing a batch of columns (``buffer.extend``) against building DataRows and
against the raw insert floor, measured in one run (issue: Ecosystem, item 1).

Data: what a vectorised environment hands over per step, ``--rows`` rows (default 20,000):
``obs`` float32 ``[N, 16]``, an action, a reward and a done per row, task ids ``env<i>``,
one agent id. For each backend (a fresh SQLite file; a fresh Postgres database):

- ``extend``: ``buffer.extend(columns)``;
- ``DataRows``: building a DataRow per row from the same columns (pydantic validation),
  then ``store_batch`` of them; and the building alone;
- the floor: the same rows, already encoded, inserted by raw ``sqlite3`` executemany in
  one transaction / psycopg ``COPY ... FORMAT BINARY`` (``bench_store.py``'s floors).

Targets: extend ≥ 0.7x the floor's rate; ≥ 10x faster than building the DataRows.

    python benchmarks/bench_extend.py [--rows 20000] [--pg URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import DEFAULT_PG, drop_pg, encoded, fresh_pg, pg_floor, sqlite_floor  # noqa: E402

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer  # noqa: E402


def columns(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "task_id": [f"env{i}-{seed}" for i in range(n)],
        "agent_id": "policy",
        "step": seed,
        "state": {"obs": rng.random((n, 16), dtype=np.float32)},
        "actions": rng.integers(0, 4, n),
        "reward_t": rng.random(n),
        "done": rng.random(n) < 0.05,
    }


def as_rows(cols: dict) -> list[DataRow]:
    obs, actions = cols["state"]["obs"], cols["actions"].tolist()
    rewards, dones = cols["reward_t"].tolist(), cols["done"].tolist()
    return [
        DataRow(
            exp_meta=ExpMeta(task_id=task, agent_id=cols["agent_id"], step=cols["step"]),
            exp_data=Experience(
                state={"obs": obs[i]}, actions=actions[i], reward_t=rewards[i], done=dones[i]
            ),
        )
        for i, task in enumerate(cols["task_id"])
    ]


def run(label: str, url: str, n: int, repeats: int, floor) -> None:  # noqa: ANN001
    ext, rows_total, build, floors = [], [], [], []
    with ReplayBuffer(url, name="extend") as a, ReplayBuffer(url, name="rows") as b:
        for r in range(repeats):
            cols = columns(n, 2 * r)
            t0 = time.perf_counter()
            a.extend(cols)
            ext.append(time.perf_counter() - t0)
            cols = columns(n, 2 * r + 1)
            t0 = time.perf_counter()
            rows = as_rows(cols)
            t1 = time.perf_counter()
            b.store_batch(rows)
            t2 = time.perf_counter()
            build.append(t1 - t0)
            rows_total.append(t2 - t0)
            floors.append(floor(encoded(rows)))
        assert len(a) == len(b) == n * repeats
    e, t, bu, f = (statistics.median(x) for x in (ext, rows_total, build, floors))
    print(
        f"{label}: {n:,} rows, medians of {repeats}\n"
        f"  extend(columns)          {n / e:>10,.0f} rows/s ({e * 1e3:.0f} ms)\n"
        f"  DataRows + store_batch   {n / t:>10,.0f} rows/s ({t * 1e3:.0f} ms; building alone "
        f"{bu * 1e3:.0f} ms)\n"
        f"  raw insert floor         {n / f:>10,.0f} rows/s ({f * 1e3:.0f} ms)\n"
        f"  extend / floor rate {f / e:.2f}x (target >= 0.7); DataRows + store / extend "
        f"{t / e:.1f}x; building DataRows alone / extend {bu / e:.1f}x (target >= 10)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pg", default=DEFAULT_PG)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(10_000))
        run(
            "sqlite",
            f"sqlite:///{tmp}/extend.db",
            args.rows,
            args.repeats,
            lambda data: sqlite_floor(f"{tmp}/floor{next(counter)}.db", data),
        )
    url, handle = fresh_pg(args.pg)
    try:
        run("postgres", url, args.rows, args.repeats, lambda data: pg_floor(url, data))
    finally:
        drop_pg(handle)


if __name__ == "__main__":
    main()
