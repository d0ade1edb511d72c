"""Values and field names built to break out of SQL match as plain data or raise QueryError."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, inspect

from expstore import DataRow, Experience, ExpMeta, QueryError, ReplayBuffer
from expstore.query import Condition, QueryBuilder

PAYLOADS = [
    "x'; DROP TABLE expstore_rows; --",
    'x"; DROP TABLE expstore_rows; --',
    "'; DELETE FROM expstore_buffers; SELECT '",
    "' OR '1'='1",
    "\\'; DROP TABLE expstore_rows; --",
    "$.state') OR 1=1 --",
    "%' OR 1=1 --",
    "]]'; --",
]
EVIL_KEY = "k'); DROP TABLE expstore_rows; --"


def make_rows() -> list[DataRow]:
    rows = []
    for i, text in enumerate(PAYLOADS):
        rows.append(
            DataRow(
                id=f"r{i}",
                exp_meta=ExpMeta(task_id=text, agent_id=f"a{i}", step=i),
                exp_data=Experience(state={"url": text, EVIL_KEY: i}),
            )
        )
    rows.append(
        DataRow(
            id="plain",
            exp_meta=ExpMeta(task_id="t", agent_id="a", step=99),
            exp_data=Experience(state={"url": "u"}),
        )
    )
    return rows


ROWS = make_rows()


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        buf.store_batch(ROWS)
        yield buf
        buf.clear()


def ids(buffer: ReplayBuffer, condition: Condition) -> set[str]:
    return {row.id for row in buffer.query(condition)}


def assert_intact(buffer: ReplayBuffer) -> None:
    assert buffer.count() == len(ROWS)
    engine = create_engine(buffer.storage.url)  # type: ignore[attr-defined]
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"expstore_rows", "expstore_buffers"} <= tables


@pytest.mark.parametrize("text", PAYLOADS)
def test_hostile_values_match_as_plain_data(buffer: ReplayBuffer, text: str) -> None:
    expected = {f"r{PAYLOADS.index(text)}"}
    assert ids(buffer, QueryBuilder().eq("task_id", text).build()) == expected
    assert ids(buffer, QueryBuilder().eq("exp_data.state.url", text).build()) == expected
    assert ids(buffer, QueryBuilder().in_("exp_data.state.url", [text, "zz"]).build()) == expected
    assert ids(buffer, QueryBuilder().gt("exp_data.state.url", text).build()) == {
        row.id for row in ROWS if row.exp_data.state["url"] > text
    }
    assert_intact(buffer)


@pytest.mark.parametrize("text", PAYLOADS)
def test_hostile_like_patterns_match_as_patterns(buffer: ReplayBuffer, text: str) -> None:
    condition = QueryBuilder().like("task_id", text.replace("\\", "\\\\")).build()
    assert ids(buffer, condition) == {row.id for row in ROWS if condition.matches(row)}
    assert_intact(buffer)


def test_hostile_json_key_is_just_a_key(buffer: ReplayBuffer) -> None:
    condition = QueryBuilder().gte(f"exp_data.state.{EVIL_KEY}", 3).build()
    assert ids(buffer, condition) == {f"r{i}" for i in range(3, len(PAYLOADS))}
    assert_intact(buffer)


@pytest.mark.parametrize(
    "field",
    [
        "task_id; DROP TABLE expstore_rows; --",
        "exp_meta.task_id' OR '1'='1",
        "expstore_rows.task_id",
        'exp_data."state"',
        'exp_data.state.url"); DROP TABLE expstore_rows; --',
        "exp_data.state..url",
    ],
)
def test_hostile_field_names_raise_query_error(buffer: ReplayBuffer, field: str) -> None:
    with pytest.raises(QueryError):
        QueryBuilder().eq(field, "x")
    with pytest.raises(QueryError):
        buffer.count({"field": field, "value": "x", "op": "eq"})
    assert_intact(buffer)


def test_hostile_path_key_without_double_quote_matches_nothing(buffer: ReplayBuffer) -> None:
    condition = (
        QueryBuilder().is_not_null("exp_data.state.url'); DROP TABLE expstore_rows; --").build()
    )
    assert ids(buffer, condition) == set()
    assert_intact(buffer)
