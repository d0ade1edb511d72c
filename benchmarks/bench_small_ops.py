"""Benchmark: the small calls a training loop makes every step, beside a hand-written
DB-API floor measured in the same run (issue 44).

Each call writes ``n`` rows (1, 8, 64) the way a vectorised-env step does: ``extend`` of
columns (4 float32 observations, an action, a reward, a done per row) and ``store_batch``
of DataRows built beforehand. Default settings, one handle, a buffer that already holds
rows (``--warm`` calls first), then ``--calls`` calls timed one by one, in rounds that
alternate with the floor's so both see the same machine.

The floor: the same rows encoded by expstore (the same stored bytes), written by hand
with the driver into the same tables and indexes of a database expstore made: one
transaction of the INSERT (``executemany``: sqlite3's loop; psycopg's, which pipelines)
and a count (the buffer's row count updated), then COMMIT. It does none of expstore's
checks, locking or bookkeeping.

Statements per call are counted as the driver sends them (:mod:`expstore.db.trace`:
BEGIN and COMMIT included; on Postgres each is a round trip, and the floor's pipelined
``executemany`` is one).

    python benchmarks/bench_small_ops.py [--calls 2000] [--pg URL] [--skip-pg]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fresh_pg_database  # noqa: E402

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer  # noqa: E402
from expstore.db.dialects import WRITE_COLUMNS  # noqa: E402
from expstore.db.trace import driver_statements  # noqa: E402
from expstore.storage.writer import encode_chunk  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SIZES = (1, 8, 64)
COLUMNS = ", ".join(f'"{c}"' for c in WRITE_COLUMNS)


def columns(n: int, step: int, rng: np.random.Generator) -> dict[str, Any]:
    return {
        "task_id": [f"env{i}" for i in range(n)],
        "agent_id": "policy",
        "step": step,
        "state": {"obs": rng.random((n, 4), dtype=np.float32)},
        "actions": rng.integers(0, 2, n),
        "reward_t": rng.random(n),
        "done": np.zeros(n, bool),
    }


def datarows(n: int, step: int, rng: np.random.Generator) -> list[DataRow]:
    obs = rng.random((n, 4), dtype=np.float32)
    return [
        DataRow(
            exp_meta=ExpMeta(task_id=f"env{i}", agent_id="policy", step=step),
            exp_data=Experience(
                state={"obs": obs[i]}, actions=int(i % 2), reward_t=float(i), done=False
            ),
        )
        for i in range(n)
    ]


class Floor:
    """The hand-written write: BEGIN, executemany INSERT, the count, COMMIT."""

    def __init__(self, url: str, buffer_id: int, template: list[tuple[Any, ...]]) -> None:
        self.template = template
        self.buffer_id = buffer_id
        marks_sqlite = ", ".join("?" * len(WRITE_COLUMNS))
        marks_pg = ", ".join(["%s"] * len(WRITE_COLUMNS))
        if url.startswith("sqlite"):
            self.conn: Any = sqlite3.connect(make_url(url).database, isolation_level=None)
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self.insert = f"INSERT INTO expstore_rows ({COLUMNS}) VALUES ({marks_sqlite})"
            self.count = "UPDATE expstore_buffers SET row_count = row_count + ? WHERE id = ?"
            self.pg = False
            self.statements = 4
        else:
            import psycopg

            u = make_url(url)
            self.conn = psycopg.connect(
                host=u.host, port=u.port, user=u.username, dbname=u.database
            )
            self.insert = f"INSERT INTO expstore_rows ({COLUMNS}) VALUES ({marks_pg})"
            self.count = "UPDATE expstore_buffers SET row_count = row_count + %s WHERE id = %s"
            self.pg = True
            self.statements = 4  # BEGIN, the pipelined INSERTs, the count, COMMIT
        self.data_at = WRITE_COLUMNS.index("data")

    def write(self) -> None:
        params = [(t[0], uuid.uuid4().hex, *t[2:]) for t in self.template]
        if self.pg:
            from psycopg.types.json import Jsonb

            at = self.data_at
            params = [(*p[:at], Jsonb(p[at], dumps=lambda s: s), *p[at + 1 :]) for p in params]
            with self.conn.cursor() as cur:
                cur.executemany(self.insert, params)
                cur.execute(self.count, (len(params), self.buffer_id))
            self.conn.commit()
        else:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(self.insert, params)
            self.conn.execute(self.count, (len(params), self.buffer_id))
            self.conn.execute("COMMIT")


def statements_per_call(buffer: ReplayBuffer, call: Callable[[], None], calls: int = 20) -> float:
    """Statements (round trips) per call, as the driver sends them (expstore.db.trace)."""
    with driver_statements(buffer.sql._handle.connections.engine) as seen:
        for _ in range(3):  # (a new connection's own statements first)
            call()
        before = len(seen)
        for _ in range(calls):
            call()
    return (len(seen) - before) / calls


class Calls:
    """``op`` calls of ``n`` rows on ``buffer``, their arguments made beforehand."""

    def __init__(self, buffer: ReplayBuffer, op: str, n: int, rng: np.random.Generator):
        self.buffer, self.op, self.n, self.rng = buffer, op, n, rng
        self.step = 0
        self.prepared: list[Any] = []

    def refill(self, count: int) -> None:
        make = columns if self.op == "extend" else datarows
        self.prepared = [make(self.n, self.step + i, self.rng) for i in range(count)]
        self.step += count

    def call(self) -> None:
        item = self.prepared.pop()
        if self.op == "extend":
            self.buffer.extend(item)
        else:
            self.buffer.store_batch(item)


def timed(call: Callable[[], None], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def run(url: str, label: str, args: argparse.Namespace) -> list[str]:
    rng = np.random.default_rng(0)
    lines = []
    for op in ("extend", "store_batch"):
        for n in SIZES:
            name = f"{op}_{n}"
            buffer = ReplayBuffer(url, name=name)
            # the arguments are built outside the timed call, as a trainer has them
            calls = Calls(buffer, op, n, rng)
            ours_prepared, refill = calls.call, calls.refill
            refill(args.warm // n + 10)
            for _ in range(args.warm // n + 10):
                ours_prepared()
            buffer_id = buffer.sql._handle.buffer_id
            template = encode_chunk(datarows(n, 0, rng), buffer_id)
            floor = Floor(url, buffer_id, template)
            mine: list[float] = []
            theirs: list[float] = []
            rounds = 5
            per_round = max(20, args.calls // rounds // max(1, n // 8))
            for _ in range(rounds):
                refill(per_round)
                mine += timed(ours_prepared, per_round)
                theirs += timed(floor.write, per_round)
            refill(30)
            statements = statements_per_call(buffer, ours_prepared)
            a, b = statistics.median(mine) * 1e3, statistics.median(theirs) * 1e3
            lines.append(
                f"| {label} | `{op}` of {n} | {a:.3f} ms | {b:.3f} ms | **{a / b:.2f}x** "
                f"| {statements:.0f} | {floor.statements} |"
            )
            print(lines[-1], flush=True)
            floor.conn.close()
            buffer.close()
    return lines


def coordination(url: str, label: str) -> list[str]:
    """Statements and round trips (Postgres: each statement is one, except those sent
    together in a pipeline) of the claim cycle and of a draw, counted
    only (the timings of these calls are bench_actors.py's and bench_cache.py's)."""
    from expstore import PrioritizedSampler, UniformSampler

    rng = np.random.default_rng(1)
    prompts = ReplayBuffer(url, name="coord_prompts")
    rollouts = ReplayBuffer(url, name="coord_rollouts")
    plain = ReplayBuffer(url, name="coord_plain")
    prompts.store_prompts(
        [
            DataRow(
                id=f"p{i}",
                exp_meta=ExpMeta(task_id=f"p{i}", agent_id="dataset", step=0),
                exp_data=Experience(state={"question": f"q{i}"}),
            )
            for i in range(200)
        ],
        group_size=4,
    )
    plain.store_batch(datarows(64, 0, rng))
    for step in range(1, 40):
        plain.store_batch(datarows(64, step, rng))
    me = prompts.consumer("actor-0")
    learner = plain.consumer("learner-0")
    uniform, per = UniformSampler(seed=0), PrioritizedSampler(seed=0)

    def produced(pid: str) -> list[DataRow]:
        return [
            DataRow(
                id=f"{pid}/c{c}",
                exp_meta=ExpMeta(task_id=pid, agent_id="actor", step=c),
                exp_data=Experience(state={"tokens": rng.integers(0, 50_000, 64)}),
            )
            for c in range(4)
        ]

    def counted(
        what: str, call: Callable[[], Any], each: int = 10, on: ReplayBuffer = prompts
    ) -> None:
        call()  # a new connection's own statements, and each statement's first compile
        with driver_statements(on.sql._handle.connections.engine) as seen:
            call()
            before = len(seen)
            for _ in range(each):
                call()
        per_call = (len(seen) - before) / each
        trips = seen.round_trips_since(before) / each
        shown = f"{trips:.1f}" if label != "SQLite" else "-"
        lines.append(f"| {label} | {what} | {per_call:.1f} | {shown} |")
        print(lines[-1], flush=True)

    lines: list[str] = []
    counted("`claim(1)` + `release()`", lambda: me.claim(1).release())
    counted("`claim(1)` + `ack()`", lambda: me.claim(1).ack())

    def cycle() -> None:
        claim = me.claim(1)
        claim.save_progress({"tokens": [1, 2, 3]})
        claim.ack(produce={claim.ids[0]: produced(claim.ids[0])}, into=rollouts)

    counted("`claim(1)` + `save_progress` + `ack(produce=4 rows, into=...)`", cycle)
    counted(
        "learner: `claim(32)` + `ack(checkpoint=...)`",
        lambda: learner.claim(32).ack(checkpoint={"step": 1}),
        each=3,
        on=plain,
    )
    draw = [
        ("`sample(32)` uniform, warm", lambda: plain.sample(uniform, None, None, 32)),
        ("`sample(32)` prioritized, warm", lambda: plain.sample(per, None, None, 32)),
    ]
    for what, call in draw:
        counted(what, call, on=plain)
    ids = [r.id for r in plain.sample(uniform, None, None, 32)]
    counted(
        "`update_priorities(32 ids)`", lambda: plain.update_priorities(ids, [1.0] * 32), on=plain
    )
    for buffer in (prompts, rollouts, plain):
        buffer.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=2000, help="rows written before timing")
    parser.add_argument("--pg", default=os.environ.get("EXPSTORE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--skip-pg", action="store_true")
    parser.add_argument("--only-statements", action="store_true", help="the second table only")
    args = parser.parse_args()
    if not args.only_statements:
        print(
            "| backend | call | expstore (median) | floor (median) | ratio (target <= 2x) "
            "| statements | floor's |"
        )
        print("|---|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory() as folder:
            run(f"sqlite:///{folder}/small.db", "SQLite", args)
        if not args.skip_pg:
            url, drop = fresh_pg_database(args.pg)
            try:
                run(url, "Postgres", args)
            finally:
                drop()
    print()
    print("| backend | calls | statements | round trips (a pipeline's statements: one) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        coordination(f"sqlite:///{folder}/coord.db", "SQLite")
    if not args.skip_pg:
        url, drop = fresh_pg_database(args.pg)
        try:
            coordination(url, "Postgres")
        finally:
            drop()


if __name__ == "__main__":
    main()
