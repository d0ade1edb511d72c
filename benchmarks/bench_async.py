"""Benchmark: expstore.aio under an event loop (issue 45).

1. **Many coroutines writing.** 64 coroutines each awaiting ``extend`` of 8 rows (4 float32
   observations, an action, a reward, a done per row), as 64 rollouts on one loop would,
   through one :class:`~expstore.aio.AsyncReplayBuffer` with its default settings; beside
   it the same calls made one after another by a plain ReplayBuffer from one thread. Printed:
   rows per second of each and the ratio (target >= 0.8x), and the lag of a 1 ms ticker
   running on the loop meanwhile (how late each tick wakes; target p99 <= 5 ms; an idle
   loop's figure beside it).
2. **The mechanism.** Why threads rather than SQLAlchemy's asyncio drivers: the same
   hand-written 8-row INSERT transaction made by 64 coroutines through an ``AsyncEngine``
   (``sqlite+aiosqlite``, ``postgresql+psycopg`` async) and through a sync engine on the
   thread of an expstore.aio handle (:class:`expstore.aio.calls.Calls`). Needs
   ``pip install aiosqlite 'sqlalchemy[asyncio]'`` (the ``bench`` extra).

    python benchmarks/bench_async.py [--calls 3000] [--pg URL] [--skip-pg]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fresh_pg_database  # noqa: E402

from expstore import ReplayBuffer  # noqa: E402
from expstore.aio import AsyncReplayBuffer  # noqa: E402
from expstore.aio.calls import Calls  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
COROUTINES = 64
ROWS = 8


def columns(step: int, rng: np.random.Generator) -> dict[str, Any]:
    return {
        "task_id": [f"env{i}" for i in range(ROWS)],
        "agent_id": "policy",
        "step": step,
        "state": {"obs": rng.random((ROWS, 4), dtype=np.float32)},
        "actions": rng.integers(0, 2, ROWS),
        "reward_t": rng.random(ROWS),
        "done": np.zeros(ROWS, bool),
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


async def ticking(stop: asyncio.Event, lags: list[float]) -> None:
    """A 1 ms ticker: how late each tick wakes."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(0.001)
        lags.append(loop.time() - start - 0.001)


async def under_ticker(
    work: Callable[[], Awaitable[None]],
) -> tuple[float, list[float]]:
    """Run ``work`` with the ticker on the loop: seconds taken, the ticker's lags."""
    stop, lags = asyncio.Event(), []
    ticker = asyncio.create_task(ticking(stop, lags))
    await asyncio.sleep(0.05)
    lags.clear()
    start = time.perf_counter()
    await work()
    took = time.perf_counter() - start
    stop.set()
    await ticker
    return took, lags


async def idle_lag() -> list[float]:
    async def nothing() -> None:
        await asyncio.sleep(1.0)

    return (await under_ticker(nothing))[1]


def writers(
    fresh: Callable[[], tuple[str, Callable[[], None]]], name: str, calls: int
) -> list[str]:
    """Part 1 on one backend (each side in a fresh database of its own): the table's rows."""
    rng = np.random.default_rng(0)
    batches = [columns(i, rng) for i in range(calls)]
    url, drop = fresh()
    with ReplayBuffer(url, name="sync") as sync:
        for b in batches[:200]:  # the same warm buffer and compiled statements
            sync.extend(b)
        start = time.perf_counter()
        for b in batches:
            sync.extend(b)
        sync_s = time.perf_counter() - start
    drop()
    url, drop = fresh()

    async def main() -> tuple[float, list[float], list[float]]:
        buffer = await AsyncReplayBuffer.open(url, name="async")
        async with buffer:
            for b in batches[:200]:
                await buffer.extend(b)
            per = calls // COROUTINES

            async def rollout(k: int) -> None:
                for b in batches[k * per : (k + 1) * per]:
                    await buffer.extend(b)

            async def all_rollouts() -> None:
                await asyncio.gather(*(rollout(k) for k in range(COROUTINES)))

            took, lags = await under_ticker(all_rollouts)
            assert await buffer.count() == (200 + per * COROUTINES) * ROWS
        return took * calls / (per * COROUTINES), lags, await idle_lag()

    async_s, lags, idle = asyncio.run(main())
    drop()
    sync_rate, async_rate = calls * ROWS / sync_s, calls * ROWS / async_s
    return [
        f"| {name} | {sync_rate:,.0f} rows/s | {async_rate:,.0f} rows/s | "
        f"{async_rate / sync_rate:.2f}x | {pct(lags, 50):.2f} / {pct(lags, 99):.2f} / "
        f"{max(lags) * 1000:.1f} ms | {pct(idle, 99):.2f} ms |"
    ]


def mechanism(sync_url: str, async_url: str, name: str, calls: int) -> list[str]:
    """Part 2 on one backend: one hand-written transaction, two ways."""
    meta = sa.MetaData()
    table = sa.Table(
        "aio_mechanism",
        meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("obs", sa.LargeBinary, nullable=False),
    )
    rows = [{"step": i, "obs": np.arange(4, dtype=np.float32).tobytes()} for i in range(ROWS)]
    per = calls // COROUTINES
    out = []
    engine = sa.create_engine(sync_url)
    meta.drop_all(engine)
    meta.create_all(engine)

    def write_sync() -> None:
        with engine.begin() as conn:
            conn.execute(table.insert(), rows)

    async def via_thread() -> tuple[float, list[float]]:
        calls_ = Calls(1)

        async def rollout() -> None:
            for _ in range(per):
                await calls_.run(write_sync)

        async def work() -> None:
            await asyncio.gather(*(rollout() for _ in range(COROUTINES)))

        try:
            return await under_ticker(work)
        finally:
            calls_.close()

    async def via_async_engine() -> tuple[float, list[float]]:
        from sqlalchemy.ext.asyncio import create_async_engine

        aengine = create_async_engine(async_url)

        async def rollout() -> None:
            for _ in range(per):
                async with aengine.begin() as conn:
                    await conn.execute(table.insert(), rows)

        async def work() -> None:
            await asyncio.gather(*(rollout() for _ in range(COROUTINES)))

        try:
            return await under_ticker(work)
        finally:
            await aengine.dispose()

    for label, run in (
        ("sync engine on the handle's thread", via_thread),
        ("SQLAlchemy AsyncEngine", via_async_engine),
    ):
        try:
            took, lags = asyncio.run(run())
        except Exception as exc:  # a driver missing: say so, go on
            out.append(f"| {name} | {label} | not run: {type(exc).__name__}: {exc} | | |")
            continue
        out.append(
            f"| {name} | {label} | {per * COROUTINES * ROWS / took:,.0f} rows/s | "
            f"{pct(lags, 50):.2f} / {pct(lags, 99):.2f} ms | {max(lags) * 1000:.1f} ms |"
        )
    meta.drop_all(engine)
    engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--pg", default=os.environ.get("EXPSTORE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--skip-pg", action="store_true")
    args = parser.parse_args()
    print(f"## {COROUTINES} coroutines awaiting extend({ROWS} rows), {args.calls} calls\n")
    print(
        "| backend | sync, one thread | async, 64 coroutines | ratio (target >= 0.8x) "
        "| 1 ms ticker lag p50 / p99 / max (target p99 <= 5 ms) | idle loop's p99 |"
    )
    print("|---|---|---|---|---|---|")
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        files = iter(range(100))

        def sqlite_file() -> tuple[str, Callable[[], None]]:
            return f"sqlite:///{folder}/aio{next(files)}.db", lambda: None

        print(*writers(sqlite_file, "SQLite", args.calls), sep="\n", flush=True)
        url = sqlite_file()[0]
        lines += mechanism(url, url.replace("sqlite:", "sqlite+aiosqlite:"), "SQLite", args.calls)
    if not args.skip_pg:
        fresh = lambda: fresh_pg_database(args.pg)  # noqa: E731
        print(*writers(fresh, "Postgres", args.calls), sep="\n", flush=True)
        url, drop = fresh()
        try:
            lines += mechanism(url, url, "Postgres", args.calls)
        finally:
            drop()
    print(f"\n## The mechanism: an 8-row INSERT transaction by {COROUTINES} coroutines\n")
    print("| backend | how | throughput | ticker lag p50 / p99 | max |")
    print("|---|---|---|---|---|")
    print(*lines, sep="\n")


if __name__ == "__main__":
    main()
