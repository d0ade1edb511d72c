"""Helpers the benchmark scripts share (run them as ``python benchmarks/bench_*.py``)."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

__all__ = ["LockWatch", "fresh_pg_database", "lock_waits", "ms"]


def ms(seconds: list[float]) -> float:
    """The median of ``seconds``, in milliseconds."""
    return statistics.median(seconds) * 1000


def lock_waits(url: str, stop: Any, out: Any) -> None:
    """Sample how often a backend of this database waits on a lock, and on what (every
    5 ms, until ``stop`` is set); puts (samples, samples with a waiter, {what: count})."""
    engine = create_engine(url)
    samples = waiting = 0
    on: dict[str, int] = {}
    with engine.connect() as conn:
        while not stop.is_set():
            waits = conn.execute(
                text(
                    "SELECT wait_event, left(query, 30) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND pid <> pg_backend_pid()"
                )
            ).all()
            samples += 1
            waiting += int(bool(waits))
            for event, query in waits:
                what = f"{event} in {query.split(' (')[0]}"
                on[what] = on.get(what, 0) + 1
            conn.rollback()
            time.sleep(0.005)
    engine.dispose()
    out.put((samples, waiting, on))


class LockWatch:
    """Runs :func:`lock_waits` in a process while a phase runs (Postgres only): ``start()``,
    then ``note()`` stops it and says what it saw (an empty string elsewhere)."""

    def __init__(self, url: str, context: Any) -> None:
        self.process = None
        if url.startswith("postgresql"):
            self.stop, self.out = context.Event(), context.Queue()
            self.process = context.Process(target=lock_waits, args=(url, self.stop, self.out))

    def start(self) -> LockWatch:
        if self.process is not None:
            self.process.start()
        return self

    def note(self, who: str) -> str:
        if self.process is None:
            return ""
        self.stop.set()
        samples, waiting, on = self.out.get()
        self.process.join()
        note = f"; {who} waiting on a lock in {waiting} of {samples} samples"
        if on:
            note += " (" + ", ".join(f"{n}x {what}" for what, n in sorted(on.items())) + ")"
        return note


def fresh_pg_database(server: str) -> tuple[str, Callable[[], None]]:
    """A new, empty database on the Postgres server at ``server``: its URL, and a function
    that drops it (ending its sessions)."""
    url = make_url(server)
    name = f"expstore_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url.set(database=name).render_as_string(hide_password=False), drop
