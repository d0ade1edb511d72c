"""Benchmark: sampling at in-memory speed with the decoded-row cache and prefetch, against
TorchRL measured side by side in the same run (issue: a decoded-row cache and prefetch).

TorchRL runs in its own virtualenv (``--torchrl-python``, say a venv made with
``python -m venv trl && trl/bin/pip install torch==2.13.0 torchrl``), as a child process
that builds the same shape of rows in a ``ReplayBuffer(LazyTensorStorage(N))`` and times
``rb.sample()`` (batch 256) when asked; rounds alternate between it and expstore.

Parts (each on every backend asked for):

1. ``vs-torchrl``: ``sample(256)`` through ``TensorConverter`` (the observation and the
   reward) of rows with a 1,024-float32 observation (4 KB), 100k and 1M rows, and of small
   rows (8 floats, rlox's benchmark), with the working set in the cache ("warm"), with
   every row read ("cold": the cache emptied before each call), and without a cache
   ("off", as before the cache). Targets: warm ≤ 3x TorchRL on SQLite, ≤ 5x on Postgres;
   small rows ≤ 20x; cold ≤ 1.05x off.
2. ``aworld``: AWorld's path, ``sample(256)`` returning DataRows (the default converter),
   20k rows of about 300 B of JSON and a 4 KB tensor, against the floor (one raw
   ``SELECT`` of the same rows by key, ``json.loads`` of the document, ``np.frombuffer`` of
   the tensor). Targets: cold ≤ 2x the floor, warm ≤ 1x.
3. ``prefetch``: a loop that trains 2 ms per step (``time.sleep``, which lets go of the
   GIL as torch's kernels do, and a numpy matrix product) and takes its batches from
   ``buffer.batches(prefetch=2)``: the wait per batch. Target ≤ 0.2 ms.
4. ``memory``: the process's RSS while a cache with a 256 MiB budget fills from 470 MB of
   rows: never above the budget.
5. ``choices``: where a warm sample's time goes for the common samplers (uniform,
   prioritized, recency), with and without a condition: the choice alone against the
   whole call.

Data sets are built once into ``--scratch`` (SQLite files) and Postgres buffers named
``cache_<rows>_<dim>``, and reused. ::

    python benchmarks/bench_cache.py --torchrl-python /work/scratch/trl/bin/python
    python benchmarks/bench_cache.py --parts vs-torchrl --rows 100000 --backends sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 256
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/expstore_bench"


# -- the TorchRL side (runs in TorchRL's virtualenv) -------------------------------------------
def torchrl_server() -> None:
    """Reads commands from stdin: ``load N DIM`` fills a LazyTensorStorage replay buffer;
    ``time REPEATS`` prints the median ms of ``rb.sample()``."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    torch.manual_seed(0)
    rb: Any = None
    for line in sys.stdin:
        command, *args = line.split()
        if command == "load":
            n, dim = int(args[0]), int(args[1])
            rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=BATCH)
            for start in range(0, n, 100_000):
                m = min(100_000, n - start)
                rb.extend(
                    TensorDict({"obs": torch.rand(m, dim), "reward": torch.rand(m)}, batch_size=[m])
                )
            print("@@ ok", flush=True)
        elif command == "time":
            print(f"@@ {_median_ms(rb.sample, int(args[0])):.4f}", flush=True)
        elif command == "version":
            import torchrl

            print("@@", torchrl.__version__, flush=True)


class TorchRL:
    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, __file__, "--torchrl-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, line: str) -> str:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        while True:  # (what TorchRL itself prints on stdout is skipped)
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("the TorchRL process ended")
            if line.startswith("@@ "):
                return line[3:].strip()

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


# -- the expstore side -----------------------------------------------------------------------
def _urls(args: argparse.Namespace, n: int, dim: int) -> dict[str, tuple[str, str]]:
    name = f"cache_{n}_{dim}"
    return {
        "sqlite": (f"sqlite:///{args.scratch}/{name}.db", name),
        "postgres": (args.pg_url, name),
    }


def build(url: str, name: str, n: int, dim: int, *, json_bytes: int = 0) -> None:
    from expstore import ReplayBuffer

    with ReplayBuffer(url, name=name, cache_bytes=0, upgrade=True) as buffer:
        if buffer.count() == n:
            return
        buffer.clear()
        print(f"  building {n:,} rows of {dim} float32 in {name} ...", flush=True)
        rng = np.random.default_rng(0)
        started = time.perf_counter()
        for start in range(0, n, 20_000):
            m = min(20_000, n - start)
            state: dict[str, Any] = {"obs": rng.random((m, dim), dtype=np.float32)}
            if json_bytes:  # about json_bytes of JSON beside the tensor
                state["url"] = [f"https://shop.example/item/{start + i}" for i in range(m)]
                state["title"] = ["x" * (json_bytes - 120)] * m
            buffer.extend(
                {
                    "task_id": [f"t{(start + i) // 10}" for i in range(m)],
                    "task_name": [f"group{(start + i) // 10 % 10}" for i in range(m)],
                    "agent_id": "agent0",
                    "step": [(start + i) % 10 for i in range(m)],
                    "state": state,
                    "reward_t": rng.random(m),
                }
            )
        print(f"  built in {time.perf_counter() - started:.0f} s", flush=True)


def warm_all(buffer: Any, paths: list[str] | None) -> None:
    """Every row into the cache (the working set held): read twice (a row is kept on its
    second read), three times for whole rows (decoded on their first hit)."""
    keys = buffer.storage.key_index()["key"]
    for start in range(0, len(keys), 2000):
        for _ in range(2 if paths is not None else 3):
            buffer.storage.fetch(keys[start : start + 2000], paths, writable=False)


def rounds(fns: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    """Each function (returning a median ms) called once per round, in rotating order."""
    names = list(fns)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(n):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(fns[name]())
    return out


def cold_median(buffer: Any, sample: Callable[[], Any], repeats: int) -> float:
    """Median ms of ``sample`` with the cache emptied before each call (not timed)."""
    cache = buffer.storage.row_cache
    times = []
    for _ in range(repeats):
        cache.clear()
        t0 = time.perf_counter()
        sample()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def vs_torchrl(args: argparse.Namespace, torchrl: TorchRL | None) -> None:
    from expstore import ReplayBuffer
    from expstore.converters import TensorConverter
    from expstore.samplers import UniformSampler

    converter = TensorConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    cases = [(n, 1024) for n in args.rows] + [(args.small_rows, 8)]
    for n, dim in cases:
        if torchrl is not None:
            torchrl.ask(f"load {n} {dim}")
        for backend in args.backends:
            url, name = _urls(args, n, dim)[backend]
            build(url, name, n, dim)
            budget = int(n * (dim * 4 + 700) * 1.2) + (64 << 20)
            warm = ReplayBuffer(url, name=name, cache_bytes=budget)
            cold = ReplayBuffer(url, name=name, cache_bytes=budget)  # emptied before each call
            off = ReplayBuffer(url, name=name, cache_bytes=0)
            started = time.perf_counter()
            warm_all(warm, converter.paths)
            held = warm.cache_stats()
            print(
                f"\n{backend}, {n:,} rows of {dim} float32: cache warmed in "
                f"{time.perf_counter() - started:.1f} s, {held.rows:,} rows, "
                f"{held.bytes / 2**20:.0f} MiB",
                flush=True,
            )
            fns: dict[str, Callable[[], float]] = {
                "expstore warm": partial(
                    _median_ms,
                    partial(warm.sample, UniformSampler(seed=0), None, converter, BATCH),
                    args.repeats,
                ),
                "expstore off": partial(
                    _median_ms,
                    partial(off.sample, UniformSampler(seed=0), None, converter, BATCH),
                    args.repeats,
                ),
                "expstore cold": partial(
                    cold_median,
                    cold,
                    partial(cold.sample, UniformSampler(seed=1), None, converter, BATCH),
                    args.repeats,
                ),
            }
            if torchrl is not None:
                fns["TorchRL LazyTensorStorage"] = lambda: float(
                    torchrl.ask(f"time {args.repeats}")
                )
            got = rounds(fns, args.rounds)
            cold_cost = None
            for label, values in got.items():
                print(f"  {label:<28} " + "  ".join(f"{v:7.3f}" for v in values) + " ms")
            med = {k: statistics.median(v) for k, v in got.items()}
            if torchrl is not None:
                t = med["TorchRL LazyTensorStorage"]
                print(f"  warm / TorchRL: {med['expstore warm'] / t:.2f}x")
                print(f"  off  / TorchRL: {med['expstore off'] / t:.2f}x")
            cold_cost = med["expstore cold"] / med["expstore off"]
            print(
                f"  cold / off: {cold_cost:.3f}x   "
                f"warm / off: {med['expstore warm'] / med['expstore off']:.3f}x"
            )
            warm.close()
            cold.close()
            off.close()


def aworld(args: argparse.Namespace) -> None:
    for backend in args.backends:
        aworld_backend(args, backend)


def aworld_backend(args: argparse.Namespace, backend: str) -> None:
    from expstore import ReplayBuffer
    from expstore.codec import HEADER_SIZE
    from expstore.samplers import UniformSampler
    from expstore.storage import create_sql_engine
    from expstore.storage.reader import ROW_COLUMNS

    columns = [c.name for c in ROW_COLUMNS]
    n, dim = 20_000, 1024
    if True:
        url, name = _urls(args, n, dim)[backend]
        name += "_json"
        if backend == "sqlite":
            url = url.replace(".db", "_json.db")
        build(url, name, n, dim, json_bytes=300)
        buffer = ReplayBuffer(url, name=name, cache_bytes=1 << 30)
        cold = ReplayBuffer(url, name=name, cache_bytes=1 << 30)  # emptied before each call
        off = ReplayBuffer(url, name=name, cache_bytes=0)
        first = int(buffer.storage.key_index()["key"][0])
        doc_bytes = len(str(buffer.storage._reader.read_raw([first])[0][0][columns.index("data")]))
        engine = create_sql_engine(buffer.storage.url)
        connection = engine.raw_connection()
        sqlite = backend == "sqlite"
        mark = "?" if sqlite else "%s"
        keys = buffer.storage.key_index()["key"]
        rng = np.random.default_rng(1)
        data_at, tensors_at = columns.index("data"), columns.index("tensors")

        def floor() -> list[Any]:
            chosen = keys[rng.integers(0, len(keys), BATCH)].tolist()
            unique = list(dict.fromkeys(chosen))
            cursor = connection.cursor()
            cursor.execute(
                f"SELECT {', '.join(columns)} FROM expstore_rows WHERE key IN "
                f"({', '.join([mark] * len(unique))})",
                unique,
            )
            found = {}
            for row in cursor.fetchall():
                doc = json.loads(row[data_at]) if sqlite else row[data_at]
                found[row[0]] = (
                    row,
                    doc,
                    np.frombuffer(row[tensors_at], np.float32, dim, HEADER_SIZE),
                )
            cursor.close()
            return [found[k] for k in chosen]

        warm_all(buffer, None)
        got = rounds(
            {
                "floor": partial(_median_ms, floor, args.repeats),
                "sample warm": partial(
                    _median_ms,
                    partial(buffer.sample, UniformSampler(seed=0), None, None, BATCH),
                    args.repeats,
                ),
                "sample cold": partial(
                    cold_median,
                    cold,
                    partial(cold.sample, UniformSampler(seed=2), None, None, BATCH),
                    args.repeats,
                ),
                "sample off": partial(
                    _median_ms,
                    partial(off.sample, UniformSampler(seed=0), None, None, BATCH),
                    args.repeats,
                ),
            },
            args.rounds,
        )
        print(
            f"\n{backend}: AWorld's path, sample(256) -> DataRows, {n:,} rows "
            f"({doc_bytes} B of JSON + 4 KB tensor)"
        )
        med = {k: statistics.median(v) for k, v in got.items()}
        for label, values in got.items():
            print(
                f"  {label:<14} "
                + "  ".join(f"{v:7.3f}" for v in values)
                + f" ms  ({med[label] / med['floor']:.2f}x floor)"
            )
        connection.close()
        engine.dispose()
        buffer.close()
        cold.close()
        off.close()


def prefetch(args: argparse.Namespace) -> None:
    from expstore import ReplayBuffer
    from expstore.converters import TensorConverter
    from expstore.samplers import UniformSampler

    converter = TensorConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    n, dim = args.rows[0], 1024

    def busy() -> None:  # 2 ms of Python holding the GIL
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    steps = {
        "sleep 2 ms (the GIL let go, as by GPU kernels)": partial(time.sleep, 0.002),
        "Python busy 2 ms (the GIL held)": busy,
    }
    for backend in args.backends:
        url, name = _urls(args, n, dim)[backend]
        build(url, name, n, dim)
        buffer = ReplayBuffer(url, name=name, cache_bytes=int(n * 5000 * 1.2))
        warm_all(buffer, converter.paths)
        print(f"\n{backend}: a loop training 2 ms per step, batches of 256 from {n:,} rows")
        for label, train in steps.items():
            for ahead in (0, 2):
                stream = buffer.batches(
                    UniformSampler(seed=0), None, converter, BATCH, prefetch=ahead
                )
                for _ in range(20):
                    next(stream)
                    train()
                stream.waited_s, stream.batches = 0.0, 0
                t0 = time.perf_counter()
                for _ in range(args.repeats):
                    next(stream)
                    train()
                total = time.perf_counter() - t0
                stream.close()
                print(
                    f"  {label}, prefetch={ahead}: waits "
                    f"{stream.waited_s / args.repeats * 1e3:.3f} ms "
                    f"per batch; {total / args.repeats * 1e3:.2f} ms per step"
                )
        buffer.close()


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def memory(args: argparse.Namespace) -> None:
    """In a process of its own, so that memory freed by earlier parts does not hide the
    cache's growth."""
    command = [sys.executable, __file__, "--memory-child", "--scratch", args.scratch]
    subprocess.run(command, check=True)


def memory_child(args: argparse.Namespace) -> None:
    import gc

    from expstore import ReplayBuffer
    from expstore.converters import TensorConverter

    converter = TensorConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    n, dim, budget = 100_000, 1024, 256 << 20
    url, name = _urls(args, n, dim)["sqlite"]
    build(url, name, n, dim)
    buffer = ReplayBuffer(url, name=name, cache_bytes=budget)
    keys = buffer.storage.key_index()["key"]
    buffer.storage.fetch(keys[:256], converter.paths)  # connections, plans, decoder warm
    buffer.storage.row_cache.clear()
    gc.collect()
    base = _rss()
    peak = 0
    for start in range(0, n, 256):  # batches as a sampler's
        for _ in range(2):  # (a row is kept on its second read)
            buffer.storage.fetch(keys[start : start + 256], converter.paths, writable=False)
        peak = max(peak, _rss() - base)
    gc.collect()
    after = _rss() - base
    stats = buffer.cache_stats()
    print(
        f"\nmemory: budget {budget / 2**20:.0f} MiB; filled from {n:,} rows of 4 KB "
        f"({n * dim * 4 / 2**20:.0f} MiB of arrays): holds {stats.rows:,} rows, "
        f"{stats.bytes / 2**20:.1f} MiB by its count, {stats.evictions:,} evicted; RSS grew "
        f"{after / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB while fetching batches of 256)"
    )
    buffer.close()


def choices(args: argparse.Namespace) -> None:
    from expstore import ReplayBuffer
    from expstore.converters import TensorConverter
    from expstore.query import QueryBuilder
    from expstore.samplers import PrioritizedSampler, RecencySampler, UniformSampler

    converter = TensorConverter({"obs": "exp_data.state.obs", "reward": "exp_data.reward_t"})
    n, dim = args.rows[0], 1024
    condition = QueryBuilder().eq("exp_meta.task_name", "group3").build()
    for backend in args.backends:
        url, name = _urls(args, n, dim)[backend]
        build(url, name, n, dim)
        buffer = ReplayBuffer(url, name=name, cache_bytes=int(n * 5000 * 1.2))
        warm_all(buffer, converter.paths)
        print(f"\n{backend}: where a warm sample(256) goes, {n:,} rows")
        for label, make in (
            ("uniform", lambda: UniformSampler(seed=0)),
            ("prioritized", lambda: PrioritizedSampler(seed=0)),
            ("recency", lambda: RecencySampler(seed=0)),
        ):
            for cond_label, cond in (("all rows", None), ("task_name == group3", condition)):
                figures = []
                for flat in (True, False):
                    sampler = make()
                    sampler.flat = flat
                    sample = partial(buffer.sample, sampler, cond, converter, BATCH)
                    chooser = make()
                    chooser.flat = flat
                    choose = partial(chooser.choose, buffer.storage, BATCH, cond)
                    figures += [_median_ms(sample, args.repeats), _median_ms(choose, args.repeats)]
                print(
                    f"  {label:<12} {cond_label:<20} key space: sample {figures[0]:7.3f} ms, "
                    f"choice {figures[1]:7.3f} ms; key index: sample {figures[2]:7.3f} ms, "
                    f"choice {figures[3]:7.3f} ms"
                )
        buffer.close()


PARTS = {
    "vs-torchrl": vs_torchrl,
    "aworld": aworld,
    "prefetch": prefetch,
    "memory": memory,
    "choices": choices,
}


def main() -> None:
    if "--torchrl-server" in sys.argv:
        torchrl_server()
        return
    memory_only = "--memory-child" in sys.argv
    if memory_only:
        sys.argv.remove("--memory-child")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=PG_URL)
    parser.add_argument(
        "--scratch", default=os.environ.get("EXPSTORE_SCRATCH", "/work/scratch/bench")
    )
    parser.add_argument("--torchrl-python", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    args.backends = args.backends.split(",")
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    if memory_only:
        memory_child(args)
        return
    torchrl = TorchRL(args.torchrl_python) if args.torchrl_python else None
    if torchrl is not None:
        print(f"TorchRL {torchrl.ask('version')} in {args.torchrl_python}")
    try:
        for part in args.parts.split(","):
            if part == "vs-torchrl" or part in PARTS:
                PARTS[part](args, torchrl) if part == "vs-torchrl" else PARTS[part](args)  # type: ignore[operator]
    finally:
        if torchrl is not None:
            torchrl.close()


if __name__ == "__main__":
    main()
