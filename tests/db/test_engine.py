"""A SQLite file this process cannot write (a read-only mount) opens for reading: queries,
samples and exports work, a write says the database is read-only and changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from expstore import ReplayBuffer, StorageError, UniformSampler
from expstore.io import export_rows
from tests.helpers import make_rows


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a writable folder, the same folder mounted read-only); needs root and mount."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    source, mounted = tmp_path / "rw", tmp_path / "ro"
    source.mkdir()
    mounted.mkdir()
    bind = subprocess.run(["mount", "--bind", str(source), str(mounted)], capture_output=True)
    if bind.returncode:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)], check=True)
        yield source, mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def test_a_file_on_a_read_only_mount_opens_for_reading(
    read_only_folder: tuple[Path, Path], tmp_path: Path
) -> None:
    source, mounted = read_only_folder
    with ReplayBuffer(f"sqlite:///{source / 'x.db'}") as buffer:
        buffer.store_batch(make_rows(12))
    with ReplayBuffer(f"sqlite:///{mounted / 'x.db'}") as buffer:
        assert len(buffer) == 12
        assert len(buffer.sample(UniformSampler(seed=0), batch_size=5)) == 5
        assert export_rows(buffer, tmp_path / "out.jsonl") == 12
        with pytest.raises(StorageError, match="read-only here"):
            buffer.store_batch(make_rows(2))
        assert len(buffer) == 12


def test_a_pooled_postgres_connection_with_something_to_read_is_pinged_outside_a_transaction(
    pg_url: str,
) -> None:
    """A connection given back to the pool is pinged at its next checkout only when its
    socket has something to read (here a notification; a server's goodbye likewise), and
    the ping leaves no transaction open behind it: the caller may still switch it to
    autocommit (as save_progress does) or to another isolation level."""
    import select

    import psycopg
    from psycopg.pq import TransactionStatus
    from sqlalchemy import text

    from expstore.db.engine import create_sql_engine

    engine = create_sql_engine(pg_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("LISTEN expstore_ping_test"))
            conn.commit()
            raw = conn.connection.dbapi_connection
            assert raw is not None
        plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(plain, autocommit=True) as other:
            other.execute("NOTIFY expstore_ping_test")
        readable, _, _ = select.select([raw.fileno()], [], [], 30)  # (a wait, not a timing)
        assert readable  # the pooled connection has something to read
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection is raw  # the same one, kept
            assert raw.info.transaction_status == TransactionStatus.IDLE
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            assert auto.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_a_read_cut_off_mid_statement_never_leaves_a_writer_in_autocommit(pg_url: str) -> None:
    """A Postgres read runs outside a transaction (one round trip a statement). Cut off in
    the middle of a statement (here a signal handler's exception), its connection is not
    handed to the next writer in autocommit: that write still commits all or nothing, and
    the exception that cut the read is the one raised."""
    import signal
    import uuid

    from sqlalchemy import text

    class Deadline(Exception):  # noqa: N818 - the test's own
        pass

    def on_alarm(*_: object) -> None:
        raise Deadline("deadline")

    table = f"probe_{uuid.uuid4().hex[:8]}"
    with ReplayBuffer(pg_url, name=table) as buffer:
        handle = buffer.sql._handle
        before = signal.signal(signal.SIGALRM, on_alarm)
        try:
            with pytest.raises(Deadline), handle.read() as conn:
                signal.setitimer(signal.ITIMER_REAL, 0.2)
                conn.execute(text("SELECT pg_sleep(30)"))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)
        with handle.write() as conn:
            conn.execute(text(f"CREATE TABLE {table} (x int)"))
        with pytest.raises(ZeroDivisionError), handle.write() as conn:
            assert not conn.connection.driver_connection.autocommit
            conn.execute(text(f"INSERT INTO {table} VALUES (1)"))
            _ = 1 / 0  # fails after the insert: it must be rolled back
        with handle.read() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 0
        with handle.write() as conn:
            conn.execute(text(f"DROP TABLE {table}"))


def test_a_connection_lost_under_a_read_says_so(pg_url: str) -> None:
    """The server ends a read's connection under it: ConnectionLostError (which sampling
    retries), not the driver's own error."""
    import uuid

    import psycopg
    from sqlalchemy import event

    from expstore.errors import ConnectionLostError

    with ReplayBuffer(pg_url, name=f"lost_{uuid.uuid4().hex[:8]}", cache_bytes=0) as buffer:
        buffer.store_batch(make_rows(3))
        engine = buffer.sql._handle.connections.engine
        armed = [True]
        plain = pg_url.replace("postgresql+psycopg://", "postgresql://")

        def end_it(conn: Any, *_: Any) -> None:
            if armed[0]:
                armed[0] = False
                pid = conn.connection.driver_connection.info.backend_pid
                with psycopg.connect(plain, autocommit=True) as other:
                    other.execute("SELECT pg_terminate_backend(%s)", (pid,))

        event.listen(engine, "before_cursor_execute", end_it)
        try:
            with pytest.raises(ConnectionLostError):
                with buffer.sql._handle.read() as conn:
                    conn.exec_driver_sql("SELECT 1")
        finally:
            event.remove(engine, "before_cursor_execute", end_it)
        assert len(buffer) == 3  # the pool gives a working connection again
