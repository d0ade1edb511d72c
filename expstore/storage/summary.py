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

from sqlalchemy import Float, and_, case, cast, func, select

from .base import QueryCondition
from .handle import BufferHandle
from .schema import buffers, rows

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
        t = conn.execute(totals).one()
        task_count, fewest, most, successes = conn.execute(tasks).one()
    n = int(t[0])
    version_now = None if t[18] is None else int(t[18])
    versions: dict[str, Any] = {"current": version_now, "rows_with_one": int(t[10])}
    if t[10]:
        versions["min"], versions["max"] = int(t[11]), int(t[12])
        if version_now is not None:
            versions["staleness"] = _numbers(t[10], t[17], t[13], t[14], t[15], t[16])
    out: dict[str, Any] = {"rows": n, "versions": versions}
    if not n:
        return {
            **out,
            "tasks": 0,
            "agents": 0,
            "steps_per_task": None,
            "reward": _numbers(0, None, None, None, None, None),
            "success_rate": None,
        }
    task_count = int(task_count)
    return {
        **out,
        "tasks": task_count,
        "agents": int(t[9]),
        "steps_per_task": {"mean": n / task_count, "min": int(fewest), "max": int(most)},
        "reward": _numbers(t[1], t[2], t[3], t[4], t[5], t[6]),
        "success_rate": int(successes) / task_count,
        "time": {"first": float(t[7]), "last": float(t[8])},
    }
