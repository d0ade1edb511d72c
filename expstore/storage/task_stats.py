"""Per-task summaries a buffer may keep, so that ``expstore stats`` reads one row per task
instead of every row (issue: Scale I).

``buffer.create_summary()`` makes a buffer keep, in ``expstore_task_stats``, one row per
task: how many rows it has; the count, sum, sum of squares, smallest and largest of their
rewards and policy versions; their first and last ``execute_time``; and the task's last row
(by step, then insertion: its key, step and reward). The figures of the whole buffer are
then sums and extremes over its tasks (:func:`expstore.storage.summary.summarise`), and the
success rate a count over the last rows, however many rows the buffer holds.

Kept exact in the transaction of every change, which holds the buffer's row:

- a write merges its new rows (the buffer's rows above its largest key before the write)
  into their tasks' rows: counts and sums add, extremes compare, and the last row is the
  later by (step, key);
- a delete (an eviction, ``delete()``) reads which tasks its rows belong to first and
  summarises those tasks again from the rows left; ``clear()`` drops them all.

The rows present when summaries are created are summarised in steps of
:data:`BUILD_STEP` rows, each in a transaction of its own (writers wait for one step, not
for the whole buffer): ``summary_from`` is the buffer's largest key at creation, above which
writers merge their rows, and ``summary_through`` how far the builder got below it. A task
summarised again meanwhile counts only rows already summarised, so the builder adds each
row exactly once. Until the build is done, stats read the rows.

What it costs: one ``INSERT ... SELECT ... ON CONFLICT`` per write, over the new rows
(grouped by task) and a lookup per task, and per delete one more read of the deleted rows'
tasks; measured in ``benchmarks/bench_summary.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.util import ClauseAdapter

from .._args import check_int
from ..errors import StorageError
from . import registry  # (which imports this module: used at call time only)
from .handle import BufferHandle
from .schema import buffers, newest_first, oldest_first, rows, task_stats

__all__ = [
    "BUILD_STEP",
    "SummaryState",
    "build_step",
    "count_now",
    "create",
    "drop",
    "drop_summary",
    "merge_new",
    "newest_key",
    "recompute",
    "start",
    "state",
    "state_now",
    "drop_all",
]

#: Rows the builder summarises per transaction when summaries are created.
BUILD_STEP = 200_000
#: Tasks summarised again per statement (bound parameters per statement stay few).
_TASK_CHUNK = 500

_S = task_stats.c


class SummaryState(NamedTuple):
    """Whether and how far a buffer's summaries are built (``None`` when it keeps none)."""

    #: The buffer's largest key when its summaries were created: writers merge their rows,
    #: all above it, as they store them.
    since: int
    #: The rows up to this key are summarised (the builder's progress below ``since``).
    through: int

    @property
    def built(self) -> bool:
        return self.through >= self.since

    @classmethod
    def of(cls, since: int | None, through: int | None) -> SummaryState | None:
        """The state the buffer's two columns hold (None: no summaries kept)."""
        return None if since is None or through is None else cls(int(since), int(through))


def state(conn: Connection, buffer_id: int) -> SummaryState | None:
    """The buffer's summary state, read in the caller's transaction."""
    since, through = conn.execute(
        select(buffers.c.summary_from, buffers.c.summary_through).where(buffers.c.id == buffer_id)
    ).one()
    return SummaryState.of(since, through)


def newest_key(conn: Connection, buffer_id: int) -> int:
    """The buffer's largest key (0 when it is empty), by its (buffer_id, key) index."""
    found = conn.execute(newest_first(select(rows.c.key), buffer_id).limit(1)).scalar()
    return 0 if found is None else int(found)


def _aggregate(where: Sequence[ColumnElement[bool]]) -> Any:
    """The summary of each task among the buffer's rows (``:buffer_id``) matching
    ``where``, in the table's column order: counts, sums and extremes by GROUP BY, and the
    task's last row (highest step, then key) by one index probe per task."""
    buffer_id = bindparam("buffer_id", type_=Integer)
    mine = [rows.c.buffer_id == buffer_id, *where]
    reward = cast(rows.c.reward_t, Float)
    version = cast(rows.c.policy_version, Float)
    later = rows.alias("later")
    last_key = (
        select(later.c.key)
        .where(
            later.c.buffer_id == buffer_id,
            later.c.task_id == rows.c.task_id,
            *_on(later, where),
        )
        .order_by(later.c.step.desc(), later.c.key.desc())
        .limit(1)
        .scalar_subquery()
    )
    grouped = (
        select(
            rows.c.task_id,
            func.count().label("rows"),
            func.count(rows.c.reward_t).label("reward_count"),
            func.coalesce(func.sum(reward), 0.0).label("reward_sum"),
            func.coalesce(func.sum(reward * reward), 0.0).label("reward_sumsq"),
            func.min(rows.c.reward_t).label("reward_min"),
            func.max(rows.c.reward_t).label("reward_max"),
            func.min(rows.c.execute_time).label("time_min"),
            func.max(rows.c.execute_time).label("time_max"),
            func.count(rows.c.policy_version).label("version_count"),
            func.coalesce(func.sum(version), 0.0).label("version_sum"),
            func.coalesce(func.sum(version * version), 0.0).label("version_sumsq"),
            func.min(rows.c.policy_version).label("version_min"),
            func.max(rows.c.policy_version).label("version_max"),
            last_key.label("last_key"),
        )
        .where(*mine)
        .group_by(rows.c.task_id)
        .subquery()
    )
    last = rows.alias("last")
    return select(
        buffer_id.label("buffer_id"),
        *(grouped.c[c.name] for c in task_stats.c if c.name not in ("buffer_id", *_LAST)),
        last.c.step.label("last_step"),
        last.c.reward_t.label("last_reward"),
    ).join_from(grouped, last, last.c.key == grouped.c.last_key)


#: The columns of a task's last row, read from that row rather than aggregated.
_LAST = ("last_step", "last_reward")
#: The columns two summaries of a task's rows add up in.
_SUMMED = (
    "rows",
    "reward_count",
    "reward_sum",
    "reward_sumsq",
    "version_count",
    "version_sum",
    "version_sumsq",
)


def _on(table: Any, where: Sequence[ColumnElement[bool]]) -> list[ColumnElement[bool]]:
    """``where`` (clauses on ``rows``) restated on an alias of it."""
    adapter = ClauseAdapter(table)
    return [adapter.traverse(clause) for clause in where]


def _columns() -> list[str]:
    order = [c.name for c in task_stats.c if c.name not in _LAST]
    return [*order, *_LAST]


def _lesser(a: Any, b: Any) -> Any:
    """The smaller of two nullable values (either when the other is NULL)."""
    return case((a.is_(None), b), (b.is_(None), a), (b < a, b), else_=a)


def _greater(a: Any, b: Any) -> Any:
    return case((a.is_(None), b), (b.is_(None), a), (b > a, b), else_=a)


#: Which rows each statement summarises, by bound parameters (the buffer's is
#: ``:buffer_id``): a write's new rows, a step of the build, some tasks' rows (all of
#: them, or while the build goes on, those summarised already).
_ROWS: dict[str, Callable[[], list[ColumnElement[bool]]]] = {
    "new": lambda: [rows.c.key > bindparam("after")],
    "step": lambda: [rows.c.key > bindparam("low"), rows.c.key <= bindparam("high")],
    "tasks": lambda: [rows.c.task_id.in_(bindparam("tasks", expanding=True))],
    "tasks, building": lambda: [
        rows.c.task_id.in_(bindparam("tasks", expanding=True)),
        or_(rows.c.key <= bindparam("through"), rows.c.key > bindparam("since")),
    ],
}
_STATEMENTS: dict[tuple[str, str], Any] = {}


def _statement(handle: BufferHandle, kind: str) -> Any:
    """The statement of ``kind`` for the handle's database, built once: ``merge new`` and
    ``merge step`` add rows into their tasks' summaries (an upsert), ``summarise tasks``
    and ``summarise tasks, building`` write the summaries of tasks afresh, ``forget
    tasks`` deletes them."""
    dialect = handle.dialect
    found = _STATEMENTS.get((dialect.name, kind))
    if found is not None:
        return found
    verb, _, rest = kind.partition(" ")
    if verb == "merge":
        new = dialect.upsert(task_stats).from_select(_columns(), _aggregate(_ROWS[rest]()))
        found = new.on_conflict_do_update(
            index_elements=["buffer_id", "task_id"], set_=_merged(new.excluded)
        )
    elif verb == "summarise":
        found = insert(task_stats).from_select(_columns(), _aggregate(_ROWS[rest]()))
    else:
        found = delete(task_stats).where(
            _S.buffer_id == bindparam("buffer_id", type_=Integer),
            _S.task_id.in_(bindparam("tasks", expanding=True)),
        )
    _STATEMENTS[(dialect.name, kind)] = found
    return found


def _merged(ex: Any) -> dict[str, Any]:
    """A task's summary with ``ex`` (the new rows' summary) merged in: counts and sums
    added, extremes compared, the later last row (by step, then key) kept."""
    newer = or_(
        ex.last_step > _S.last_step, and_(ex.last_step == _S.last_step, ex.last_key > _S.last_key)
    )
    merged: dict[str, Any] = {name: _S[name] + ex[name] for name in _SUMMED}
    for name in ("reward_min", "time_min", "version_min"):
        merged[name] = _lesser(_S[name], ex[name])
    for name in ("reward_max", "time_max", "version_max"):
        merged[name] = _greater(_S[name], ex[name])
    for name in ("last_key", *_LAST):
        merged[name] = case((newer, ex[name]), else_=_S[name])
    return merged


def merge_new(handle: BufferHandle, conn: Connection, after_key: int) -> None:
    """Merge the buffer's rows above ``after_key`` (those the caller's transaction wrote)
    into their tasks' summaries."""
    conn.execute(
        _statement(handle, "merge new"), {"buffer_id": handle.buffer_id, "after": after_key}
    )


def recompute(
    handle: BufferHandle, conn: Connection, task_ids: Iterable[str], kept: SummaryState
) -> None:
    """Summarise these tasks again from the rows they have now (those already summarised,
    while the build goes on); a task left without rows loses its summary."""
    tasks = list(task_ids)
    forget = _statement(handle, "forget tasks")
    if kept.built:
        summarise, bounds = _statement(handle, "summarise tasks"), {}
    else:
        summarise = _statement(handle, "summarise tasks, building")
        bounds = {"through": kept.through, "since": kept.since}
    for at in range(0, len(tasks), _TASK_CHUNK):
        chunk = {"buffer_id": handle.buffer_id, "tasks": tasks[at : at + _TASK_CHUNK]}
        conn.execute(forget, chunk)
        conn.execute(summarise, {**chunk, **bounds})


def drop_all(handle: BufferHandle, conn: Connection, kept: SummaryState) -> None:
    """Every row of the buffer went (``clear()``): no task is left, and nothing is left to
    build."""
    conn.execute(delete(task_stats).where(_S.buffer_id == handle.buffer_id))
    if not kept.built:
        _set(conn, handle.buffer_id, kept.since, kept.since)


def _set(conn: Connection, buffer_id: int, since: int | None, through: int | None) -> None:
    conn.execute(
        update(buffers)
        .where(buffers.c.id == buffer_id)
        .values(summary_from=since, summary_through=through)
    )


def start(handle: BufferHandle, conn: Connection) -> SummaryState:
    """Make the buffer keep summaries from now on (the caller holds its row): its rows
    present now are left to :func:`build_step`."""
    found = state(conn, handle.buffer_id)
    if found is not None:
        return found
    since = newest_key(conn, handle.buffer_id)
    oldest = conn.execute(oldest_first(select(rows.c.key), handle.buffer_id).limit(1)).scalar()
    through = since if oldest is None else int(oldest) - 1
    _set(conn, handle.buffer_id, since, through)
    return SummaryState(since, through)


def build_step(
    handle: BufferHandle, conn: Connection, kept: SummaryState, step: int
) -> tuple[SummaryState, int]:
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
    bounds = {"buffer_id": buffer_id, "low": kept.through, "high": upto}
    conn.execute(_statement(handle, "merge step"), bounds)
    _set(conn, buffer_id, kept.since, upto)
    return SummaryState(kept.since, upto), done


def drop(handle: BufferHandle, conn: Connection) -> bool:
    """Stop keeping summaries (the caller holds the buffer's row); whether it kept any."""
    if state(conn, handle.buffer_id) is None:
        return False
    conn.execute(delete(task_stats).where(_S.buffer_id == handle.buffer_id))
    _set(conn, handle.buffer_id, None, None)
    return True


def create(
    handle: BufferHandle,
    step: int = BUILD_STEP,
    progress: Callable[[int], object] | None = None,
) -> SummaryState:
    """Make the buffer keep task summaries, and summarise the rows it holds now, ``step``
    rows per transaction (each takes the buffer's row, so writers wait for one step at a
    time; ``progress`` is told how many rows each step summarised). Safe to call again,
    and after a build cut short: it goes on from where the build got to. Returns the
    state, built."""
    check_int("step", step, minimum=1)
    with handle.errors("create task summaries"), handle.write() as conn:
        registry.lock_buffer(handle, conn, buffers.c.id)
        kept: SummaryState | None = start(handle, conn)
    while kept is not None and not kept.built:
        with handle.errors("build task summaries"), handle.write() as conn:
            registry.lock_buffer(handle, conn, buffers.c.id)
            kept = state(conn, handle.buffer_id)  # another process may have dropped them
            if kept is not None:
                kept, done = build_step(handle, conn, kept, step)
                if progress is not None:
                    progress(done)
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


def state_now(handle: BufferHandle) -> SummaryState | None:
    """:func:`state` on a connection of its own."""
    with handle.errors("read the task summaries' state"), handle.read() as conn:
        return state(conn, handle.buffer_id)


def count_now(handle: BufferHandle) -> int:
    """How many tasks the buffer's summaries hold (0 when it keeps none)."""
    mine = select(func.count()).where(_S.buffer_id == handle.buffer_id)
    with handle.errors("count task summaries"), handle.read() as conn:
        return int(conn.execute(mine).scalar_one())
