"""Benchmark: writing a batch of columns (``buffer.extend``) against building DataRows and
against the raw insert floor, measured in one run (issue: Ecosystem, item 1).

Data: what a vectorised environment hands over per step, ``--rows`` rows (default 20,000):
``obs`` float32 ``[N, 16]``, an action, a reward and a done per row, task ids ``env<i>``,
one agent id. For each backend, three databases that grow alike (``--repeats`` writes of N
rows each; SQLite files, Postgres databases):

- ``extend``: ``buffer.extend(columns)``;
- ``DataRows``: building a DataRow per row from the same columns (pydantic validation),
  then ``store_batch`` of them; and the building alone;
- the floor: the rows exactly as extend stores them (every column, the content digest
  included), already encoded, inserted by raw ``sqlite3`` executemany in one transaction /
  psycopg ``COPY ... FORMAT BINARY`` into the same table and indexes, as full as extend's.

Also printed: ``bench_store.py``'s floor (14 columns, no digest, an empty database each
time), the figure earlier runs compared with.

Targets: extend ≥ 0.7x the floor's rate; ≥ 10x faster than building the DataRows.

    python benchmarks/bench_extend.py [--rows 20000] [--pg URL]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import DEFAULT_PG, drop_pg, encoded, fresh_pg, pg_floor, sqlite_floor  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer  # noqa: E402
from expstore.db.dialects import WRITE_COLUMNS, PostgresDialect  # noqa: E402
from expstore.model.columnar import parse_columns  # noqa: E402
from expstore.storage.column_rows import encoded_columns  # noqa: E402


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


def stored_rows(cols: dict) -> list[tuple]:
    """The rows extend stores for ``cols``, encoded (WRITE_COLUMNS order, buffer 1)."""
    parsed = parse_columns(cols)
    encoded = encoded_columns(parsed)
    assert encoded is not None, "the benchmark's columns take the column path"
    return encoded.encode(0, parsed.n, 1)


Floor = tuple[Callable[[list[tuple]], float], Callable[[], None]]


def sqlite_full_floor(path: str) -> Floor:
    """The full floor on SQLite, and how to close its connection."""
    ReplayBuffer(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    insert = (
        f"INSERT INTO expstore_rows ({','.join(WRITE_COLUMNS)}) "
        f"VALUES ({','.join('?' * len(WRITE_COLUMNS))})"
    )

    def floor(data: list[tuple]) -> float:
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, data)
        conn.execute("COMMIT")
        return time.perf_counter() - start

    return floor, conn.close


def pg_full_floor(url: str) -> Floor:
    """The full floor on Postgres, and how to close its connection."""
    import psycopg
    from psycopg.types.json import Jsonb

    ReplayBuffer(url).close()
    u = make_url(url)
    conn = psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
    data_at = WRITE_COLUMNS.index("data")

    def floor(data: list[tuple]) -> float:
        start = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                f"COPY expstore_rows ({','.join(WRITE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(PostgresDialect().copy_types)
            for t in data:
                copy.write_row((*t[:data_at], Jsonb(t[data_at]), *t[data_at + 1 :]))
        conn.commit()
        return time.perf_counter() - start

    return floor, conn.close


def run(label: str, urls: list[str], n: int, repeats: int, floors) -> None:  # noqa: ANN001
    (full_floor, close), old_floor = floors
    ext, rows_total, build, full, old = [], [], [], [], []
    with ReplayBuffer(urls[0], name="extend") as a, ReplayBuffer(urls[1], name="rows") as b:
        for r in range(repeats):
            cols = columns(n, 2 * r)
            t0 = time.perf_counter()
            a.extend(cols)
            ext.append(time.perf_counter() - t0)
            full.append(full_floor(stored_rows(columns(n, 2 * r + 100))))
            cols = columns(n, 2 * r + 1)
            t0 = time.perf_counter()
            rows = as_rows(cols)
            t1 = time.perf_counter()
            b.store_batch(rows)
            t2 = time.perf_counter()
            build.append(t1 - t0)
            rows_total.append(t2 - t0)
            old.append(old_floor(encoded(rows)))
        assert len(a) == len(b) == n * repeats
    close()
    e, t, bu, f, o = (statistics.median(x) for x in (ext, rows_total, build, full, old))
    print(
        f"{label}: {n:,} rows per write, {repeats} writes (medians)\n"
        f"  extend(columns)          {n / e:>10,.0f} rows/s ({e * 1e3:.0f} ms; per write "
        f"{' '.join(f'{x * 1e3:.0f}' for x in ext)})\n"
        f"  DataRows + store_batch   {n / t:>10,.0f} rows/s ({t * 1e3:.0f} ms; building alone "
        f"{bu * 1e3:.0f} ms)\n"
        f"  raw insert floor         {n / f:>10,.0f} rows/s ({f * 1e3:.0f} ms; per write "
        f"{' '.join(f'{x * 1e3:.0f}' for x in full)})\n"
        f"  bench_store's floor      {n / o:>10,.0f} rows/s ({o * 1e3:.0f} ms; 14 columns, "
        "an empty database each time)\n"
        f"  extend / floor rate {f / e:.2f}x (target >= 0.7; bench_store's floor {o / e:.2f}x)\n"
        f"  DataRows + store / extend {t / e:.1f}x (target >= 10); building DataRows alone / "
        f"extend {bu / e:.1f}x; extend's own work (extend - floor) {(e - f) * 1e3:.0f} ms vs "
        f"DataRows path's (DataRows + store - floor) {(t - f) * 1e3:.0f} ms: "
        f"{(t - f) / max(e - f, 1e-9):.1f}x"
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
            [f"sqlite:///{tmp}/extend.db", f"sqlite:///{tmp}/rows.db"],
            args.rows,
            args.repeats,
            (
                sqlite_full_floor(f"{tmp}/floor.db"),
                lambda data: sqlite_floor(f"{tmp}/floor{next(counter)}.db", data),
            ),
        )
    made = [fresh_pg(args.pg) for _ in range(4)]
    try:
        urls = [url for url, _ in made]
        run(
            "postgres",
            urls[:2],
            args.rows,
            args.repeats,
            (pg_full_floor(urls[2]), lambda data: pg_floor(urls[3], data)),
        )
    finally:
        for _, handle in made:
            drop_pg(handle)


if __name__ == "__main__":
    main()
