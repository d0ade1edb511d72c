"""The Alembic migrations agree with the models and move both ways, on both backends."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from expstore import QueryBuilder, ReplayBuffer, SchemaVersionError
from expstore.db import migrate
from expstore.db.schema import VERSION_TABLE, compared, metadata
from expstore.storage.sql import create_sql_engine
from tests.helpers import make_rows


@pytest.fixture
def fresh_url(request: pytest.FixtureRequest, tmp_path, db_url: str):
    """A database with no expstore tables: a new SQLite file, or a Postgres database of
    the test's own (the shared one holds what other tests stored, such as checkpoints an
    old schema cannot hold, so it is never downgraded)."""
    if db_url.startswith("postgresql"):
        yield request.getfixturevalue("own_pg_database")
        return
    engine = create_sql_engine(db_url)
    write = engine.execution_options(expstore_begin="IMMEDIATE")
    migrate.downgrade(write, "base") if _has_schema(engine) else None
    yield db_url
    engine.dispose()


def _has_schema(engine) -> bool:
    return inspect(engine).has_table(VERSION_TABLE)


def _writer(url: str):
    return create_sql_engine(url).execution_options(expstore_begin="IMMEDIATE")


def test_migrations_head_matches_the_models(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "version_table": VERSION_TABLE,
                "include_object": compared(conn.dialect.name),
            },
        )
        diff = compare_metadata(context, metadata)
    assert diff == []


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url) as buf:
        buf.store_batch(make_rows(3))
    migrate.downgrade(engine, "0001")
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == "0001"
        assert "priority" not in {c["name"] for c in inspect(conn).get_columns("expstore_rows")}
        assert conn.execute(text("SELECT count(*) FROM expstore_rows")).scalar_one() == 3
    migrate.downgrade(engine, "base")
    assert not inspect(engine).has_table("expstore_rows")
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()


def test_older_schema_raises_with_the_upgrade_command(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine, "0001")
    with pytest.raises(SchemaVersionError, match="expstore upgrade --db") as info:
        ReplayBuffer(fresh_url)
    assert "upgrade=True" in str(info.value)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == "0001"
    with ReplayBuffer(fresh_url, upgrade=True) as buf:
        buf.store_batch(make_rows(2))
        assert len(buf) == 2
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()


def test_newer_schema_raises_and_writes_nothing(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_future'"))
    with pytest.raises(SchemaVersionError, match="newer than this expstore") as info:
        ReplayBuffer(fresh_url, name="never_created")
    assert "nothing was written" in str(info.value)
    with engine.connect() as conn:
        names = conn.execute(text("SELECT name FROM expstore_buffers")).scalars().all()
        assert "never_created" not in names
        assert migrate.current_revision(conn) == "9999_future"
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE {VERSION_TABLE} SET version_num = :v"), {"v": migrate.head_revision()}
        )


def test_upgrade_sql_prints_without_running(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    sql = migrate.upgrade_sql(url)
    assert "CREATE TABLE expstore_rows" in sql
    assert not (tmp_path / "x.db").exists() or not inspect(create_sql_engine(url)).has_table(
        "expstore_rows"
    )


def _forget_revision(url: str, *statements: str) -> None:
    """Leave expstore's tables without a schema revision, as a cut-off creation did."""
    engine = create_sql_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {VERSION_TABLE}"))
        for statement in statements:
            conn.execute(text(statement))
    engine.dispose()


def test_tables_without_a_revision_are_repaired_keeping_their_rows(fresh_url: str) -> None:
    """Older expstore threads cross-wired Alembic and left databases with tables but no
    revision (or some tables missing): opening one finishes the schema and records it."""
    with ReplayBuffer(fresh_url, name="kept") as buffer:
        buffer.store_batch(make_rows(5))
    _forget_revision(fresh_url, "DROP TABLE expstore_sample_counts")
    with ReplayBuffer(fresh_url, name="kept") as buffer:
        assert len(buffer) == 5
        assert len(buffer.claim(5, consumer="a")) == 5  # the claim tables work
    engine = create_sql_engine(fresh_url)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        assert inspect(conn).has_table("expstore_sample_counts")
    engine.dispose()


def test_tables_without_a_revision_that_differ_are_reported_not_touched(fresh_url: str) -> None:
    with ReplayBuffer(fresh_url, name="kept") as buffer:
        buffer.store_batch(make_rows(5))
    _forget_revision(fresh_url, "ALTER TABLE expstore_rows ADD COLUMN extra TEXT")
    with pytest.raises(SchemaVersionError, match="remove_column expstore_rows extra"):
        ReplayBuffer(fresh_url, name="kept")
    engine = create_sql_engine(fresh_url)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) is None
        assert conn.execute(text("SELECT count(*) FROM expstore_rows")).scalar() == 5
    engine.dispose()
    # Once what differs is put back, opening repairs it (and leaves the database as the
    # fixture expects).
    _forget_revision(fresh_url, "ALTER TABLE expstore_rows DROP COLUMN extra")
    with ReplayBuffer(fresh_url, name="kept") as buffer:
        assert len(buffer) == 5


def test_revision_0005_keeps_rows_and_counts_them_as_inserted(fresh_url: str) -> None:
    from expstore import RateLimiter

    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        buf.store_batch(make_rows(2))
    migrate.downgrade(engine, "0004")  # as revision 0004 left them: two rows, no hashes
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("expstore_rows")}
        assert "policy_version" not in columns and "content_hash" not in columns
        assert conn.execute(text("SELECT count(*) FROM expstore_rows")).scalar_one() == 2
        assert not inspect(conn).has_table("expstore_rate_limits")
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        rows = list(buf.query())
        assert [r.exp_meta.policy_version for r in rows] == [None, None]
        assert buf.policy_version() is None
        buf.set_rate_limiter(RateLimiter(min_size=2, samples_per_insert=1.0, timeout_s=0))
        stats = buf.rate_limit_stats()
        assert stats is not None and stats.inserted == 2  # the rows there count as inserted
        # Rows stored before 0005 carry no content hash: dedup does not compare with them.
        copy = rows[0].model_copy(update={"id": "new"})
        assert buf.store(copy, dedup="skip") == 1
        assert buf.store(copy.model_copy(update={"id": "newer"}), dedup="skip") == 0


def test_a_version_table_with_two_rows_is_reported_with_the_repair(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0004')"))
    with pytest.raises(SchemaVersionError, match="holds 2 revisions") as info:
        ReplayBuffer(fresh_url)
    head = migrate.head_revision()
    assert f"DELETE FROM {VERSION_TABLE} WHERE version_num <> '{head}'" in str(info.value)
    with engine.begin() as conn:  # the repair it names works
        conn.execute(text(f"DELETE FROM {VERSION_TABLE} WHERE version_num <> '{head}'"))
    with ReplayBuffer(fresh_url) as buf:
        assert len(buf) == 0


def test_revision_0006_counts_the_rows_each_buffer_holds(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    for name, n in (("a", 3), ("b", 5)):
        with ReplayBuffer(fresh_url, name=name) as buf:
            buf.store_batch(make_rows(n))
    migrate.downgrade(engine, "0005")
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("expstore_buffers")}
        assert "row_count" not in columns
        assert conn.execute(text("SELECT count(*) FROM expstore_rows")).scalar_one() == 8
    migrate.upgrade(engine)
    for name, n in (("a", 3), ("b", 5)):
        with ReplayBuffer(fresh_url, name=name, capacity=4) as buf:
            assert buf.storage.index.state_now()[2] == n
            buf.store_batch(make_rows(1))  # FIFO by the count: down to the capacity
            assert len(buf) == 4 and buf.storage.index.state_now()[2] == 4


def test_revision_0007_adds_task_summaries_and_the_largest_key_given(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="a") as buf:
        buf.store_batch(make_rows(6))
        buf.create_summary()
    migrate.downgrade(engine, "0006")  # summaries and the counter go; the rows stay
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        assert not {"expstore_task_stats", "expstore_counters"} & tables
        columns = {c["name"] for c in inspect(conn).get_columns("expstore_buffers")}
        assert not {"summary_from", "summary_through"} & columns
        assert conn.execute(text("SELECT count(*) FROM expstore_rows")).scalar_one() == 6
        newest = conn.execute(text("SELECT max(key) FROM expstore_rows")).scalar_one()
    migrate.upgrade(engine)
    with engine.connect() as conn:
        given = text("SELECT value FROM expstore_counters WHERE name = 'row_key'")
        assert conn.execute(given).scalar_one() == newest
    with ReplayBuffer(fresh_url, name="a") as buf:
        assert buf.storage.summary_state() is None  # none kept until asked again
        buf.create_summary()
        assert buf.storage.summary_tasks() == 4
        buf.store_batch(make_rows(1))
        assert buf.storage.index.state_now()[0].max_key == newest + 1


def test_revision_0008_moves_priorities_to_a_table_of_their_own(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="a") as buf:
        stored = make_rows(5)
        buf.store_batch(stored)
        ids = [row.id for row in stored]
        buf.update_priorities(ids[:3], [0.5, 2.0, 7.25])
    migrate.downgrade(engine, "0007")  # the table goes; each priority back on its row
    read = text("SELECT id, priority FROM expstore_rows ORDER BY key")
    with engine.connect() as conn:
        assert not inspect(conn).has_table("expstore_priorities")
        assert conn.execute(read).all() == list(zip(ids, [0.5, 2.0, 7.25, None, None], strict=True))
        conn.execute(text("UPDATE expstore_rows SET priority = 3.5 WHERE id = :i"), {"i": ids[4]})
        conn.commit()
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert "priority" not in {c["name"] for c in inspect(conn).get_columns("expstore_rows")}
        got = text(
            "SELECT r.id, p.priority, p.buffer_id = r.buffer_id FROM expstore_priorities p "
            "JOIN expstore_rows r ON r.key = p.key ORDER BY r.key"
        )
        assert conn.execute(got).all() == [
            (ids[0], 0.5, True),
            (ids[1], 2.0, True),
            (ids[2], 7.25, True),
            (ids[4], 3.5, True),
        ]
    with ReplayBuffer(fresh_url, name="a") as buf:
        assert buf.delete(QueryBuilder().eq("id", ids[0]).build()) == 1  # its entry goes too
        assert buf.update_priorities(ids[3:], [1.0, 9.0]) == 2
    entries = text("SELECT p.priority FROM expstore_priorities p ORDER BY p.key")
    with engine.connect() as conn:
        assert conn.execute(entries).scalars().all() == [2.0, 7.25, 1.0, 9.0]


def test_revision_0013_keeps_checkpoints_and_stores_them_as_text(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        buf.store_batch(make_rows(2))
        buf.claim(1, consumer="learner").ack(checkpoint={"step": 3, "cursor": [1, "a"]})
    migrate.downgrade(engine, "0009")  # checkpoints as JSON, as before
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("expstore_buffers")}
        assert "discarded" not in columns
    with engine.begin() as conn:  # what a learner before revision 0013 stored
        conn.execute(
            text(
                "INSERT INTO expstore_checkpoints (buffer_id, consumer, seq, state, created_at) "
                "SELECT id, 'older', 1, :state, 0 FROM expstore_buffers"
            ),
            {"state": '{"step": 1}'},
        )
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        assert buf.checkpoint("learner") == {"step": 3, "cursor": [1, "a"]}
        assert buf.checkpoint("older") == {"step": 1}
        buf.claim(1, consumer="learner").ack(checkpoint=1.0)
        back = buf.checkpoint("learner")
        assert back == 1.0 and type(back) is float


def test_revision_0015_counts_what_each_consumer_acked_before_it(fresh_url: str) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        buf.store_batch(make_rows(5))
        buf.claim(3, consumer="learner").ack()
        buf.claim(1, consumer="other").ack()
        buf.claim(1, consumer="other")  # held, not acked
    migrate.downgrade(engine, "0014")
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("expstore_consumers")}
        assert "acked" not in columns
        assert not inspect(conn).has_table("expstore_targets")
    migrate.upgrade(engine)
    counted = text("SELECT consumer, acked FROM expstore_consumers ORDER BY consumer")
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(counted)] == [("learner", 3), ("other", 1)]


def test_revision_0017_adds_tracked_changes_and_drops_them_keeping_the_rows(
    fresh_url: str,
) -> None:
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    changed = QueryBuilder().unchanged("task_id").build()
    with ReplayBuffer(fresh_url, name="old") as buf:
        buf.store_batch(make_rows(8, tasks=1))
        buf.track_changes("task_id")
        tracked = buf.count(changed)
        assert tracked == 7  # every step but the first
    migrate.downgrade(engine, "0016")
    with engine.connect() as conn:
        assert not inspect(conn).has_table("expstore_changes")
        assert not inspect(conn).has_table("expstore_tracked_paths")
        assert conn.execute(text("SELECT count(*) FROM expstore_rows")).scalar_one() == 8
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        assert buf.sql.tracked_changes() == []
        assert buf.count(changed) == tracked  # by the probe again
        buf.track_changes("task_id")
        assert buf.count(changed) == tracked


def test_revision_0018_moves_the_flags_onto_the_rows_and_back(fresh_url: str) -> None:
    """Downgraded to 0017, the flags are back in expstore_changes; upgraded again, the rows
    carry them and changed() answers as before, on both paths a buffer tracks."""
    engine = _writer(fresh_url)
    migrate.upgrade(engine)
    conditions = [
        QueryBuilder().unchanged("task_id").build(),
        QueryBuilder().unchanged("agent_id", "next").build(),
        QueryBuilder().changed("agent_id").build(),
    ]
    with ReplayBuffer(fresh_url, name="old") as buf:
        buf.store_batch(make_rows(12, tasks=2))
        buf.track_changes("task_id")
        buf.track_changes("agent_id")
        before = [buf.count(c) for c in conditions]
    migrate.downgrade(engine, "0017")
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT p.path, sum(CASE WHEN c.same_previous THEN 1 ELSE 0 END), "
                "sum(CASE WHEN c.same_next THEN 1 ELSE 0 END) FROM expstore_changes c "
                "JOIN expstore_tracked_paths p ON p.id = c.path_id GROUP BY p.path ORDER BY p.path"
            )
        ).all()
        assert not any(
            c["name"] == "change_flags" for c in inspect(conn).get_columns("expstore_rows")
        )
    assert [(p, int(a), int(b)) for p, a, b in found] == [
        ("exp_meta.agent_id", *[before[1]] * 2),
        ("exp_meta.task_id", before[0], before[0]),
    ]
    migrate.upgrade(engine)
    with ReplayBuffer(fresh_url, name="old") as buf:
        assert buf.sql.tracked_changes() == ["exp_meta.agent_id", "exp_meta.task_id"]
        assert [buf.count(c) for c in conditions] == before
        buf.untrack_changes("task_id")
        buf.untrack_changes("agent_id")
        assert [buf.count(c) for c in conditions] == before  # by the probe


def test_revision_0018_shifts_bigints_in_offline_sql_for_postgres() -> None:
    """Offline SQL prints literals bare, and a bare 1 is an int4 on Postgres, whose shifts
    wrap at 32 bits (slot 16 and up): the migration's shifts are of a cast BIGINT."""
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/not_connected"
    sql = migrate.upgrade_sql(url, from_revision="0017", revision="0018")
    shifts = [line for line in sql.splitlines() if "<<" in line]
    assert shifts
    assert all("CAST(1 AS BIGINT) <<" in line for line in shifts)
