"""Building the large buffers of ``bench_scale.py`` once, fast, into a scratch place.

A buffer of ``n`` small rows (metadata + ~100 bytes of JSON: ``state.difficulty`` 0-9,
a short observation list; 10 agents, 8 steps per task; policy versions 0-99 in insertion
order, equal shares, the buffer's current version 99) is made by storing the first
``SEED_ROWS`` through ``store_batch`` (so they are exactly what expstore writes), then
copying the rows already there with ``INSERT ... SELECT`` (SQLAlchemy Core), each copy with
new ids and task ids, until the buffer holds ``n`` rows. The buffer's counters
(``inserted``, ``row_count``) are set to match, and the database analysed.

SQLite: ``<scratch>/scale_<n>.db``; Postgres: database ``expstore_scale_<n>`` on the server
of ``--pg-url``. Both are kept for later runs (delete them by hand).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, func, insert, literal, select, text, update
from sqlalchemy.engine import make_url

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.db.schema import buffers, rows

__all__ = ["AGENTS", "BUFFER", "VERSIONS", "built", "dataset_url"]

BUFFER = "scale"
AGENTS = 10
STEPS = 8
SEED_ROWS = 10_000
#: Policy versions 0 .. VERSIONS - 1 in insertion order; the current one the last.
VERSIONS = 100


def dataset_url(backend: str, n: int, scratch: Path, pg_url: str) -> str:
    """Where the ``n``-row data set of ``backend`` lives."""
    if backend == "sqlite":
        return f"sqlite:///{scratch / f'scale_{n}.db'}"
    return make_url(pg_url).set(database=f"expstore_scale_{n}").render_as_string(False)


def _seed_rows(count: int, n: int) -> list[DataRow]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        task = i // STEPS
        out.append(
            DataRow(
                exp_meta=ExpMeta(
                    task_id=f"t{task}",
                    task_name=f"level{task % 5}",
                    agent_id=f"agent{i % AGENTS}",
                    step=i % STEPS,
                    policy_version=i * VERSIONS // n,
                ),
                exp_data=Experience(
                    state={
                        "difficulty": int(rng.integers(0, 10)),
                        "obs": [round(float(x), 3) for x in rng.random(8)],
                    },
                    actions=[{"move": int(rng.integers(0, 4))}],
                    reward_t=float(rng.random()),
                    done=i % STEPS == STEPS - 1,
                ),
            )
        )
    return out


def _create_database(url: str) -> None:
    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": target.database}
        ).first()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    admin.dispose()


def built(url: str, n: int) -> str:
    """``url`` holding buffer ``scale`` with ``n`` rows (built now if it does not)."""
    if url.startswith("postgresql"):
        _create_database(url)
    with ReplayBuffer(url, name=BUFFER, upgrade=True) as buffer:
        have = len(buffer)
        if have == n:
            return url
        if have:
            raise SystemExit(f"{url} holds {have:,} rows in buffer {BUFFER!r}, not {n:,}; drop it")
        started = time.perf_counter()
        buffer.store_batch(_seed_rows(min(SEED_ROWS, n), n))
    engine = create_engine(url)
    copy = 0
    with engine.begin() as conn:
        buffer_id = conn.execute(select(buffers.c.id).where(buffers.c.name == BUFFER)).scalar_one()
        have = min(SEED_ROWS, n)
        first_key = conn.execute(
            select(func.min(rows.c.key)).where(rows.c.buffer_id == buffer_id)
        ).scalar_one()
        names = [c.name for c in rows.c if c.name != "key"]
        while have < n:
            copy += 1
            take = min(have, n - have)
            tag = literal(f".{copy}")
            source = (
                select(rows)
                .where(rows.c.buffer_id == buffer_id)
                .order_by(rows.c.key)
                .limit(take)
                .subquery()
            )
            # the copy's keys follow on from the rows there (one writer, keys handed out
            # in order), so its versions go on growing with them
            position = source.c.key - first_key + have
            changed = {
                "id": source.c.id + tag,
                "task_id": source.c.task_id + tag,
                "policy_version": position * VERSIONS // n,
            }
            picked = select(*(changed.get(name, source.c[name]) for name in names))
            conn.execute(insert(rows).from_select(names, picked))
            have += take
            rate = (have - SEED_ROWS) / (time.perf_counter() - started)
            print(f"  {have:,} rows ({rate:,.0f} rows/s)", flush=True)
        count = conn.execute(
            select(func.count()).select_from(rows).where(rows.c.buffer_id == buffer_id)
        ).scalar_one()
        assert count == n, (count, n)
        mine = rows.c.buffer_id == buffer_id
        low, high = conn.execute(
            select(func.min(rows.c.policy_version), func.max(rows.c.policy_version)).where(mine)
        ).one()
        assert (low, high) == (0, VERSIONS - 1), (low, high)
        conn.execute(
            update(buffers)
            .where(buffers.c.id == buffer_id)
            .values(inserted=n, row_count=n, policy_version=VERSIONS - 1)
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE"))
    engine.dispose()
    print(f"  built {n:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
    return url


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--scratch", type=Path, default=Path("/work/scratch"))
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    for backend in args.backends.split(","):
        for size in args.sizes:
            print(f"{backend} {size:,}", flush=True)
            built(dataset_url(backend, size, args.scratch, args.pg_url), size)
