"""Benchmark: TorchRL's ``rb.extend`` of 8 and 256 rows and ``rb.sample(256)`` through
``ExpstoreStorage`` (SQLite, Postgres) beside the same calls on ``LazyTensorStorage``, in
one run (issue 46; target: within 3x of LazyTensorStorage on SQLite).

The data is a DQN transition as TorchRL collectors give it: a TensorDict with
``observation`` (float32 [64]), ``action`` (int64 one-hot [4]), and ``next``'s
``observation``, ``reward`` [1], ``done`` [1] and ``terminated`` [1]. The storages hold
``--max-size`` slots (default 100,000), filled once before timing; extends then overwrite
(round robin), as in a steady run. Each figure is the median of ``--repeat`` calls, in ms,
with the ratio to LazyTensorStorage's.

    python benchmarks/bench_torchrl.py [--max-size 100000] [--repeat 200] [--pg URL] [--skip-pg]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import fresh_pg_database, ms  # noqa: E402
from expstore.integrations.torchrl import ExpstoreStorage  # noqa: E402

PG_URL = os.environ.get(
    "EXPSTORE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def transitions(n: int, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(n, 64, generator=g),
            "action": torch.nn.functional.one_hot(torch.randint(0, 4, (n,), generator=g), 4),
            ("next", "observation"): torch.randn(n, 64, generator=g),
            ("next", "reward"): torch.randn(n, 1, generator=g),
            ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
        },
        batch_size=[n],
    )


def timed(call: Any, repeat: int) -> float:
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return ms(seconds)


def measure(storage: Any, max_size: int, repeat: int) -> dict[str, float]:
    rb = TensorDictReplayBuffer(storage=storage, batch_size=256)
    fill = transitions(10_000)
    for start in range(0, max_size, 10_000):
        rb.extend(fill[: min(10_000, max_size - start)])
    small, large = transitions(8, 1), transitions(256, 2)
    rb.sample()  # warm: statements compiled, layouts read
    return {
        "extend(8)": timed(lambda: rb.extend(small), repeat),
        "extend(256)": timed(lambda: rb.extend(large), max(repeat // 4, 10)),
        "sample(256)": timed(rb.sample, repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-size", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--pg", default=PG_URL, help="Postgres server URL")
    parser.add_argument("--skip-pg", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    results: dict[str, dict[str, float]] = {}
    results["LazyTensorStorage"] = measure(
        LazyTensorStorage(args.max_size), args.max_size, args.repeat
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        storage = ExpstoreStorage(args.max_size, url=url, name="bench")
        results["ExpstoreStorage, SQLite"] = measure(storage, args.max_size, args.repeat)
        storage.buffer.close()
    if not args.skip_pg:
        url, drop = fresh_pg_database(args.pg)
        try:
            storage = ExpstoreStorage(args.max_size, url=url, name="bench")
            results["ExpstoreStorage, Postgres"] = measure(storage, args.max_size, args.repeat)
            storage.buffer.close()
        finally:
            drop()

    base = results["LazyTensorStorage"]
    print(
        f"TorchRL TensorDictReplayBuffer, {args.max_size} slots, median ms of {args.repeat} calls"
    )
    print(f"{'storage':28} {'extend(8)':>16} {'extend(256)':>16} {'sample(256)':>16}")
    for name, row in results.items():
        cells = [
            f"{row[c]:7.3f}"
            + ("" if name == "LazyTensorStorage" else f" ({row[c] / base[c]:4.1f}x)")
            for c in ("extend(8)", "extend(256)", "sample(256)")
        ]
        print(f"{name:28} " + " ".join(f"{cell:>16}" for cell in cells))


if __name__ == "__main__":
    main()
