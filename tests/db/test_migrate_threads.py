"""Threads opening buffers on new databases at the same instant: schema creation runs
through Alembic, whose state is process-wide, so it must take turns within the process."""

from __future__ import annotations

import multiprocessing as mp
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from expstore import ReplayBuffer
from tests.helpers import make_rows

THREADS = 4
EACH = 4


def _open_at_once(urls: list[list[str]]) -> list[BaseException]:
    """Each thread opens its URLs, all threads starting together; the errors raised."""
    start = threading.Barrier(len(urls))
    errors: list[BaseException] = []

    def run(mine: list[str]) -> None:
        start.wait()
        for url in mine:
            try:
                with ReplayBuffer(url, name="threads") as buffer:
                    buffer.store_batch(make_rows(3))
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(mine,)) for mine in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def _all_open_with_rows(urls: list[list[str]]) -> None:
    for mine in urls:
        for url in mine:
            with ReplayBuffer(url, name="threads") as buffer:
                assert len(buffer) == 3


def test_threads_creating_sqlite_databases_at_once(tmp_path: Path) -> None:
    urls = [[f"sqlite:///{tmp_path}/t{t}_{i}.db" for i in range(EACH)] for t in range(THREADS)]
    assert _open_at_once(urls) == []
    _all_open_with_rows(urls)


@pytest.fixture
def fresh_pg_urls(pg_server_url: str) -> Iterator[list[str]]:
    server = make_url(pg_server_url).set(drivername="postgresql+psycopg")
    names = [f"expstore_threads_{uuid.uuid4().hex[:8]}" for _ in range(THREADS)]
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in names:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield [server.set(database=n).render_as_string(hide_password=False) for n in names]
    with admin.connect() as conn:
        for name in names:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_threads_creating_postgres_schemas_at_once(fresh_pg_urls: list[str]) -> None:
    urls = [[url] for url in fresh_pg_urls]
    assert _open_at_once(urls) == []
    _all_open_with_rows(urls)


def _open_and_store(url: str, start: Any, out: Any) -> None:
    start.wait(60)
    try:
        with ReplayBuffer(url, name="processes") as buffer:
            buffer.store_batch(make_rows(3))
        out.put("ok")
    except BaseException as exc:  # noqa: BLE001 - sent back for the assertion
        out.put(f"{type(exc).__name__}: {exc}")


def _processes_open_at_once(url: str, processes: int = 4) -> None:
    """``processes`` processes open one new database at the same instant and write."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open_and_store, args=(url, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == ["ok"] * processes
    with ReplayBuffer(url, name="processes") as buffer:
        assert len(buffer) == 3 * processes


def test_processes_creating_one_sqlite_database_at_once(tmp_path: Path) -> None:
    _processes_open_at_once(f"sqlite:///{tmp_path / 'new.db'}")


def test_processes_creating_one_postgres_schema_at_once(fresh_pg_urls: list[str]) -> None:
    _processes_open_at_once(fresh_pg_urls[0])
