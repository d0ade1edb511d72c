"""Queries by task_id and by agent_id use an index, on SQLite and on Postgres.

The statement is the one storage runs: the buffer's id and the compiled condition. The
table holds a few thousand rows over many tasks and agents, and Postgres has ANALYZEd it,
so the planner chooses freely; on Postgres the test also runs with ``enable_seqscan = off``
(which only forbids a sequential scan when another plan exists) to show that the index
*can* serve the condition whatever the table's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Integer, bindparam, create_engine, func, select, text

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from expstore.db.schema import buffers, rows
from expstore.query import QueryBuilder, to_sql

TASK_INDEX = "ix_expstore_rows_buffer_id_task_id_step"
AGENT_INDEX = "ix_expstore_rows_buffer_id_agent_id"


def make_rows(n: int = 3000) -> list[DataRow]:
    return [
        DataRow(
            exp_meta=ExpMeta(task_id=f"task{i % 300}", agent_id=f"agent{i % 100}", step=i // 300),
            exp_data=Experience(state={"i": i}),
        )
        for i in range(n)
    ]


@pytest.fixture
def connection(db_url: str, buffer_name: str) -> Iterator[tuple[Connection, int]]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows())
        engine = create_engine(buffer.storage.url)  # type: ignore[attr-defined]
        try:
            with engine.connect() as conn:
                buffer_id = conn.execute(
                    select(buffers.c.id).where(buffers.c.name == buffer_name)
                ).scalar_one()
                conn.execute(text("ANALYZE"))
                yield conn, buffer_id
        finally:
            engine.dispose()
            buffer.clear()


def plan(conn: Connection, buffer_id: int, builder: QueryBuilder, count: bool = False) -> str:
    dialect = conn.dialect
    where = to_sql(builder.build(), rows, dialect.name)
    assert where is not None
    columns: Any = [func.count()] if count else [rows.c.key, rows.c.id, rows.c.data]
    stmt = select(*columns).select_from(rows).where(rows.c.buffer_id == buffer_id, where)
    compiled = stmt.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    if dialect.name == "sqlite":
        params: Any = tuple(compiled.params[name] for name in compiled.positiontup or ())
        found = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", params).all()
        return "\n".join(str(row[-1]) for row in found)
    found = conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).all()
    return "\n".join(row[0] for row in found)


@pytest.mark.parametrize("count", [False, True], ids=["fetch", "count"])
def test_query_by_task_id_uses_the_task_index(
    connection: tuple[Connection, int], count: bool
) -> None:
    conn, buffer_id = connection
    shown = plan(conn, buffer_id, QueryBuilder().eq("exp_meta.task_id", "task7"), count)
    assert TASK_INDEX in shown, shown


@pytest.mark.parametrize("count", [False, True], ids=["fetch", "count"])
def test_query_by_agent_id_uses_the_agent_index(
    connection: tuple[Connection, int], count: bool
) -> None:
    conn, buffer_id = connection
    shown = plan(conn, buffer_id, QueryBuilder().eq("agent_id", "agent7"), count)
    assert AGENT_INDEX in shown, shown


def test_query_by_task_id_and_step_range_uses_the_task_index(
    connection: tuple[Connection, int],
) -> None:
    conn, buffer_id = connection
    builder = QueryBuilder().eq("task_id", "task7").and_().gte("step", 3)
    shown = plan(conn, buffer_id, builder)
    assert TASK_INDEX in shown, shown


def test_query_by_agent_id_list_uses_the_agent_index(connection: tuple[Connection, int]) -> None:
    conn, buffer_id = connection
    shown = plan(conn, buffer_id, QueryBuilder().in_("agent_id", ["agent1", "agent2"]))
    assert AGENT_INDEX in shown, shown


@pytest.mark.parametrize(
    ("builder", "index"),
    [
        (QueryBuilder().eq("task_id", "task7"), TASK_INDEX),
        (QueryBuilder().eq("agent_id", "agent7"), AGENT_INDEX),
    ],
    ids=["task_id", "agent_id"],
)
def test_postgres_can_serve_the_query_from_the_index_alone(
    connection: tuple[Connection, int], builder: QueryBuilder, index: str
) -> None:
    conn, buffer_id = connection
    if conn.dialect.name != "postgresql":
        pytest.skip("enable_seqscan is a Postgres setting")
    conn.execute(text("SET enable_seqscan = off"))
    try:
        shown = plan(conn, buffer_id, builder)
    finally:
        conn.execute(text("RESET enable_seqscan"))
    assert index in shown, shown


def _id_lookup_plan(url: str, buffer: ReplayBuffer, ids: list[str]) -> str:
    from expstore.db.dialects import PostgresDialect

    stmt = PostgresDialect().ids_statement(buffer.storage.buffer_id, ids)  # type: ignore[attr-defined]
    engine = create_engine(url)
    with engine.connect() as conn:
        compiled = stmt.compile(dialect=conn.dialect)
        found = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    engine.dispose()
    return "\n".join(r[0] for r in found)


@pytest.fixture
def fresh_pg_url(pg_server_url: str) -> Iterator[str]:
    """A database of its own, never analyzed, dropped afterwards."""
    import uuid

    from sqlalchemy.engine import make_url

    server = make_url(pg_server_url)
    name = f"expstore_stats_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_ids_are_looked_up_by_index_on_postgres_even_without_statistics(
    fresh_pg_url: str,
) -> None:
    """update_priorities and the duplicate-id check find rows by id; on a freshly loaded
    table (never ANALYZEd: a new database, autovacuum off or not yet run) Postgres must
    still use the (buffer_id, id) index rather than scan the buffer."""
    with ReplayBuffer(fresh_pg_url) as buffer:
        stored = make_rows(4_000)  # fewer than a writer analyzes after
        buffer.store_batch(stored)
        plan = _id_lookup_plan(fresh_pg_url, buffer, [r.id for r in stored[::80]])
    assert "uq_expstore_rows_buffer_id_id" in plan, plan


def test_a_bulk_load_into_a_new_buffer_refreshes_statistics_taken_before_it(
    fresh_pg_url: str,
) -> None:
    """Statistics that know only another buffer make Postgres estimate a new buffer at one
    row and look ids up through any (buffer_id, ...) index, filtering the whole buffer per
    id. The writer that loads the new buffer analyzes the table, so ids are looked up by the
    (buffer_id, id) index again."""
    with ReplayBuffer(fresh_pg_url, name="old") as old:
        old.store_batch(make_rows(4_000))
    engine = create_engine(fresh_pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE expstore_rows"))  # taken when only "old" existed
        analyzed = conn.execute(text(_LAST_ANALYZE)).scalar()
    with ReplayBuffer(fresh_pg_url, name="new") as new:
        stored = make_rows(6_000)
        new.store_batch(stored)
        plan = _id_lookup_plan(fresh_pg_url, new, [r.id for r in stored[::80]])
    assert "uq_expstore_rows_buffer_id_id" in plan, plan
    with engine.connect() as conn:
        assert conn.execute(text(_LAST_ANALYZE)).scalar() > analyzed
    engine.dispose()


def test_many_writers_of_small_groups_refresh_statistics_together(fresh_pg_url: str) -> None:
    """Found by a user: the refresh counted rows per handle, so actors that each wrote a
    few groups of 8 rows never reached it, and a new buffer's group claims took seconds
    until a manual ANALYZE. Now each write looks with a chance in proportion to its rows:
    40 actors writing 8-row groups, 100 rows each, refresh the statistics."""
    from random import Random

    with ReplayBuffer(fresh_pg_url, name="old") as old:
        old.store_batch(make_rows(100))
    engine = create_engine(fresh_pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE expstore_rows"))
        analyzed = conn.execute(text(_LAST_ANALYZE)).scalar()
    for actor in range(40):
        with ReplayBuffer(fresh_pg_url, name="new") as new:
            new.sql.handle.dialect._chance = Random(actor)  # type: ignore[attr-defined]
            rows = make_rows(96)
            for start in range(0, 96, 8):
                new.store_batch(rows[start : start + 8])
    with engine.connect() as conn:
        assert conn.execute(text(_LAST_ANALYZE)).scalar() > analyzed
    engine.dispose()


_LAST_ANALYZE = "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'expstore_rows'"


def test_postgres_sessions_plan_every_statement_for_its_values_without_jit(pg_url: str) -> None:
    """Every connection a buffer opens turns JIT off and prepares no statement unasked: a
    generic plan made for one buffer's size ran the FIFO trim 25-60x slower on another's,
    and JIT compiled the trim's DELETE for longer than it ran. The hot statements compiled
    once (index look-ups) are prepared, and stay prepared across the pool's hand-backs."""
    from expstore.db.compiled import CompiledSelect
    from expstore.db.engine import create_sql_engine

    engine = create_sql_engine(pg_url)
    prepared = text("SELECT count(*) FROM pg_prepared_statements")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW jit")).scalar() == "off"
            for _ in range(8):  # more than psycopg's default threshold of 5
                conn.execute(text("SELECT count(*) FROM pg_class WHERE relpages >= :b"), {"b": 1})
            assert conn.execute(prepared).scalar() == 0
            # the settings hold inside the transactions expstore runs, not only at connect
            conn.commit()
            with conn.begin():
                assert conn.execute(text("SHOW jit")).scalar() == "off"
        hot = CompiledSelect(select(bindparam("k", type_=Integer) + 1), engine.dialect)
        for _ in range(3):  # each time a read given back to the pool
            with engine.connect() as conn:
                assert hot.run(conn, k=1) == [(2,)]
                assert conn.execute(prepared).scalar() == 1
    finally:
        engine.dispose()
