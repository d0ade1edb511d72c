"""store_batch throughput against the floor each database allows, measured in one run.

Rows: about 300 bytes of JSON plus one 1,024-element float32 tensor each.
Floors, on the same rows: raw ``sqlite3`` executemany in one transaction (SQLite, same
pragmas, same table and indexes), and psycopg ``COPY ... FORMAT BINARY`` (Postgres).

    python benchmarks/bench_store.py [--rows 100000] [--pg URL]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid

import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.codec import encode_payload
from expstore.model.layout import PAYLOAD_FIELDS

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def make_rows(n: int) -> list[DataRow]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        rows.append(
            DataRow(
                exp_meta=ExpMeta(
                    task_id=f"task-{i // 50}",
                    task_name="web_nav",
                    agent_id=f"agent-{i % 8}",
                    step=i % 50,
                ),
                exp_data=Experience(
                    state={
                        "url": f"https://shop.example.com/item/{i}",
                        "title": "Product page with a reasonably long title " + str(i),
                        "features": rng.standard_normal(1024, dtype=np.float32),
                    },
                    actions=[{"name": "click", "x": int(i % 800), "y": int(i % 600)}],
                    reward_t=float(i % 2),
                    messages=[{"role": "assistant", "content": "click the add-to-cart button"}],
                    ext_info={"policy_version": 3, "latency_ms": 12.5},
                ),
            )
        )
    return rows


def encoded(rows: list[DataRow]) -> list[tuple]:
    out = []
    for r in rows:
        doc, blob = encode_payload({f: getattr(r.exp_data, f) for f in PAYLOAD_FIELDS})
        m, d = r.exp_meta, r.exp_data
        out.append(
            (
                1,
                r.id,
                m.task_id,
                m.task_name,
                m.agent_id,
                m.step,
                m.execute_time,
                m.pre_agent,
                d.reward_t,
                d.adv_t,
                d.v_t,
                d.done,
                doc,
                blob,
            )
        )
    return out


COLS = (
    "buffer_id, id, task_id, task_name, agent_id, step, execute_time, pre_agent, "
    "reward_t, adv_t, v_t, done, data, tensors"
)


def sqlite_floor(path: str, data: list[tuple]) -> float:
    # The same schema expstore uses, created by expstore, then raw sqlite3.
    ReplayBuffer(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    params = [t[:12] + (json.dumps(t[12]), t[13]) for t in data]
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(f"INSERT INTO expstore_rows ({COLS}) VALUES ({','.join('?' * 14)})", params)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def pg_floor(url: str, data: list[tuple]) -> float:
    import psycopg
    from psycopg.types.json import Jsonb

    from expstore.db.dialects import WRITE_COLUMNS, PostgresDialect

    ReplayBuffer(url, name="floor").close()
    u = make_url(url)
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database) as conn:
        bid = conn.execute("SELECT id FROM expstore_buffers WHERE name = 'floor'").fetchone()[0]
        start = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY expstore_rows ({COLS}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            # The floor fills these 14 columns only (not policy_version, content_hash).
            types = dict(zip(WRITE_COLUMNS, PostgresDialect().copy_types, strict=True))
            copy.set_types([types[c.strip()] for c in COLS.split(",")])
            for t in data:
                copy.write_row((bid,) + t[1:12] + (Jsonb(t[12]), t[13]))
        conn.commit()
        return time.perf_counter() - start


def timed_store(url: str, rows: list[DataRow], name: str = "default") -> float:
    with ReplayBuffer(url, name=name) as buf:
        start = time.perf_counter()
        buf.store_batch(rows)
        elapsed = time.perf_counter() - start
        assert len(buf) == len(rows)
    return elapsed


def fresh_pg(server: str) -> tuple[str, object]:
    url = make_url(server)
    name = f"expstore_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    return url.set(database=name).render_as_string(hide_password=False), (admin, name)


def checkpoint(server: str) -> None:
    admin = create_engine(make_url(server), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text("CHECKPOINT"))
    admin.dispose()


def drop_pg(handle: object) -> None:
    admin, name = handle  # type: ignore[misc]
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


def report(label: str, n: int, ours: float, floor: float) -> None:
    print(
        f"{label:8s} expstore {n / ours:>10,.0f} rows/s ({ours:.2f} s) | floor {n / floor:>10,.0f} "
        f"rows/s ({floor:.2f} s) | ratio {floor / ours:.2f} (target >= 0.70)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each side; medians")
    parser.add_argument("--pg", default=os.environ.get("EXPSTORE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--skip-pg", action="store_true")
    args = parser.parse_args()

    rows = make_rows(args.rows)
    data = encoded(rows)
    size = len(json.dumps(data[0][12]).encode())
    print(f"{args.rows:,} rows, JSON {size} bytes + tensor {len(data[0][13])} bytes each")
    results: dict[str, list[tuple[float, float]]] = {"sqlite": [], "postgres": []}
    for run in range(args.repeats):
        # Which side goes first alternates, so neither always meets a fresher disk.
        ours_first = run % 2 == 1
        timings: dict[str, float] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for side in ("ours", "floor") if ours_first else ("floor", "ours"):
                # os.sync() before each side, so neither waits on the other's dirty pages.
                os.sync()
                path = os.path.join(tmp, f"{side}.db")
                if side == "floor":
                    timings[side] = sqlite_floor(path, data)
                else:
                    timings[side] = timed_store(f"sqlite:///{path}", rows)
            results["sqlite"].append((timings["ours"], timings["floor"]))
            report("sqlite", args.rows, timings["ours"], timings["floor"])
        if args.skip_pg:
            continue
        # Each side gets a database of its own, so neither writes into the other's indexes,
        # and a checkpoint before each run, so neither pays for the other's WAL.
        floor_url, floor_db = fresh_pg(args.pg)
        ours_url, ours_db = fresh_pg(args.pg)
        try:
            for side in ("ours", "floor") if ours_first else ("floor", "ours"):
                checkpoint(args.pg)
                os.sync()
                if side == "floor":
                    timings[side] = pg_floor(floor_url, data)
                else:
                    timings[side] = timed_store(ours_url, rows, name="ours")
            results["postgres"].append((timings["ours"], timings["floor"]))
            report("postgres", args.rows, timings["ours"], timings["floor"])
        finally:
            drop_pg(floor_db)
            drop_pg(ours_db)
    print(f"medians of {args.repeats} runs:")
    for label, runs in results.items():
        if runs:
            ours = statistics.median(o for o, _ in runs)
            floor = statistics.median(f for _, f in runs)
            report(label, args.rows, ours, floor)
            ratios = sorted(f / o for o, f in runs)
            print(
                f"{'':8s} per-run ratios {', '.join(f'{r:.2f}' for r in ratios)}; "
                f"median {statistics.median(ratios):.2f}"
            )


if __name__ == "__main__":
    main()
