"""Per-task summaries a buffer may keep, so that ``expstore stats`` reads one row per task
instead of every row (issue: Scale I).

``buffer.create_summary()`` makes a buffer keep, in ``expstore_task_stats``, one row per
task: how many rows it has; the count, sum, sum of squares, smallest and largest of their
rewards and policy versions (the version sums of ``version - version_base``, so large
versions keep their digits); their first and last ``execute_time``; and the task's last
row (by step, then insertion: its key, step and reward). The figures of the whole buffer
are then sums and extremes over its tasks (:func:`expstore.stats.summary.summarise`),
and the success rate a count over the last rows, however many rows the buffer holds.

Kept exact in the transaction of every change, which holds the buffer's row:

- a write merges its new rows (the buffer's rows above its largest key before the write,
  read alone by their key range) into their tasks' rows: counts and sums add, extremes
  compare, the last row is the later by (step, key);
- a delete (an eviction, ``delete()``) takes its rows' counts and sums out of their tasks'
  rows (:func:`before_delete`, read before they go). Only a task whose extremes or last
  row went with them is summarised again from its rows, or, when it is long (the
  handle's :attr:`~expstore.db.tuning.Tuning.recompute_limit`), marked *dirty*: stats
  read a dirty task's rows until :func:`create` summarises it again. ``clear()`` drops
  every task's row.

The rows present when summaries are created are summarised in steps of
:data:`BUILD_STEP` rows, each in a transaction of its own (writers wait for one step, not
for the whole buffer): ``summary_from`` is the buffer's largest key at creation, above which
writers merge their rows, and ``summary_through`` how far the builder got below it. Deletes
meanwhile count only rows already summarised, so the builder adds each row exactly once.
Until the build is done, stats read the rows.

What it costs: a few statements per write (the merge, and for a write that evicts, the
evicted rows' summaries, their tasks' stored ones, and the changes), built once per
database; measured in ``benchmarks/bench_summary.py``. Sums count a reward beyond
±:data:`REWARD_BOUND` at that bound (on every path, the rows' too), so nothing overflows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Connection,
    Float,
    Integer,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from ..db.handle import BufferHandle
from ..db.schema import buffers, newest_first, rows, task_stats
from ..lifecycle.hooks import RemoveContext, RowFeature, WriteContext, register

__all__ = [
    "BUILD_STEP",
    "COLUMNS",
    "REWARD_BOUND",
    "Removal",
    "SummaryState",
    "TASK_CHUNK",
    "after_delete",
    "before_delete",
    "bounded_reward",
    "dirty_tasks",
    "drop_all",
    "merge_new",
    "merge_range",
    "newest_key",
    "recompute",
    "set_state",
    "state",
    "summaries_of",
]

#: Rows the builder summarises per transaction when summaries are created.
BUILD_STEP = 200_000
#: Tasks summarised again per statement (bound parameters per statement stay few).
TASK_CHUNK = 500

_S = task_stats.c
#: The summary table's columns, in order.
COLUMNS = tuple(c.name for c in task_stats.c)


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


def summaries_of(where: Sequence[ColumnElement[bool]]) -> Any:
    """The summary of each task among the buffer's rows (bound parameter ``buffer_id``)
    matching ``where``, computed from those rows, in :data:`COLUMNS` order, as a SELECT:
    counts, sums and extremes by GROUP BY over the matching rows, the task's last row
    (highest step, then key) and its smallest version (its version sums' base) by window functions
    over the same rows, so only those rows are read."""
    buffer_id = bindparam("buffer_id", type_=Integer)
    version = rows.c.policy_version
    ranked = (
        select(
            rows.c.task_id,
            rows.c.key,
            rows.c.step,
            rows.c.reward_t,
            rows.c.execute_time,
            version,
            func.row_number()
            .over(partition_by=rows.c.task_id, order_by=(rows.c.step.desc(), rows.c.key.desc()))
            .label("rank"),
            func.min(version).over(partition_by=rows.c.task_id).label("base"),
        )
        .where(rows.c.buffer_id == buffer_id, *where)
        .subquery()
    )
    r = ranked.c
    last = r.rank == 1
    figures = {
        "buffer_id": buffer_id,
        "task_id": r.task_id,
        **_figures(r.reward_t, r.execute_time, r.policy_version, r.base),
        "version_base": func.min(r.base),
        "last_key": func.max(case((last, r.key))),
        "last_step": func.max(case((last, r.step))),
        "last_reward": func.max(case((last, r.reward_t))),
        "dirty": false(),
    }
    return select(*(figures[name].label(name) for name in COLUMNS)).group_by(r.task_id)


def _figures(reward: Any, time: Any, version: Any, base: Any) -> dict[str, Any]:
    """The aggregates of a group of rows that two summaries add up or compare: rewards,
    times and versions (the version sums of ``version - base``). A reward beyond
    ±:data:`REWARD_BOUND` counts at that bound in the sums (its square could not be held),
    never in the extremes."""
    bounded = bounded_reward(reward)
    lag = cast(version - base, Float)
    return {
        "rows": func.count(),
        "reward_count": func.count(reward),
        "reward_sum": func.coalesce(func.sum(bounded), 0.0),
        "reward_sumsq": func.coalesce(func.sum(bounded * bounded), 0.0),
        "reward_min": func.min(reward),
        "reward_max": func.max(reward),
        "time_min": func.min(time),
        "time_max": func.max(time),
        "version_count": func.count(version),
        "version_sum": func.coalesce(func.sum(lag), 0.0),
        "version_sumsq": func.coalesce(func.sum(lag * lag), 0.0),
        "version_min": func.min(version),
        "version_max": func.max(version),
    }


#: The largest reward magnitude stats sum as it is (its square and the sum of many stay
#: finite doubles); beyond it a reward counts at the bound in means and spreads, on every
#: path (from the rows too), so that no write or stats call overflows.
REWARD_BOUND = 1e100


def bounded_reward(reward: Any) -> Any:
    """``reward`` as a double within ±:data:`REWARD_BOUND`."""
    return case(
        (reward > REWARD_BOUND, REWARD_BOUND),
        (reward < -REWARD_BOUND, -REWARD_BOUND),
        else_=cast(reward, Float),
    )


#: The columns of a task's last row.
_LAST = ("last_key", "last_step", "last_reward")
#: The counts and sums two summaries of a task's rows add up in (the version sums apart:
#: each is relative to its summary's base).
_SUMMED = ("rows", "reward_count", "reward_sum", "reward_sumsq", "version_count")
#: What a delete takes out of a task's summary (its version sums relative to its base).
_SUBTRACTED = (*_SUMMED, "version_sum", "version_sumsq")
#: The extremes, and whether each is a smallest one.
_EXTREMES = (
    ("reward_min", True),
    ("reward_max", False),
    ("time_min", True),
    ("time_max", False),
    ("version_min", True),
    ("version_max", False),
)


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
        _built_part(bindparam("through"), bindparam("since")),
    ],
}
_STATEMENTS: dict[tuple[str, str], Any] = {}


def _statement(handle: BufferHandle, kind: str) -> Any:
    """The statement of ``kind`` for the handle's database, built once: ``merge new`` and
    ``merge step`` add rows into their tasks' summaries (an upsert), ``summarise tasks``
    and ``summarise tasks, building`` write the summaries of tasks afresh, ``subtract``
    takes deleted rows out of one (executed for many), ``forget tasks`` deletes them."""
    dialect = handle.dialect
    found = _STATEMENTS.get((dialect.name, kind))
    if found is not None:
        return found
    verb, _, rest = kind.partition(" ")
    if verb == "merge":
        new = dialect.upsert(task_stats).from_select(list(COLUMNS), summaries_of(_ROWS[rest]()))
        found = new.on_conflict_do_update(
            index_elements=["buffer_id", "task_id"], set_=_merged(new.excluded)
        )
    elif verb == "summarise":
        found = insert(task_stats).from_select(list(COLUMNS), summaries_of(_ROWS[rest]()))
    elif verb == "subtract":
        found = (
            update(task_stats)
            .where(_S.buffer_id == bindparam("of_buffer"), _S.task_id == bindparam("of_task"))
            .values(
                {
                    **{name: _S[name] - bindparam(f"gone_{name}") for name in _SUBTRACTED},
                    "dirty": or_(_S.dirty, bindparam("mark", type_=Boolean)),
                }
            )
        )
    else:
        found = delete(task_stats).where(
            _S.buffer_id == bindparam("buffer_id", type_=Integer),
            _S.task_id.in_(bindparam("tasks", expanding=True)),
        )
    _STATEMENTS[(dialect.name, kind)] = found
    return found


def _merged(ex: Any) -> dict[str, Any]:
    """A task's summary with ``ex`` (the new rows' summary) merged in: counts and sums
    added (``ex``'s version sums moved to the stored base first), extremes compared, the
    later last row (by step, then key) kept."""
    newer = or_(
        ex.last_step > _S.last_step, and_(ex.last_step == _S.last_step, ex.last_key > _S.last_key)
    )
    merged: dict[str, Any] = {name: _S[name] + ex[name] for name in _SUMMED}
    for name, smallest in _EXTREMES:
        merged[name] = (_lesser if smallest else _greater)(_S[name], ex[name])
    for name in _LAST:
        merged[name] = case((newer, ex[name]), else_=_S[name])
    # sum(v - a) = sum(v - b) + n (b - a); sum((v - a)^2) likewise, with a the stored base
    shift = cast(ex.version_base - _S.version_base, Float)
    moved = _S.version_base.is_not(None) & ex.version_base.is_not(None)
    merged["version_base"] = func.coalesce(_S.version_base, ex.version_base)
    merged["version_sum"] = case(
        (moved, _S.version_sum + ex.version_sum + ex.version_count * shift),
        else_=_S.version_sum + ex.version_sum,
    )
    merged["version_sumsq"] = case(
        (
            moved,
            _S.version_sumsq
            + ex.version_sumsq
            + 2.0 * shift * ex.version_sum
            + ex.version_count * shift * shift,
        ),
        else_=_S.version_sumsq + ex.version_sumsq,
    )
    return merged


def merge_new(handle: BufferHandle, conn: Connection, after_key: int) -> None:
    """Merge the buffer's rows above ``after_key`` (those the caller's transaction wrote)
    into their tasks' summaries."""
    conn.execute(
        _statement(handle, "merge new"), {"buffer_id": handle.buffer_id, "after": after_key}
    )


def merge_range(handle: BufferHandle, conn: Connection, low: int, high: int) -> None:
    """Merge the buffer's rows with keys in ``(low, high]`` into their tasks' summaries."""
    bounds = {"buffer_id": handle.buffer_id, "low": low, "high": high}
    conn.execute(_statement(handle, "merge step"), bounds)


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
    for at in range(0, len(tasks), TASK_CHUNK):
        chunk = {"buffer_id": handle.buffer_id, "tasks": tasks[at : at + TASK_CHUNK]}
        conn.execute(forget, chunk)
        conn.execute(summarise, {**chunk, **bounds})


class Removal(NamedTuple):
    """What a delete does to the summaries of the tasks it takes rows from (see
    :func:`before_delete`)."""

    emptied: list[str]  # no row left: the summary goes
    subtracted: list[dict[str, Any]]  # the deleted rows taken out (``subtract``'s values)
    recomputed: list[str]  # summarised again from the rows left


def before_delete(
    handle: BufferHandle, conn: Connection, kept: SummaryState, where: Sequence[Any]
) -> Removal:
    """How the summaries of the tasks of the buffer's rows matching ``where`` change when
    those rows go, read before they go: the summaries of the summarised ones among them
    (grouped by task, from those rows alone), then their tasks' stored summaries by key. A
    task keeps its summary less the deleted rows' counts and sums, unless they held one of
    its extremes or its last row: then it is summarised again from its rows (a short task),
    or marked dirty (a long one, which stats read from its rows until :func:`create`
    summarises it again)."""
    building = [] if kept.built else [_built_part(kept.through, kept.since)]
    read = summaries_of([*where, *building])
    gone = {
        found[1]: dict(zip(COLUMNS, found, strict=True))  # by task_id
        for found in conn.execute(read, {"buffer_id": handle.buffer_id})
    }
    removal = Removal([], [], [])
    for stored in _stored(handle, conn, list(gone)):
        task = stored["task_id"]
        taken = gone[task]
        left = int(stored["rows"]) - int(taken["rows"])
        if left <= 0:
            removal.emptied.append(task)
            continue
        # The last row of all is among those deleted only if it is their last row too.
        touched = taken["last_key"] == stored["last_key"] or any(
            taken[name] is not None
            and stored[name] is not None
            and (taken[name] <= stored[name] if low else taken[name] >= stored[name])
            for name, low in _EXTREMES
        )
        if touched and not stored["dirty"] and left <= handle.tuning.recompute_limit:
            removal.recomputed.append(task)
            continue
        values = {f"gone_{name}": taken[name] for name in _SUMMED}
        values.update(_rebased(taken, stored["version_base"]))
        removal.subtracted.append({"of_task": task, "mark": touched, **values})
    return removal


def _stored(handle: BufferHandle, conn: Connection, tasks: list[str]) -> Iterator[dict[str, Any]]:
    """The stored summaries of these tasks (by the table's key, a chunk at a time)."""
    for at in range(0, len(tasks), TASK_CHUNK):
        chunk = tasks[at : at + TASK_CHUNK]
        stmt = select(task_stats).where(_S.buffer_id == handle.buffer_id, _S.task_id.in_(chunk))
        yield from (dict(found._mapping) for found in conn.execute(stmt))


def _rebased(taken: dict[str, Any], base: int | None) -> dict[str, float]:
    """The deleted rows' version sums (of v - their own base) as sums of v - ``base``, the
    stored summary's: sum(v - a) = sum(v - b) + n (b - a), and likewise for squares."""
    count, total, square = int(taken["version_count"]), taken["version_sum"], taken["version_sumsq"]
    if not count or base is None:
        return {"gone_version_sum": 0.0, "gone_version_sumsq": 0.0}
    shift = float(int(taken["version_base"]) - int(base))  # exact in integers first
    return {
        "gone_version_sum": total + count * shift,
        "gone_version_sumsq": square + 2.0 * shift * total + count * shift * shift,
    }


def _built_part(through: Any, since: Any) -> ColumnElement[bool]:
    """The rows already summarised while the build goes on (keys up to ``through`` and
    above ``since``: values or bound parameters)."""
    return or_(rows.c.key <= through, rows.c.key > since)


def after_delete(
    handle: BufferHandle, conn: Connection, kept: SummaryState, removal: Removal
) -> None:
    """Apply ``removal`` once the rows have gone (in the same transaction)."""
    buffer_id = handle.buffer_id
    forget = _statement(handle, "forget tasks")
    for at in range(0, len(removal.emptied), TASK_CHUNK):
        conn.execute(
            forget, {"buffer_id": buffer_id, "tasks": removal.emptied[at : at + TASK_CHUNK]}
        )
    if removal.subtracted:
        subtract = _statement(handle, "subtract")
        conn.execute(subtract, [{"of_buffer": buffer_id, **v} for v in removal.subtracted])
    if removal.recomputed:
        recompute(handle, conn, removal.recomputed, kept)


def dirty_tasks(buffer_id: int) -> Any:
    """A SELECT of the buffer's dirty tasks, through the partial index holding only them."""
    return select(_S.task_id).where(_S.buffer_id == buffer_id, _S.dirty)


def drop_all(handle: BufferHandle, conn: Connection, kept: SummaryState) -> None:
    """Every row of the buffer went (``clear()``): no task is left, and nothing is left to
    build."""
    conn.execute(delete(task_stats).where(_S.buffer_id == handle.buffer_id))
    if not kept.built:
        set_state(conn, handle.buffer_id, kept.since, kept.since)


def set_state(conn: Connection, buffer_id: int, since: int | None, through: int | None) -> None:
    """Store the buffer's summary state (None, None: it keeps none)."""
    conn.execute(
        update(buffers)
        .where(buffers.c.id == buffer_id)
        .values(summary_from=since, summary_through=through)
    )


class _TaskStatsFeature(RowFeature):
    """A buffer that keeps task summaries merges each write's rows into them and takes
    each removal's out."""

    name = "task_stats"
    order = 30

    def columns(self, buffer_id: Any) -> list[Any]:
        return [buffers.c.summary_from, buffers.c.summary_through]

    def setting(self, values: Sequence[Any]) -> Any:
        return SummaryState.of(values[0], values[1])

    def after_insert(self, ctx: WriteContext, setting: Any) -> None:
        merge_new(ctx.handle, ctx.conn, ctx.state.newest)

    def before_remove(self, ctx: RemoveContext, setting: Any) -> None:
        ctx.notes[self.name] = before_delete(ctx.handle, ctx.conn, setting, ctx.where)

    def after_remove(self, ctx: RemoveContext, setting: Any) -> None:
        removal = ctx.notes.get(self.name)
        if ctx.gone and removal is not None:
            after_delete(ctx.handle, ctx.conn, setting, removal)


register(_TaskStatsFeature())
