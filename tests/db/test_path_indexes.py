"""buffer.create_index(path): an index the planner uses for conditions on that path, on
both backends; migrations leave it alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import event, select, text

from expstore import InvalidArgumentError, ReplayBuffer
from expstore.db.schema import rows
from expstore.query import QueryBuilder, to_sql
from expstore.storage import create_sql_engine
from tests.helpers import make_rows


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf
        buf.drop_index("exp_data.state.i")  # the Postgres test database is shared


def _plan(buffer: ReplayBuffer, condition) -> str:
    """The plan of selecting the matching keys, as the key index does: the statement is
    run once to see what the driver gets, then explained with the same parameters."""
    storage = buffer.storage
    engine = create_sql_engine(storage.url)  # a connection of its own, no cached statements
    where = to_sql(condition, rows, engine.dialect.name)
    stmt = select(rows.c.key).where(rows.c.buffer_id == storage.buffer_id, where)
    seen: list[tuple[str, object]] = []

    def spy(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        seen.append((statement, parameters))

    explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SET enable_seqscan = off"))  # a tiny table: make the choice
        event.listen(conn, "before_cursor_execute", spy)
        conn.execute(stmt).all()
        event.remove(conn, "before_cursor_execute", spy)
        statement, parameters = seen[-1]
        found = conn.exec_driver_sql(explain + statement, parameters).all()  # type: ignore[arg-type]
    engine.dispose()
    return "\n".join(" ".join(map(str, r)) for r in found)


def test_a_path_index_serves_equality_and_number_ranges(buffer: ReplayBuffer) -> None:
    buffer.store_batch(make_rows(200))
    equal = QueryBuilder().eq("exp_data.state.i", 7).build()
    above = QueryBuilder().gt("exp_data.state.i", 190).build()
    before = _plan(buffer, equal)  # other tests' path indexes may serve buffer_id alone
    assert buffer.create_index("exp_data.state.i") is True
    name = buffer.indexes()["exp_data.state.i"]
    assert name.startswith("ix_expstore_rows_path_")
    assert name not in before
    assert buffer.create_index("exp_data.state.i") is False  # again: nothing happens
    assert name in _plan(buffer, equal)
    assert name in _plan(buffer, above)
    # and the answers are the same as without it
    assert [r.exp_data.state["i"] for r in buffer.query(equal)] == [7]
    assert len(list(buffer.query(above))) == 9
    assert buffer.drop_index("exp_data.state.i") is True
    assert buffer.drop_index("exp_data.state.i") is False
    assert name not in _plan(buffer, equal)


def test_bad_paths_are_refused_and_nothing_is_created(buffer: ReplayBuffer) -> None:
    with pytest.raises(InvalidArgumentError, match="non-ASCII"):
        buffer.create_index("exp_data.state.clé")
    with pytest.raises(Exception, match="exp_data"):
        buffer.create_index("nosuch.path")


def test_a_path_index_stays_out_of_the_schemas_models(buffer: ReplayBuffer) -> None:
    """The index is the database's: the models (which autogenerate compares and
    create_all builds) never hold it, in this process or later."""
    before = set(rows.indexes)
    buffer.create_index("exp_data.state.url")
    buffer.create_index("exp_meta.task_name")
    buffer.drop_index("exp_data.state.url")
    buffer.drop_index("exp_meta.task_name")
    assert set(rows.indexes) == before


def test_indexes_lists_each_path_as_created(buffer: ReplayBuffer) -> None:
    """``indexes()`` reads the paths back from the database's catalog, for any handle."""
    paths = ["exp_data.state.url", "exp_data.actions.0.name", "exp_meta.task_name", "id"]
    try:
        for path in paths:
            buffer.create_index(path)
        listed = buffer.indexes()
        assert set(paths) <= set(listed)
        assert all(n.startswith("ix_expstore_rows_path_") for n in listed.values())
        assert len(set(listed.values())) == len(listed)
        buffer.drop_index("exp_data.actions.0.name")
        assert "exp_data.actions.0.name" not in buffer.indexes()
    finally:
        for path in paths:
            buffer.drop_index(path)
    assert not set(paths) & set(buffer.indexes())
