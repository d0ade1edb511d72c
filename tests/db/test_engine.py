"""A SQLite file this process cannot write (a read-only mount) opens for reading: queries,
samples and exports work, a write says the database is read-only and changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

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
