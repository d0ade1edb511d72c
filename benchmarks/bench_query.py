"""QueryBuilder against hand-written SQL: count and fetch by task_id, by agent_id, by a JSON path.

The buffer holds ``--rows`` rows (1,000,000 by default): 10 rows per task, 1,000 agents,
``ext_info.policy_version`` cycling through 1,000 values, so each fetch returns 10, N/1,000
and N/1,000 rows. For each query the same statement is run twice in one connection, once
with the WHERE clause :func:`expstore.query.to_sql` compiles and once with the clause a
person would write by hand (``json_extract(data, '$.ext_info.policy_version') = ?`` on
SQLite, ``data -> 'ext_info' -> 'policy_version' = '7'::jsonb`` on Postgres); both select
the columns storage reads, ordered by key. The medians of ``--repeat`` samples (each a loop
of at least ~50 ms) are printed with their ratio (target: within 1.3x). ``ReplayBuffer.count()``
and ``ReplayBuffer.query()``, which also decode rows, are timed for reference.

The buffer is created through ReplayBuffer, then filled with bulk inserts of already-encoded
rows (executemany on SQLite, COPY on Postgres) so that building a million rows takes seconds;
an existing buffer with the right row count is reused (``--rebuild`` forces a refill).

    python benchmarks/bench_query.py [--rows 1000000] [--sqlite PATH] [--pg URL] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, func, insert, select, text, update

from expstore import ReplayBuffer
from expstore.db.schema import buffers, rows
from expstore.query import Condition, QueryBuilder, to_sql

BUFFER = "bench_query"
REPEAT = [5]  # timed runs per query, from --repeat
CHUNK = 20_000
COLUMNS = [c for c in rows.c if c.name not in ("buffer_id", "priority")]
COLUMN_LIST = ", ".join(c.name for c in COLUMNS)


def queries(n: int) -> dict[str, tuple[QueryBuilder, dict[str, str], dict[str, Any]]]:
    """Label -> (builder, hand-written WHERE by dialect, its parameters)."""
    task = f"task-{n // 20}"  # a task in the middle of the table
    return {
        "task_id": (
            QueryBuilder().eq("exp_meta.task_id", task),
            {"sqlite": "task_id = :v", "postgresql": "task_id = :v"},
            {"v": task},
        ),
        **_FIXED,
    }


_FIXED: dict[str, tuple[QueryBuilder, dict[str, str], dict[str, Any]]] = {
    "agent_id": (
        QueryBuilder().eq("exp_meta.agent_id", "agent-42"),
        {"sqlite": "agent_id = :v", "postgresql": "agent_id = :v"},
        {"v": "agent-42"},
    ),
    "json path": (
        QueryBuilder().eq("exp_data.ext_info.policy_version", 7),
        {
            "sqlite": "json_extract(data, '$.ext_info.policy_version') = :v",
            "postgresql": "data -> 'ext_info' -> 'policy_version' = CAST(:v AS jsonb)",
        },
        {"v": 7},
    ),
}


def make_params(start: int, stop: int, buffer_id: int) -> Iterator[dict[str, Any]]:
    for i in range(start, stop):
        yield {
            "buffer_id": buffer_id,
            "id": f"row-{i}",
            "task_id": f"task-{i // 10}",
            "task_name": "web_nav",
            "agent_id": f"agent-{i % 1000}",
            "step": i % 10,
            "execute_time": 1.7e9 + i,
            "pre_agent": None,
            "reward_t": float(i % 2),
            "adv_t": None,
            "v_t": None,
            "done": i % 10 == 9,
            "data": {
                "state": {"url": f"https://shop.example.com/item/{i}", "title": f"Item {i}"},
                "actions": [{"name": "click", "x": i % 800, "y": i % 600}],
                "messages": [{"role": "assistant", "content": "click the add-to-cart button"}],
                "next_state": None,
                "ext_info": {"policy_version": i % 1000, "latency_ms": 12.5},
            },
            "tensors": None,
        }


def fill(engine: Engine, buffer_id: int, n: int) -> None:
    names = [c.name for c in rows.c if c.name not in ("key", "priority")]
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(rows.delete().where(rows.c.buffer_id == buffer_id))
        for start in range(0, n, CHUNK):
            chunk = list(make_params(start, min(n, start + CHUNK), buffer_id))
            if engine.dialect.name == "postgresql":
                from psycopg.types.json import Jsonb

                raw = conn.connection.driver_connection
                assert raw is not None
                statement = f"COPY {rows.name} ({', '.join(names)}) FROM STDIN"
                with raw.cursor() as cursor, cursor.copy(statement) as copy:
                    for p in chunk:  # columns the rows leave out (a version, a digest): NULL
                        copy.write_row(
                            tuple(Jsonb(p[c]) if c == "data" else p.get(c) for c in names)
                        )
            else:
                conn.execute(insert(rows), chunk)
        # The buffer's counters, which writers keep (len(), and whether a run refills)
        this = buffers.c.id == buffer_id
        conn.execute(update(buffers).where(this).values(inserted=n, row_count=n))
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()
    print(f"  filled {n:,} rows in {time.perf_counter() - started:.1f} s")


def median_ms(run: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median milliseconds per call over ``repeat`` samples of at least ~50 ms each."""
    started = time.perf_counter()
    result = run()  # warms the cache and the plan, and sizes the samples
    calls = max(1, min(1000, int(0.05 / max(time.perf_counter() - started, 1e-6))))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(calls):
            result = run()
        times.append((time.perf_counter() - started) / calls)
    return statistics.median(times) * 1000, result


def time_one(
    conn: Connection,
    buffer: ReplayBuffer,
    condition: Condition,
    op: str,
    built: Any,
    hand: Any,
    hand_params: dict[str, Any],
) -> str:
    """Time one statement both ways (and through the buffer); the printed columns."""
    ours_ms, got = median_ms(lambda: conn.execute(built).all(), REPEAT[0])
    hand_ms, expected = median_ms(lambda: conn.execute(hand, hand_params).all(), REPEAT[0])
    assert [r[:2] for r in got] == [r[:2] for r in expected], "the two statements disagree"
    if op == "count":
        shown = got[0][0]
        buffer_ms, total = median_ms(lambda: buffer.count(condition), REPEAT[0])
    else:
        shown = len(got)
        buffer_ms, fetched = median_ms(lambda: list(buffer.query(condition)), REPEAT[0])
        total = len(fetched)
    assert total == shown, "the buffer disagrees"
    return (
        f"{shown:>7,} {ours_ms:>11.2f} {hand_ms:>9.2f} {ours_ms / hand_ms:>5.2f}x "
        f"{buffer_ms:>10.2f}"
    )


def bench(url: str, n: int, rebuild: bool) -> None:
    buffer = ReplayBuffer(url, name=BUFFER)
    engine = create_engine(url)
    dialect = engine.dialect.name
    with engine.connect() as conn:
        buffer_id = conn.execute(select(buffers.c.id).where(buffers.c.name == BUFFER)).scalar_one()
    if rebuild or buffer.count() != n:
        fill(engine, buffer_id, n)
    print(f"\n{dialect}: {buffer.count():,} rows in buffer {BUFFER!r}")
    print(
        f"  {'query':<10} {'op':<6} {'rows':>7} {'builder ms':>11} {'hand ms':>9} "
        f"{'ratio':>6} {'buffer ms':>10}"
    )
    with engine.connect() as conn:
        for label, (builder, hand, params) in queries(n).items():
            condition = builder.build()
            where = to_sql(condition, rows, dialect)
            assert where is not None
            base = rows.c.buffer_id == buffer_id
            built = {
                "count": select(func.count()).select_from(rows).where(base, where),
                "fetch": select(*COLUMNS).where(base, where).order_by(rows.c.key),
            }
            hand_sql = {
                "count": text(
                    f"SELECT count(*) FROM {rows.name} WHERE buffer_id = :b AND {hand[dialect]}"
                ),
                # Typed like the builder's statement, so both decode the same columns.
                "fetch": text(
                    f"SELECT {COLUMN_LIST} FROM {rows.name} "
                    f"WHERE buffer_id = :b AND {hand[dialect]} ORDER BY key"
                ).columns(*COLUMNS),
            }
            hand_params = {"b": buffer_id, **params}
            if dialect == "postgresql" and label == "json path":
                hand_params["v"] = json.dumps(params["v"])
            for op in ("count", "fetch"):
                row = time_one(conn, buffer, condition, op, built[op], hand_sql[op], hand_params)
                print(f"  {label:<10} {op:<6} {row}")
    engine.dispose()
    buffer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the buffer")
    parser.add_argument("--sqlite", help="SQLite file (default: a file in the temp directory)")
    parser.add_argument("--pg", help="Postgres URL, e.g. postgresql+psycopg://postgres@host/db")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per query")
    parser.add_argument("--rebuild", action="store_true", help="refill even if the count fits")
    parser.add_argument("--no-sqlite", action="store_true", help="run Postgres only")
    args = parser.parse_args()
    REPEAT[0] = args.repeat
    if not args.no_sqlite:
        path = args.sqlite or str(Path(tempfile.gettempdir()) / "expstore_bench_query.db")
        bench(f"sqlite:///{path}", args.rows, args.rebuild)
    if args.pg:
        bench(args.pg, args.rows, args.rebuild)


if __name__ == "__main__":
    main()
