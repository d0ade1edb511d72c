"""Database errors say what to do for their cause; very wide conditions work on both."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from sqlalchemy.exc import DataError, OperationalError

from expstore import QueryBuilder, ReplayBuffer, StorageError, UniformSampler
from expstore.db.handle import advice_for
from tests.helpers import make_rows


class _PgError(Exception):
    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("said", "state", "advice"),
    [
        ("database is locked", None, "held the database's lock"),
        ("attempt to write a readonly database", None, "read-only"),
        ("database or disk is full", None, "disk is full"),
        ("too many SQL variables", None, "split the condition or the batch"),
        ("Expression tree is too large (maximum depth 1000)", None, "split the condition"),
        ("cannot execute INSERT in a read-only transaction", "25006", "read-only"),
        ("could not extend file: No space left on device", "53100", "disk is full"),
        ("deadlock detected", "40P01", "retry"),
        ("canceling statement due to statement timeout", "57014", "statement timeout"),
        ("terminating connection due to administrator command", "57P01", "connection"),
        ("server closed the connection unexpectedly", "08006", "lost or refused"),
        ("lock timeout", "55P03", "lock"),
    ],
)
def test_each_cause_gets_its_own_advice(said: str, state: str | None, advice: str) -> None:
    orig = sqlite3.OperationalError(said) if state is None else _PgError(said, state)
    assert advice in advice_for(OperationalError("stmt", {}, orig), said)


def test_refused_data_and_unknown_failures_keep_their_advice() -> None:
    refused = DataError("stmt", {}, _PgError("invalid input syntax", "22P02"))
    assert "fix the value" in advice_for(refused, "invalid input syntax")
    odd = OperationalError("stmt", {}, sqlite3.OperationalError("something else"))
    assert "reachable and writable" in advice_for(odd, "something else")


def test_writing_to_a_read_only_postgres_says_so(pg_url: str, buffer_name: str) -> None:
    with ReplayBuffer(pg_url, name=buffer_name):
        pass  # the schema and the buffer exist
    read_only = f"{pg_url}?options=-c%20default_transaction_read_only%3Don"
    with ReplayBuffer(read_only, name=buffer_name) as buffer:
        with pytest.raises(StorageError, match="read-only here"):
            buffer.store_batch(make_rows(2))
        assert len(buffer) == 0


def test_writing_to_a_read_only_sqlite_file_says_so(tmp_path, buffer_name: str) -> None:
    path = tmp_path / "ro.db"
    with ReplayBuffer(f"sqlite:///{path}", name=buffer_name) as buffer:
        buffer.store_batch(make_rows(2))
    with ReplayBuffer(f"sqlite:///file:{path}?mode=ro&uri=true", name=buffer_name) as buffer:
        with pytest.raises(StorageError, match="read-only here"):
            buffer.store_batch(make_rows(2))
        assert len(buffer) == 2


@pytest.fixture
def buf(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(make_rows(20))
        yield buffer


@pytest.mark.parametrize("terms", [1000, 3000])
def test_an_or_of_thousands_of_conditions_works_on_both_backends(
    buf: ReplayBuffer, terms: int
) -> None:
    wide = QueryBuilder()
    for i in range(terms):
        if i:
            wide.or_()
        wide.eq("exp_data.state.i", i % 7)
    condition = wide.build()
    assert buf.count(condition) == 7
    assert {
        r.exp_data.state["i"] for r in buf.sample(UniformSampler(seed=0), condition, None, 50)
    } <= set(range(7))
    every = QueryBuilder()
    for i in range(terms):
        if i:
            every.and_()
        every.gte("exp_data.state.i", -i)
    assert buf.count(every.build()) == 20
