"""Row factories, a thread runner and a killed-actor runner shared by the tests."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import text

from expstore import DataRow, Experience, ExpMeta

ROOT = Path(__file__).resolve().parents[1]


def make_row(
    task_id: str = "t1",
    agent_id: str = "a1",
    step: int = 0,
    *,
    reward: float | None = None,
    execute_time: float | None = None,
    version: int | None = None,
    **data: Any,
) -> DataRow:
    meta: dict[str, Any] = {"task_id": task_id, "agent_id": agent_id, "step": step}
    if version is not None:
        meta["policy_version"] = version
    if execute_time is not None:
        meta["execute_time"] = execute_time
    return DataRow(exp_meta=ExpMeta(**meta), exp_data=Experience(reward_t=reward, **data))


def make_rows(n: int, *, tasks: int = 4, agents: int = 2, tensor: bool = False) -> list[DataRow]:
    rows = []
    for i in range(n):
        extra: dict[str, Any] = {"state": {"i": i, "url": f"https://x/{i % 7}"}}
        if tensor:
            extra["state"]["obs"] = np.full(8, i, dtype=np.float32)
        rows.append(
            make_row(f"task{i % tasks}", f"agent{i % agents}", i // tasks, reward=float(i), **extra)
        )
    return rows


def in_threads(work: Callable[[int], None], count: int) -> None:
    """Run ``work(i)`` for i in range(count), each in a thread of its own, all at once;
    the first exception any raised is raised here once all have ended."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def drop_pg_database(conn: Any, name: str) -> None:
    """Drop Postgres database ``name`` (if it exists), ending its sessions first, on an
    AUTOCOMMIT connection to another database of the server."""
    conn.execute(
        text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = :name AND pid <> pg_backend_pid()"
        ),
        {"name": name},
    )
    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


def killed_actor(module: str, *args: str) -> None:
    """Run ``python -m module *args`` (a test actor that SIGKILLs itself at a point of its
    write) from the repository's root, and check that it died by the kill."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        timeout=120,
        check=False,
    )
    assert done.returncode == -9  # it died where it was told to


def run_out(buffer: Any, claim: Any = None) -> None:
    """End ``claim``'s lease now (None: every lease of ``buffer``), by the database's
    clock: the entries' ``lease_until`` moved an hour back, as if the holder had stalled
    that long (tests of what happens once a lease ran out, without a short lease that a
    loaded machine could outlive before the test's next step)."""
    handle = buffer.sql.handle
    which = "claim_id = :claim_id" if claim is not None else "buffer_id = :buffer_id"
    with handle.write() as conn:
        conn.execute(
            text(
                "UPDATE expstore_consumption SET lease_until = lease_until - 3600 "
                f"WHERE {which} AND lease_until IS NOT NULL"
            ),
            {"claim_id": getattr(claim, "claim_id", None), "buffer_id": handle.buffer_id},
        )
