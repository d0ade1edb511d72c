"""Several processes writing one buffer at once.

AWorld shares a buffer between processes with a multiprocessing Manager; here every process
opens the same database and writes its own rows. SQLite (WAL mode, writers queue for the
write lock) is fine on one machine; Postgres when the writers are on many.

    python examples/multiprocess_writers.py                       # a SQLite file in a temp dir
    python examples/multiprocess_writers.py --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

import numpy as np

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.query import QueryBuilder


def write_processing(url: str, buffer_name: str, worker: int, tasks: int, steps: int) -> None:
    """One writer: its own connection, one transaction per finished task."""
    buffer = ReplayBuffer(url, name=buffer_name)
    rng = np.random.default_rng(worker)
    for t in range(tasks):
        task_id = f"w{worker}-task{t}"
        rows = [
            DataRow(
                exp_meta=ExpMeta(task_id=task_id, agent_id=f"worker_{worker}", step=s),
                exp_data=Experience(
                    state={"obs": rng.standard_normal(16).astype(np.float32)},
                    actions=[int(rng.integers(4))],
                    reward_t=float(rng.random()),
                    done=s == steps - 1,
                ),
            )
            for s in range(steps)
        ]
        buffer.store_batch(rows)  # the whole trajectory, atomically
    buffer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--buffer", default="multiprocess_example")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'shared.db'}"
        with ReplayBuffer(url, name=args.buffer) as buffer:
            buffer.clear()

        started = time.perf_counter()
        context = multiprocessing.get_context("spawn")  # works the same on every platform
        processes = [
            context.Process(
                target=write_processing,
                args=(url, args.buffer, worker, args.tasks, args.steps),
            )
            for worker in range(args.workers)
        ]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
        if any(p.exitcode != 0 for p in processes):
            raise SystemExit("a writer failed")
        seconds = time.perf_counter() - started

        with ReplayBuffer(url, name=args.buffer) as buffer:
            expected = args.workers * args.tasks * args.steps
            print(
                f"{args.workers} processes wrote {len(buffer)} rows ({expected} expected) "
                f"in {seconds:.1f} s"
            )
            for worker in range(args.workers):
                mine = QueryBuilder().eq("exp_meta.agent_id", f"worker_{worker}").build()
                print(
                    f"  worker_{worker}: {buffer.count(mine)} rows, "
                    f"{len(buffer.task_ids(mine))} tasks"
                )
            assert len(buffer) == expected, "rows were lost"
            buffer.clear()


if __name__ == "__main__":
    main()
