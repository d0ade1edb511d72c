"""Creating, building and dropping a buffer's task summaries (see
:mod:`expstore.stats.task_stats`, which keeps them as rows come and go).

:func:`create` marks the buffer as keeping summaries (writers merge their rows from then
on), summarises the rows present :data:`~expstore.stats.task_stats.BUILD_STEP` at a time,
each step a short transaction of its own, then summarises again the tasks marked dirty.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, delete, func, select

from .._args import check_int
from ..db.handle import BufferHandle
from ..db.schema import buffers, oldest_first, rows
from ..db.schema import task_stats as task_table
from ..errors import StorageError
from ..lifecycle import registry
from . import task_stats

__all__ = [
    "build_step",
    "clean",
    "count_now",
    "create",
    "drop",
    "drop_summary",
    "start",
    "state_now",
]


def start(handle: BufferHandle, conn: Connection) -> task_stats.SummaryState:
    """Make the buffer keep summaries from now on (the caller holds its row): its rows
    present now are left to :func:`build_step`."""
    found = task_stats.state(conn, handle.buffer_id)
    if found is not None:
        return found
    since = task_stats.newest_key(conn, handle.buffer_id)
    oldest = conn.execute(oldest_first(select(rows.c.key), handle.buffer_id).limit(1)).scalar()
    through = since if oldest is None else int(oldest) - 1
    task_stats.set_state(conn, handle.buffer_id, since, through)
    return task_stats.SummaryState(since, through)


def build_step(
    handle: BufferHandle, conn: Connection, kept: task_stats.SummaryState, step: int
) -> tuple[task_stats.SummaryState, int]:
    """Summarise up to ``step`` more of the rows present at creation (the caller holds the
    buffer's row); returns the state after and how many rows were summarised."""
    if kept.built:
        return kept, 0
    buffer_id = handle.buffer_id
    pending = [rows.c.key > kept.through, rows.c.key <= kept.since]
    ahead = oldest_first(select(rows.c.key), buffer_id).where(*pending).offset(step - 1).limit(1)
    found = conn.execute(ahead).scalar()
    if found is None:  # the last step: what is left
        upto = kept.since
        done = int(
            conn.execute(
                select(func.count()).where(rows.c.buffer_id == buffer_id, *pending)
            ).scalar_one()
        )
    else:
        upto, done = int(found), step
    task_stats.merge_range(handle, conn, kept.through, upto)
    task_stats.set_state(conn, buffer_id, kept.since, upto)
    return task_stats.SummaryState(kept.since, upto), done


def drop(handle: BufferHandle, conn: Connection) -> bool:
    """Stop keeping summaries (the caller holds the buffer's row); whether it kept any."""
    if task_stats.state(conn, handle.buffer_id) is None:
        return False
    conn.execute(delete(task_table).where(task_table.c.buffer_id == handle.buffer_id))
    task_stats.set_state(conn, handle.buffer_id, None, None)
    return True


def create(
    handle: BufferHandle,
    step: int = task_stats.BUILD_STEP,
    progress: Callable[[int], object] | None = None,
) -> task_stats.SummaryState:
    """Make the buffer keep task summaries, and summarise the rows it holds now, ``step``
    rows per transaction (each takes the buffer's row, so writers wait for one step at a
    time; ``progress`` is told how many rows each step summarised); then summarise again
    the tasks marked dirty. Safe to call again, and after a build cut short: it goes on
    from where the build got to. Returns the state, built."""
    check_int("step", step, minimum=1)
    with handle.errors("create task summaries"), handle.write() as conn:
        registry.lock_buffer(handle, conn, buffers.c.id)
        kept: task_stats.SummaryState | None = start(handle, conn)
    while kept is not None and not kept.built:
        with handle.errors("build task summaries"), handle.write() as conn:
            registry.lock_buffer(handle, conn, buffers.c.id)
            kept = task_stats.state(conn, handle.buffer_id)  # another process may have dropped them
            if kept is not None:
                kept, done = build_step(handle, conn, kept, step)
                if progress is not None:
                    progress(done)
    while kept is not None:  # then the dirty tasks, a transaction per chunk
        with handle.errors("summarise dirty tasks"), handle.write() as conn:
            registry.lock_buffer(handle, conn, buffers.c.id)
            kept = task_stats.state(conn, handle.buffer_id)
            if kept is None or not clean(handle, conn, kept, task_stats.TASK_CHUNK):
                break
    if kept is None:
        raise StorageError(
            f"the task summaries of buffer {handle.name!r} were dropped by another process "
            "while they were being built; call create_summary() again to keep them"
        )
    return kept


def drop_summary(handle: BufferHandle) -> bool:
    """Stop keeping task summaries; whether the buffer kept any."""
    with handle.errors("drop task summaries"), handle.write() as conn:
        registry.lock_buffer(handle, conn, buffers.c.id)
        return drop(handle, conn)


def state_now(handle: BufferHandle) -> task_stats.SummaryState | None:
    """:func:`state` on a connection of its own."""
    with handle.errors("read the task summaries' state"), handle.read() as conn:
        return task_stats.state(conn, handle.buffer_id)


def count_now(handle: BufferHandle) -> int:
    """How many tasks the buffer's summaries hold (0 when it keeps none)."""
    mine = select(func.count()).where(task_table.c.buffer_id == handle.buffer_id)
    with handle.errors("count task summaries"), handle.read() as conn:
        return int(conn.execute(mine).scalar_one())


def clean(handle: BufferHandle, conn: Connection, kept: task_stats.SummaryState, limit: int) -> int:
    """Summarise again up to ``limit`` dirty tasks (the caller holds the buffer's row);
    how many were."""
    dirty = task_stats.dirty_tasks(handle.buffer_id).limit(limit)
    tasks = list(conn.execute(dirty).scalars())
    if tasks:
        task_stats.recompute(handle, conn, tasks, kept)
    return len(tasks)
