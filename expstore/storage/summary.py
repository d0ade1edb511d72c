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

from sqlalchemy import Connection, Float, and_, case, cast, func, select

from . import task_stats
from .base import QueryCondition
from .handle import BufferHandle
from .schema import buffers, loose_scan, rows
from .schema import task_stats as task_stats_table

__all__ = ["summarise"]


def _spread(count: int, mean: Any, mean_square: Any) -> float | None:
    """The population standard deviation from the mean and the mean of squares."""
    if not count or mean is None or mean_square is None:
        return None
    return math.sqrt(max(0.0, float(mean_square) - float(mean) ** 2))


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
    real = cast(reward, Float)
    totals = select(
        func.count(),
        func.count(reward),
        func.sum(real),
        func.avg(real),
        func.avg(real * real),
        func.min(reward),
        func.max(reward),
        func.min(rows.c.execute_time),
        func.max(rows.c.execute_time),
        func.count(func.distinct(rows.c.agent_id)),
        func.count(version),
        func.min(version),
        func.max(version),
        func.avg(cast(behind, Float)),
        func.avg(cast(behind * behind, Float)),
        func.min(behind),
        func.max(behind),
        func.sum(cast(behind, Float)),
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
            found = _from_tasks(handle, conn, success_above)
            if found is not None:
                return found
        t = conn.execute(totals).one()
        task_count, fewest, most, successes = conn.execute(tasks).one()
    return _figures(
        rows_=int(t[0]),
        tasks=(task_count, fewest, most, successes),
        agents=t[9],
        reward=(t[1], t[2], t[3], t[4], t[5], t[6]),
        times=(t[7], t[8]),
        versions=(t[18], t[10], t[11], t[12]),
        staleness=(t[17], t[13], t[14], t[15], t[16]),
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
    :mod:`expstore.storage.task_stats`): one row per task, however many rows the buffer
    holds; None when it keeps none, or they are still being built."""
    kept = task_stats.state(conn, handle.buffer_id)
    if kept is None or not kept.built:
        return None
    s = task_stats_table.c
    buffer_id = handle.buffer_id
    current = select(buffers.c.policy_version).where(buffers.c.id == buffer_id).scalar_subquery()
    now = cast(current, Float)
    # A task whose versions are all at or below the current one is stale by current - v
    # row by row, which its sums give exactly; one all at or above, not at all. One across
    # the current version (rare) is read row by row below.
    below = s.version_max <= current
    across = and_(s.version_min < current, s.version_max > current)
    behind = case((below, s.version_count * now - s.version_sum), else_=0.0)
    square = case(
        (below, s.version_count * now * now - 2.0 * now * s.version_sum + s.version_sumsq),
        else_=0.0,
    )
    mine = s.buffer_id == buffer_id
    t = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(s.rows), 0),
            func.min(s.rows),
            func.max(s.rows),
            func.count(case((s.last_reward > success_above, 1))),
            func.coalesce(func.sum(s.reward_count), 0),
            func.sum(s.reward_sum),
            func.sum(s.reward_sumsq),
            func.min(s.reward_min),
            func.max(s.reward_max),
            func.min(s.time_min),
            func.max(s.time_max),
            func.coalesce(func.sum(s.version_count), 0),
            func.min(s.version_min),
            func.max(s.version_max),
            func.sum(behind),
            func.sum(square),
            func.count(case((across, 1))),
            current,
        ).where(mine)
    ).one()
    n, reward_count, with_one = int(t[1]), int(t[5]), int(t[12])
    behind_sum, behind_square = float(t[15] or 0.0), float(t[16] or 0.0)
    if t[17]:  # tasks across the current version: their rows' staleness, row by row
        version = rows.c.policy_version
        lag = case((version < current, cast(current - version, Float)), else_=0.0)
        crossing = select(s.task_id).where(mine, across)
        extra = conn.execute(
            select(func.sum(lag), func.sum(lag * lag)).where(
                rows.c.buffer_id == buffer_id, rows.c.task_id.in_(crossing), version.is_not(None)
            )
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
        reward=(
            reward_count,
            t[6],
            None if not reward_count else t[6] / reward_count,
            None if not reward_count else t[7] / reward_count,
            t[8],
            t[9],
        ),
        times=(t[10], t[11]),
        versions=(version_now, with_one, low, high),
        staleness=(
            behind_sum,
            behind_sum / with_one if with_one else None,
            behind_square / with_one if with_one else None,
            least,
            most,
        ),
    )


def _distinct_agents(handle: BufferHandle, conn: Connection) -> int:
    """How many agents the buffer's rows have, by one probe of its (buffer_id, agent_id)
    index per agent (a loose index scan)."""
    found = loose_scan(rows.c.agent_id, rows.c.buffer_id == handle.buffer_id)
    return int(conn.execute(select(func.count()).select_from(found.subquery())).scalar_one())
