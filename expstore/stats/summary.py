"""A buffer's summary computed by the database: the figures of ``expstore stats`` as SQL
aggregates, so neither the rows nor arrays of them ever come to Python (memory stays flat
however large the buffer; the time is the database's scan).

Two statements on one connection: the totals over the matching rows (rows, rewards, times,
policy versions, agents), and one over tasks (a task's last row, by step then insertion,
found by a window), which gives the task count, the steps per task and the success rate.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Connection, Float, and_, case, cast, false, func, select, union_all

from ..db.handle import BufferHandle
from ..db.schema import buffers, loose_scan, rows
from ..db.schema import task_stats as task_stats_table
from ..query import QueryCondition
from . import task_stats

__all__ = ["summarise"]


def _spread(count: int, mean: Any, mean_square: Any) -> float | None:
    """The population standard deviation from the mean and the mean of squares."""
    if not count or mean is None or mean_square is None:
        return None
    mean = float(mean)
    return math.sqrt(max(0.0, float(mean_square) - mean * mean))


def _per(total: Any, count: Any) -> float | None:
    """``total / count`` (a mean), None for no count."""
    return None if not count or total is None else float(total) / int(count)


def _numbers(count: int, total: Any, mean: Any, square: Any, low: Any, high: Any) -> Any:
    if not count:
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None, "sum": None}
    return {
        "count": int(count),
        "mean": float(mean),
        "std": _spread(count, mean, square),
        "min": float(low),
        "max": float(high),
        "sum": float(total),
    }


def summarise(
    handle: BufferHandle, query_condition: QueryCondition, success_above: float
) -> dict[str, Any]:
    """The summary of the matching rows: ``rows``, ``tasks``, ``agents``,
    ``steps_per_task``, ``reward``, ``success_rate``, ``time``, ``versions``."""
    where = handle.where(query_condition)
    reward = rows.c.reward_t
    version = rows.c.policy_version
    current = (
        select(buffers.c.policy_version).where(buffers.c.id == handle.buffer_id).scalar_subquery()
    )
    # How far a row's version is behind the current one (NULL for a row without one).
    behind = case((version.is_(None), None), (version < current, current - version), else_=0)
    real = task_stats.bounded_reward(reward)  # as the task summaries sum it
    lag = cast(behind, Float)  # in doubles: a square of a BIGINT could overflow
    # Sums, divided here: Postgres's avg() of doubles also sums their squares (for
    # variance), which overflows long before the values do.
    totals = select(
        func.count(),
        func.count(reward),
        func.sum(real),
        func.sum(real),
        func.sum(real * real),
        func.min(reward),
        func.max(reward),
        func.min(rows.c.execute_time),
        func.max(rows.c.execute_time),
        func.count(func.distinct(rows.c.agent_id)),
        func.count(version),
        func.min(version),
        func.max(version),
        func.sum(lag),
        func.sum(lag * lag),
        func.min(behind),
        func.max(behind),
        func.sum(lag),
        current,
    ).where(*where)
    last = func.row_number().over(
        partition_by=rows.c.task_id, order_by=(rows.c.step.desc(), rows.c.key.desc())
    )
    per_task = (
        select(
            last.label("last"),
            func.count().over(partition_by=rows.c.task_id).label("steps"),
            reward.label("final"),
        )
        .where(*where)
        .subquery()
    )
    succeeded = case((and_(per_task.c.final.is_not(None), per_task.c.final > success_above), 1))
    tasks = select(
        func.count(),
        func.min(per_task.c.steps),
        func.max(per_task.c.steps),
        func.count(succeeded),
    ).where(per_task.c.last == 1)
    with handle.errors("summarise the buffer"), handle.read() as conn:
        if query_condition is None:
            handle.dialect.snapshot(conn)  # the state, the tasks and the agents agree
            found = _from_tasks(handle, conn, success_above)
            if found is not None:
                return found
        t = conn.execute(totals).one()
        task_count, fewest, most, successes = conn.execute(tasks).one()
    return _figures(
        rows_=int(t[0]),
        tasks=(task_count, fewest, most, successes),
        agents=t[9],
        reward=(t[1], t[2], _per(t[3], t[1]), _per(t[4], t[1]), t[5], t[6]),
        times=(t[7], t[8]),
        versions=(t[18], t[10], t[11], t[12]),
        staleness=(t[17], _per(t[13], t[10]), _per(t[14], t[10]), t[15], t[16]),
    )


def _figures(
    *,
    rows_: int,
    tasks: tuple[Any, ...],
    agents: Any,
    reward: tuple[Any, ...],
    times: tuple[Any, Any],
    versions: tuple[Any, ...],
    staleness: tuple[Any, ...],
) -> dict[str, Any]:
    """The summary dict from its parts: ``tasks`` (count, fewest and most rows, successes);
    ``reward`` (count, sum, mean, mean square, min, max); ``versions`` (current, rows with
    one, min, max); ``staleness`` over those rows (sum, mean, mean square, min, max)."""
    current, with_one, low, high = versions
    version_now = None if current is None else int(current)
    kept: dict[str, Any] = {"current": version_now, "rows_with_one": int(with_one or 0)}
    if with_one:
        kept["min"], kept["max"] = int(low), int(high)
        if version_now is not None:
            kept["staleness"] = _numbers(with_one, *staleness)
    out: dict[str, Any] = {"rows": rows_, "versions": kept}
    if not rows_:
        return {
            **out,
            "tasks": 0,
            "agents": 0,
            "steps_per_task": None,
            "reward": _numbers(0, None, None, None, None, None),
            "success_rate": None,
        }
    task_count, fewest, most, successes = (int(v) for v in tasks)
    return {
        **out,
        "tasks": task_count,
        "agents": int(agents),
        "steps_per_task": {"mean": rows_ / task_count, "min": fewest, "max": most},
        "reward": _numbers(*reward),
        "success_rate": successes / task_count,
        "time": {"first": float(times[0]), "last": float(times[1])},
    }


def _from_tasks(
    handle: BufferHandle, conn: Connection, success_above: float
) -> dict[str, Any] | None:
    """The whole buffer's summary from its task summaries (see
    :mod:`expstore.stats.task_stats`): one row per task, however many rows the buffer
    holds (a dirty task's figures from its rows); None when it keeps none, or they are
    still being built. The caller's connection reads one snapshot."""
    kept = task_stats.state(conn, handle.buffer_id)
    if kept is None or not kept.built:
        return None
    buffer_id = handle.buffer_id
    stored = task_stats_table.c
    mine = stored.buffer_id == buffer_id
    # The dirty tasks (by their partial index; usually none): their figures from their rows.
    dirty = task_stats.dirty_tasks(buffer_id)
    tasks: Any = task_stats_table
    if conn.execute(dirty.limit(1)).first() is not None:
        clean = select(*(stored[name] for name in task_stats.COLUMNS)).where(
            mine, stored.dirty.is_(false())
        )
        fresh = task_stats.summaries_of([rows.c.task_id.in_(dirty)])
        tasks = union_all(clean, fresh).subquery()
    s = tasks
    current = select(buffers.c.policy_version).where(buffers.c.id == buffer_id).scalar_subquery()
    # A task whose versions are all at or below the current one is stale by current - v
    # row by row, which its sums (of v - base) give exactly; one all at or above, not at
    # all. One across the current version (rare) is read row by row below.
    below = s.c.version_max <= current
    across = and_(s.c.version_min < current, s.c.version_max > current)
    ahead = cast(current - s.c.version_base, Float)  # exact in integers, then a double
    behind = case((below, s.c.version_count * ahead - s.c.version_sum), else_=0.0)
    square = case(
        (
            below,
            s.c.version_count * ahead * ahead - 2.0 * ahead * s.c.version_sum + s.c.version_sumsq,
        ),
        else_=0.0,
    )
    t = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(s.c.rows), 0),
            func.min(s.c.rows),
            func.max(s.c.rows),
            func.count(case((s.c.last_reward > success_above, 1))),
            func.coalesce(func.sum(s.c.reward_count), 0),
            func.sum(s.c.reward_sum),
            func.sum(s.c.reward_sumsq),
            func.min(s.c.reward_min),
            func.max(s.c.reward_max),
            func.min(s.c.time_min),
            func.max(s.c.time_max),
            func.coalesce(func.sum(s.c.version_count), 0),
            func.min(s.c.version_min),
            func.max(s.c.version_max),
            func.sum(behind),
            func.sum(square),
            func.count(case((across, 1))),
            current,
        ).where(s.c.buffer_id == buffer_id),
        {"buffer_id": buffer_id},
    ).one()
    n, reward_count, with_one = int(t[1]), int(t[5]), int(t[12])
    behind_sum, behind_square = float(t[15] or 0.0), float(t[16] or 0.0)
    if t[17]:  # tasks across the current version: their rows' staleness, row by row
        version = rows.c.policy_version
        lag = case((version < current, cast(current - version, Float)), else_=0.0)
        crossing = select(s.c.task_id).where(s.c.buffer_id == buffer_id, across)
        extra = conn.execute(
            select(func.sum(lag), func.sum(lag * lag)).where(
                rows.c.buffer_id == buffer_id, rows.c.task_id.in_(crossing), version.is_not(None)
            ),
            {"buffer_id": buffer_id},
        ).one()
        behind_sum += float(extra[0] or 0.0)
        behind_square += float(extra[1] or 0.0)
    version_now, low, high = t[18], t[13], t[14]
    least = most = None
    if with_one and version_now is not None:
        least, most = max(0, version_now - high), max(0, version_now - low)
    return _figures(
        rows_=n,
        tasks=(t[0], t[2] or 0, t[3] or 0, t[4]),
        agents=_distinct_agents(handle, conn),
        reward=(reward_count, t[6], _per(t[6], reward_count), _per(t[7], reward_count), t[8], t[9]),
        times=(t[10], t[11]),
        versions=(version_now, with_one, low, high),
        staleness=(
            behind_sum,
            _per(behind_sum, with_one),
            _per(behind_square, with_one),
            least,
            most,
        ),
    )


def _distinct_agents(handle: BufferHandle, conn: Connection) -> int:
    """How many agents the buffer's rows have, by one probe of its (buffer_id, agent_id)
    index per agent (a loose index scan)."""
    found = loose_scan(rows.c.agent_id, rows.c.buffer_id == handle.buffer_id)
    return int(conn.execute(select(func.count()).select_from(found.subquery())).scalar_one())
