"""Many processes write one buffer at once; rows survive the writer's process."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys

import pytest

from expstore import ReplayBuffer
from tests.helpers import make_row

WRITERS = 4
ROWS_EACH = 5_000


def _write(url: str, name: str, writer: int, capacity: int | None, batch: int) -> None:
    with ReplayBuffer(url, name=name, capacity=capacity) as buf:
        for start in range(0, ROWS_EACH, batch):
            buf.store_batch(
                [
                    make_row(f"w{writer}", f"agent{writer}", i, reward=float(i))
                    for i in range(start, min(start + batch, ROWS_EACH))
                ]
            )


def _run_writers(url: str, name: str, capacity: int | None, batch: int) -> None:
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_write, args=(url, name, w, capacity, batch)) for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * WRITERS


@pytest.mark.slow
def test_four_processes_store_batch_at_once_without_loss_or_duplicates(
    db_url: str, buffer_name: str
) -> None:
    _run_writers(db_url, buffer_name, None, ROWS_EACH)
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        assert len(buf) == WRITERS * ROWS_EACH
        ids = [r.id for r in buf.query()]
        assert len(set(ids)) == WRITERS * ROWS_EACH
        for w in range(WRITERS):
            assert [r.exp_meta.step for r in buf.get_by_task_id(f"w{w}")] == list(range(ROWS_EACH))


@pytest.mark.slow
def test_capacity_is_exact_under_concurrent_writers(db_url: str, buffer_name: str) -> None:
    _run_writers(db_url, buffer_name, 1_000, 250)
    with ReplayBuffer(db_url, name=buffer_name) as buf:
        assert len(buf) == 1_000
        keys = buf.storage.key_index()["key"]
        # The survivors are the newest 1,000 rows: writers took turns, so their keys are
        # consecutive and end at the last key written.
        assert keys.tolist() == list(range(int(keys[-1]) - 999, int(keys[-1]) + 1))
        assert sum(len(buf.get_by_task_id(f"w{w}")) for w in range(WRITERS)) == 1_000


def test_rows_written_by_one_process_are_there_in_another(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    script = (
        "from expstore import ReplayBuffer\n"
        "from tests.helpers import make_rows\n"
        f"buf = ReplayBuffer({url!r})\n"
        "buf.store_batch(make_rows(40, tensor=True))\n"
        "buf.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with ReplayBuffer(url) as buf:
        rows = list(buf.query())
    assert len(rows) == 40
    assert rows[7].exp_data.state["obs"].tolist() == [7.0] * 8


def test_postgres_writers_of_a_buffer_take_turns(pg_url: str, buffer_name: str) -> None:
    """Keys are handed out in commit order: a writer waits while another holds the buffer."""
    import threading

    from sqlalchemy import select

    from expstore.db.schema import buffers
    from expstore.storage import create_sql_engine

    other = create_sql_engine(pg_url)
    with ReplayBuffer(pg_url, name=buffer_name) as buf:
        storage = buf.storage
        with other.begin() as holder:  # another writer's open transaction
            holder.execute(
                select(buffers.c.id).where(buffers.c.id == storage.buffer_id).with_for_update()
            )
            done = threading.Event()
            thread = threading.Thread(
                target=lambda: (buf.store_batch([make_row("late")]), done.set())
            )
            thread.start()
            assert not done.wait(1.0)  # the second writer waits for the first
            assert buf.count() == 0
        thread.join(timeout=30)
        assert done.is_set() and buf.count() == 1
    other.dispose()


def test_update_priorities_and_an_evicting_writer_never_deadlock(
    pg_url: str, buffer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """update_priorities takes the buffer's row before the rows' (as store_batch does): a
    writer evicting the very rows being updated waits instead of deadlocking. The update is
    held open between the two locks, so without that order Postgres reports a deadlock."""
    import threading
    import time

    from expstore import priorities
    from expstore.storage.sql import SqlStorage
    from tests.helpers import make_rows

    trainer = SqlStorage(pg_url, name=buffer_name, capacity=10)
    actor = SqlStorage(pg_url, name=buffer_name)
    trainer.store_batch(make_rows(10))
    oldest = trainer.key_index(columns=("id",))["id"][0]
    bump = priorities.bump_version
    started = threading.Event()

    def held_open(conn, *args):  # noqa: ANN001, ANN002, ANN202
        started.set()
        time.sleep(0.3)  # the row locks are taken; the writer comes now
        return bump(conn, *args)

    monkeypatch.setattr(priorities, "bump_version", held_open)
    errors: list[BaseException] = []

    def write() -> None:
        started.wait(10)
        try:
            actor.store_batch(make_rows(1))  # evicts the oldest row, the one being updated
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert trainer.update_priorities([oldest], [5.0]) == 1
    writer.join(30)
    assert not errors, errors
    assert len(trainer.key_index()["key"]) == 10
    trainer.close()
    actor.close()
