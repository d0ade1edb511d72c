"""Shared fixtures: the same contract runs over SQLite and Postgres.

Postgres tests use ``EXPSTORE_TEST_PG_URL`` (a server URL such as
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``). The session creates a database
of its own there and drops it at the end. Without the variable, Postgres tests skip; with
``EXPSTORE_REQUIRE_PG=1`` a missing variable or server fails the run instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from expstore import ReplayBuffer
from tests.helpers import drop_pg_database

PG_ENV = "EXPSTORE_TEST_PG_URL"
REQUIRE_PG = os.environ.get("EXPSTORE_REQUIRE_PG") == "1"


def _pg_unavailable(reason: str) -> None:
    if REQUIRE_PG:
        pytest.fail(f"EXPSTORE_REQUIRE_PG=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """The Postgres server URL from the environment (skips or fails without one)."""
    url = os.environ.get(PG_ENV)
    if not url:
        _pg_unavailable(f"{PG_ENV} is not set; Postgres tests need a server URL")
    assert url is not None
    return url


@contextmanager
def _fresh_pg_database(pg_server_url: str) -> Iterator[str]:
    """A new database on the server, dropped afterwards. Yields its URL."""
    server = make_url(pg_server_url)
    if server.drivername == "postgresql":
        server = server.set(drivername="postgresql+psycopg")
    name = f"expstore_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server
        _pg_unavailable(f"cannot create a test database at {server!r}: {exc}")
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            drop_pg_database(conn, name)
        admin.dispose()


@pytest.fixture(scope="session")
def pg_database(pg_server_url: str) -> Iterator[str]:
    """A fresh database for this test session; dropped afterwards. Yields its URL."""
    with _fresh_pg_database(pg_server_url) as url:
        yield url


@pytest.fixture
def own_pg_database(pg_server_url: str) -> Iterator[str]:
    """A fresh database for one test (its tables and statistics its own); dropped after."""
    with _fresh_pg_database(pg_server_url) as url:
        yield url


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The session's Postgres database URL."""
    return pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A database URL on each backend: a SQLite file in tmp_path, or the Postgres test database.

    Tests isolate themselves from each other on Postgres by using a unique buffer name
    (see the ``buffer_name`` fixture).
    """
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'buffer.db'}"
    return request.getfixturevalue("pg_database")


@pytest.fixture
def buffer_name() -> str:
    """A buffer name unique to this test, so tests sharing a Postgres database never meet."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def buffer(db_url: str, buffer_name: str) -> Iterator[ReplayBuffer]:
    """A buffer on each backend (a SQLite file, Postgres), private to the test."""
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        yield buf


@pytest.fixture
def buf(buffer: ReplayBuffer) -> ReplayBuffer:
    """The same buffer, by the short name the tests of the features use."""
    return buffer
