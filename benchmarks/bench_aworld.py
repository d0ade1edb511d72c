"""Benchmark: expstore under AWorld 0.3 (issue 45's targets), beside AWorld's own in-memory
storage where it can answer the same call.

- ``create_data`` of one step through :class:`ExpstoreTrajectoryStorage` (what AWorld's
  runner calls, three times per step): a new step, and an overwrite of it, p50 and p99.
  Its writes are done on the event loop before the coroutine yields (so AWorld's
  un-awaited writes are never lost): the figure is also how long the loop is held.
- The statements each of those calls sends (round trips on Postgres), beside
  ``ReplayBuffer.store``'s.
- ``get_data_items`` of a task of 100 steps (what fills ``TaskResponse.trajectory``), and
  its two halves: the rows read and decoded, the items rebuilt.
- ``select_data`` with an indexed condition over 1M items: a generic ``ExpstoreStorage`` of
  ``Data(value=Step)`` items with ``{"field": "task_id", "op": "eq"}`` (a path index on
  ``exp_data.state.task_id``), the same items and condition in AWorld's
  ``InmemoryStorage`` (a Python filter over every item), and ``meta.task_id`` over 1M
  TrajectoryItems in ``ExpstoreTrajectoryStorage`` (the ``task_id`` column's index). The
  1M-item databases are built once into ``--data`` (not in CI) and reused.

Steps look like a real run's: a system and a user message, a tool call, a few hundred
bytes of input.

    python benchmarks/bench_aworld.py [--pg URL] [--data /work/scratch] [--calls 500]
        [--skip-1m] [--skip-small] [--pg-1m]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault(
    "AWORLD_LOG_PATH", os.path.join(tempfile.gettempdir(), "expstore-aworld-logs")
)

from aworld.core.storage.data import Data  # noqa: E402
from aworld.core.storage.inmemory_store import InmemoryConfig, InmemoryStorage  # noqa: E402
from aworld.dataset.types import (  # noqa: E402
    ExpMeta,
    TrajectoryAction,
    TrajectoryItem,
    TrajectoryReward,
    TrajectoryState,
)
from pydantic import BaseModel  # noqa: E402

from expstore import ReplayBuffer  # noqa: E402
from expstore.db.trace import driver_statements  # noqa: E402
from expstore.integrations.aworld import ExpstoreStorage, ExpstoreTrajectoryStorage  # noqa: E402
from expstore.integrations.aworld.rows import ItemLayout, TrajectoryLayout  # noqa: E402

MILLION = 1_000_000


class Step(BaseModel):
    """A generic item's value: what agent code stores in an AWorld Storage."""

    task_id: str
    agent_id: str
    step: int
    score: float


def step_item(task: str, step: int, finished: bool = False) -> TrajectoryItem:
    return TrajectoryItem(
        id=f"{task}-{step}",
        meta=ExpMeta(
            session_id="session-1",
            task_id=task,
            task_name="math",
            agent_id="solver---uuid1",
            step=step,
            execute_time=time.time(),
        ),
        state=TrajectoryState(
            input={"content": f"What is {step} squared? " + "context " * 30, "images": []},
            messages=[
                {"role": "system", "content": "You are a careful assistant. " * 4},
                {"role": "user", "content": f"What is {step} squared?"},
            ],
        ),
        action=TrajectoryAction(
            content="" if not finished else f"The answer is {step * step}.",
            tool_calls=[]
            if finished
            else [
                {
                    "id": f"call_{step}",
                    "type": "function",
                    "function": {"name": "square", "arguments": f'{{"x": "{step}"}}'},
                }
            ],
            is_agent_finished=finished,
        ),
        reward=TrajectoryReward(status="ok", score=None),
    )


def timed(calls: int, make: Callable[[int], Awaitable[Any]]) -> list[float]:
    """Milliseconds of each of ``calls`` awaits of ``make(i)``, on one event loop."""

    async def run() -> list[float]:
        out = []
        for i in range(calls):
            start = time.perf_counter()
            await make(i)
            out.append((time.perf_counter() - start) * 1000)
        return out

    return asyncio.run(run())


def show(label: str, ms: list[float], target: float | None = None) -> None:
    ms = sorted(ms)
    p50, p99 = statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    aim = f"  (target <= {target:g} ms: {'met' if p50 <= target else 'MISSED'})" if target else ""
    print(f"  {label:<58} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms{aim}")


def small_calls(url: str, backend: str, calls: int) -> None:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    storage = ExpstoreTrajectoryStorage(url=url, name=name)
    task = f"task-{uuid.uuid4().hex[:8]}"
    block = f"trajectory_{task}"
    asyncio.run(storage.create_data(Data(id="warm", value=step_item(task, 0)), block))
    items = [step_item(task, i + 1) for i in range(calls)]
    new = timed(calls, lambda i: storage.create_data(Data(id=items[i].id, value=items[i]), block))
    show(f"{backend}: create_data, a new step", new, 2.0 if backend == "SQLite" else 4.0)
    done = [step_item(task, i + 1, finished=True) for i in range(calls)]
    again = timed(calls, lambda i: storage.create_data(Data(id=done[i].id, value=done[i]), block))
    show(
        f"{backend}: create_data, the step's next version (overwrite)",
        again,
        2.0 if backend == "SQLite" else 4.0,
    )
    # expstore's own cost of such a row: ReplayBuffer.store of it, already made.
    layout, sync = TrajectoryLayout(), storage.buffer.sync
    rows = [layout.row(Data(id=f"floor-{i}", value=items[i]), block, None) for i in range(calls)]
    floor = [0.0] * calls
    for i in range(calls):
        start = time.perf_counter()
        sync.store(rows[i])
        floor[i] = (time.perf_counter() - start) * 1000
    show(f"{backend}: (ReplayBuffer.store of the same row, made beforehand)", floor)
    # Statements (round trips on Postgres, BEGIN and COMMIT included) of each call.
    engine = sync.sql.handle.connections.engine
    extra = [step_item(task, calls + i + 1) for i in range(2)]
    with driver_statements(engine) as seen:
        asyncio.run(storage.create_data(Data(id=extra[0].id, value=extra[0]), block))
        new_step = len(seen)
        seen.clear()
        last = step_item(task, calls + 1, finished=True)
        asyncio.run(storage.create_data(Data(id=last.id, value=last), block))
        overwrite = len(seen)
        seen.clear()
        sync.store(layout.row(Data(id="floor-x", value=extra[1]), block, None))
        store = len(seen)
    print(
        f"  {backend}: statements per call: create_data a new step {new_step}, "
        f"an overwrite {overwrite}; ReplayBuffer.store {store}"
    )
    hundred = f"task-{uuid.uuid4().hex[:8]}"
    for i in range(100):
        item = step_item(hundred, i, finished=i == 99)
        asyncio.run(storage.create_data(Data(id=item.id, value=item), f"trajectory_{hundred}"))
    reads = timed(50, lambda i: storage.get_data_items(f"trajectory_{hundred}"))
    show(f"{backend}: get_data_items of a 100-step task", reads, 10.0)
    # Its two halves: the rows read and decoded, and the items rebuilt from them.
    got = sync.get_batch_by_task_ids([hundred, f"trajectory_{hundred}"])[hundred]
    read = [0.0] * 50
    for i in range(50):
        start = time.perf_counter()
        sync.get_batch_by_task_ids([hundred, f"trajectory_{hundred}"])
        read[i] = (time.perf_counter() - start) * 1000
    show(f"{backend}: (its 100 rows read and decoded)", read)
    rebuilt = [0.0] * 50
    for i in range(50):
        start = time.perf_counter()
        storage.layout.items(got)
        rebuilt[i] = (time.perf_counter() - start) * 1000
    show(f"{backend}: (its 100 TrajectoryItems rebuilt from the rows)", rebuilt)


def _build(url: str, name: str, rows: Callable[[int], Any], label: str) -> ReplayBuffer:
    buffer = ReplayBuffer(url, name=name)
    have = len(buffer)
    if have >= MILLION:
        print(f"  ({label}: {have} items already in {url})")
        return buffer
    buffer.clear()
    start = time.perf_counter()
    for lo in range(0, MILLION, 20_000):
        buffer.store_batch([rows(i) for i in range(lo, lo + 20_000)])
    print(f"  ({label}: built {MILLION} items in {time.perf_counter() - start:.0f} s)")
    return buffer


def million(url: str, backend: str) -> None:
    print(f"{backend}, 1M items:")
    layout, trajectories = ItemLayout(), TrajectoryLayout()

    def data(i: int) -> Data:
        return Data(
            id=f"d{i}",
            block_id=f"b{i // 1000}",
            value=Step(
                task_id=f"task_{i // 10}", agent_id=f"a{i % 7}", step=i % 10, score=(i % 100) / 100
            ),
        )

    def item_row(i: int) -> Any:
        return layout.row(data(i), f"b{i // 1000}", i)

    def step_row(i: int) -> Any:
        item = step_item(f"task_{i // 10}", i % 10)
        return trajectories.row(Data(id=item.id, value=item), f"trajectory_task_{i // 10}", None)

    items = _build(url, "bench_1m_items", item_row, "Data(Step) items")
    items.create_index("exp_data.state.task_id")
    items.close()
    steps = _build(url, "bench_1m_steps", step_row, "TrajectoryItems")
    steps.close()

    ours = ExpstoreStorage(url, name="bench_1m_items")
    trajectory_store = ExpstoreTrajectoryStorage(url=url, name="bench_1m_steps")
    conditions = [
        {"field": "task_id", "value": f"task_{(i * 7919) % 100_000}", "op": "eq"} for i in range(50)
    ]
    got = timed(50, lambda i: ours.select_data(conditions[i]))
    show("ExpstoreStorage.select_data task_id = ... (10 of 1M)", got, 50.0)
    meta = [
        {"field": "meta.task_id", "value": f"task_{(i * 7919) % 100_000}", "op": "eq"}
        for i in range(50)
    ]
    got = timed(50, lambda i: trajectory_store.select_data(meta[i]))
    show("ExpstoreTrajectoryStorage.select_data meta.task_id = ... (10 of 1M)", got, 50.0)
    sizes = timed(50, lambda i: ours.size(conditions[i]))
    show("ExpstoreStorage.size task_id = ... (10 of 1M)", sizes)


def in_memory() -> None:
    print("AWorld's InmemoryStorage, the same 1M Data(Step) items:")
    store = InmemoryStorage(InmemoryConfig(max_capacity=10_000, max_items_per_block=1000))
    start = time.perf_counter()

    async def fill() -> None:
        for i in range(MILLION):
            value = Step(
                task_id=f"task_{i // 10}", agent_id=f"a{i % 7}", step=i % 10, score=(i % 100) / 100
            )
            await store.create_data(Data(id=f"d{i}", value=value), f"b{i // 1000}")

    asyncio.run(fill())
    print(f"  (filled in {time.perf_counter() - start:.0f} s)")
    gc.collect()
    conditions = [
        {"field": "task_id", "value": f"task_{(i * 7919) % 100_000}", "op": "eq"} for i in range(5)
    ]
    got = timed(5, lambda i: store.select_data(conditions[i]))
    show("InmemoryStorage.select_data task_id = ... (10 of 1M)", got)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", help="a Postgres URL (default: $EXPSTORE_TEST_PG_URL)")
    parser.add_argument("--data", default="/work/scratch", help="where the 1M-item SQLite file is")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--skip-1m", action="store_true")
    parser.add_argument("--skip-small", action="store_true", help="only the 1M-item figures")
    parser.add_argument("--pg-1m", action="store_true", help="the 1M items on Postgres too")
    args = parser.parse_args()
    pg = args.pg or os.environ.get("EXPSTORE_TEST_PG_URL")
    tmp = tempfile.mkdtemp(prefix="bench-aworld-")
    if not args.skip_small:
        print("Small calls (ExpstoreTrajectoryStorage, one handle, a warm database):")
        small_calls(f"sqlite:///{tmp}/small.db", "SQLite", args.calls)
        if pg:
            small_calls(pg, "Postgres", args.calls)
    if args.skip_1m:
        return
    Path(args.data).mkdir(parents=True, exist_ok=True)
    million(f"sqlite:///{Path(args.data) / 'bench_aworld_1m.db'}", "SQLite")
    if pg and args.pg_1m:
        million(pg, "Postgres")
    in_memory()


if __name__ == "__main__":
    sys.exit(main())
