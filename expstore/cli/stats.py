"""``expstore stats``: rows, tasks, agents, steps per task, rewards and success rate."""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from ..buffer import ReplayBuffer
from ..query import QueryCondition
from ._common import (
    DEFAULT_URL,
    BufferOption,
    DatabaseArgument,
    DbOption,
    JsonOption,
    WhereOption,
    echo_err,
    number,
    open_buffer,
    render_table,
    show_url,
    where_condition,
)
from .plot import plot_stats

#: Whole-buffer stats slower than this (seconds) say how to make them fast.
SLOW_S = 2.0

_COLUMNS = ("task_id", "agent_id", "step", "reward_t", "execute_time", "policy_version")


class GroupBy(str, Enum):
    agent = "agent"
    task = "task"


def _summary(values: np.ndarray) -> dict[str, float | int | None]:
    present = values[~np.isnan(values)]
    if not len(present):
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None, "sum": None}
    return {
        "count": int(len(present)),
        "mean": float(present.mean()),
        "std": float(present.std()),
        "min": float(present.min()),
        "max": float(present.max()),
        "sum": float(present.sum()),
    }


def _tasks(index: dict[str, np.ndarray], success_above: float) -> dict[str, Any]:
    """Per-task arrays: ids, row counts, final reward, success, first row position."""
    task_ids, first, inverse, counts = np.unique(
        index["task_id"].astype(str), return_index=True, return_inverse=True, return_counts=True
    )
    # The last row of a task: highest step, then latest insertion.
    order = np.lexsort((index["key"], index["step"], inverse))
    ends = np.cumsum(counts) - 1
    last = order[ends]
    final = index["reward_t"][last]
    success = np.nan_to_num(final, nan=-np.inf) > success_above
    return {
        "ids": task_ids,
        "inverse": inverse,
        "counts": counts,
        "final": final,
        "success": success,
        "first": first,
        "agent": index["agent_id"][last],
    }


def compute_stats(
    buffer: ReplayBuffer,
    query_condition: QueryCondition = None,
    *,
    by: str | None = None,
    success_above: float = 0.0,
) -> dict[str, Any]:
    """The statistics ``expstore stats`` prints, as a dict (what ``--json`` prints).

    Without ``by`` the database computes them (:mod:`expstore.stats.summary`); with a
    per-agent or per-task table, from the matching rows' columns."""
    if by is None:
        summary = buffer.sql.summary(query_condition, success_above)
        if summary is not None:
            return {
                "rows": summary["rows"],
                "queue": _queue(buffer, query_condition),
                "versions": summary["versions"],
                "rate_limit": _rate_limit(buffer),
                **summary,
            }
    return _from_index(buffer, query_condition, by, success_above)


def _from_index(
    buffer: ReplayBuffer, query_condition: QueryCondition, by: str | None, success_above: float
) -> dict[str, Any]:
    """:func:`compute_stats` over the matching rows' columns, in numpy."""
    index = buffer.storage.key_index(query_condition, _COLUMNS)
    n = len(index["key"])
    out: dict[str, Any] = {"rows": n, "queue": _queue(buffer, query_condition)}
    out["versions"] = _versions(index)
    out["rate_limit"] = _rate_limit(buffer)
    if not n:
        out.update(tasks=0, agents=0, steps_per_task=None, reward=_summary(np.zeros(0)))
        out["success_rate"] = None
        if by:
            out["groups"] = []
        return out
    tasks = _tasks(index, success_above)
    agents = np.unique(index["agent_id"].astype(str))
    counts = tasks["counts"]
    out["tasks"] = int(len(tasks["ids"]))
    out["agents"] = int(len(agents))
    out["steps_per_task"] = {
        "mean": float(counts.mean()),
        "min": int(counts.min()),
        "max": int(counts.max()),
    }
    out["reward"] = _summary(index["reward_t"])
    out["success_rate"] = float(tasks["success"].mean())
    out["time"] = {
        "first": float(index["execute_time"].min()),
        "last": float(index["execute_time"].max()),
    }
    if by == "agent":
        out["groups"] = _by_agent(index, tasks)
    elif by == "task":
        out["groups"] = _by_task(index, tasks)
    return out


def _queue(buffer: ReplayBuffer, query_condition: QueryCondition) -> dict[str, Any]:
    """Queue depth of the claims (see ReplayBuffer.claim): rows by state, and per consumer."""
    queue = buffer.queue_stats(query_condition)
    admission = buffer.admission_stats()
    return {
        "unclaimed": queue.unclaimed,
        "leased": queue.leased,
        "expired": queue.expired,
        "consumed": queue.consumed,
        "consumers": queue.per_consumer,
        "in_flight": [f._asdict() for f in queue.in_flight],
        "completions": None if queue.completions is None else queue.completions._asdict(),
        "admission": None if admission is None else admission._asdict(),
    }


def _versions(index: dict[str, Any]) -> dict[str, Any]:
    """The buffer's current policy version and the matching rows' versions."""
    versions = index["policy_version"]
    known = versions[~np.isnan(versions)]
    current = index.get("current_version")
    out: dict[str, Any] = {"current": current, "rows_with_one": int(len(known))}
    if len(known):
        out["min"], out["max"] = int(known.min()), int(known.max())
        if current is not None:
            staleness = np.clip(current - known, 0, None)
            out["staleness"] = _summary(staleness)
    return out


def _rate_limit(buffer: ReplayBuffer) -> dict[str, Any] | None:
    stats = buffer.rate_limit_stats()
    if stats is None:
        return None
    limiter = stats.limiter
    return {
        "min_size": limiter.min_size,
        "samples_per_insert": limiter.samples_per_insert,
        "error_buffer": limiter.error_buffer,
        "block_writers": limiter.block_writers,
        "inserted": stats.inserted,
        "sampled": stats.sampled,
        "can_sample": stats.can_sample,
        "can_insert": stats.can_insert,
    }


def _by_agent(index: dict[str, np.ndarray], tasks: dict[str, Any]) -> list[dict[str, Any]]:
    agent_ids = index["agent_id"].astype(str)
    groups = []
    for agent in sorted(set(agent_ids.tolist())):
        mask = agent_ids == agent
        task_mask = tasks["agent"].astype(str) == agent
        reward = _summary(index["reward_t"][mask])
        groups.append(
            {
                "agent_id": agent,
                "rows": int(mask.sum()),
                "tasks": int(len(np.unique(index["task_id"][mask].astype(str)))),
                "mean_reward": reward["mean"],
                "success_rate": (
                    float(tasks["success"][task_mask].mean()) if task_mask.any() else None
                ),
            }
        )
    return groups


def _by_task(index: dict[str, np.ndarray], tasks: dict[str, Any]) -> list[dict[str, Any]]:
    rewards = np.nan_to_num(index["reward_t"], nan=0.0)
    totals = np.bincount(tasks["inverse"], weights=rewards, minlength=len(tasks["ids"]))
    groups = []
    for i in np.argsort(tasks["first"], kind="stable"):  # first-inserted task first
        final = tasks["final"][i]
        groups.append(
            {
                "task_id": str(tasks["ids"][i]),
                "agent_id": str(tasks["agent"][i]),
                "steps": int(tasks["counts"][i]),
                "total_reward": float(totals[i]),
                "final_reward": None if np.isnan(final) else float(final),
                "success": bool(tasks["success"][i]),
            }
        )
    return groups


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _version_lines(versions: dict[str, Any], limit: dict[str, Any] | None) -> list[tuple[str, str]]:
    lines = []
    if versions["current"] is not None or versions["rows_with_one"]:
        current = versions["current"]
        text = f"current {'not set' if current is None else current}"
        if versions["rows_with_one"]:
            span = f"{versions['min']}..{versions['max']}"
            text += f"; rows {span} ({versions['rows_with_one']} have one)"
            staleness = versions.get("staleness")
            if staleness:
                mean, top = number(staleness["mean"], 1), number(staleness["max"])
                text += f", staleness mean {mean}, max {top}"
        lines.append(("policy version", text))
    if limit is not None:
        ratio = limit["samples_per_insert"]
        rule = f"min_size {limit['min_size']}" + (
            f", {number(ratio)} samples per insert" if ratio is not None else ""
        )
        state = "sampling may go" if limit["can_sample"] else "sampling waits"
        if not limit["can_insert"]:
            state += ", writers wait"
        lines.append(
            (
                "rate limit",
                f"{rule}; {limit['inserted']} inserted, {limit['sampled']} sampled ({state})",
            )
        )
    return lines


def _prompt_lines(queue: dict[str, Any]) -> list[tuple[str, str]]:
    """A prompt queue's lines: prompts waiting, in flight (actors, progress age), done;
    the admission bound and what holds it."""
    lines: list[tuple[str, str]] = []
    done = queue.get("completions")
    if done:
        waiting = done["prompts"] - done["done"]
        lines.append(
            (
                "prompts",
                f"{done['done']} done, {waiting} not done ({queue['leased']} in flight); "
                f"completions {done['stored']} of {done['target']}",
            )
        )
    for held in queue.get("in_flight", [])[:10]:
        age = held["progress_age_s"]
        saved = "no progress saved" if age is None else f"progress saved {age:.0f} s ago"
        needs = "" if held["needs"] is None else f", needs {held['needs']}"
        lines.append((f"  {held['id']}", f"held by {held['consumer']}{needs}, {saved}"))
    more = len(queue.get("in_flight", [])) - 10
    if more > 0:
        lines.append(("  ...", f"{more} more held (--json lists up to 100)"))
    admission = queue.get("admission")
    if admission:
        bounds = []
        if admission["staleness_bound"] is not None:
            bounds.append(f"staleness bound {admission['staleness_bound']}")
        if admission["max_backlog"] is not None:
            bounds.append(f"max_backlog {admission['max_backlog']}")
        held_by = admission["held_by"]
        state = "admitting" if held_by is None else f"held back by {held_by}"
        lines.append(
            (
                "admission",
                f"{admission['in_flight']} completions in flight, {admission['backlog']} "
                f"stored unconsumed; {', '.join(bounds)}: {state}",
            )
        )
    return lines


def _print(stats: dict[str, Any], header: str, by: str | None, limit: int) -> None:
    lines = [("rows", str(stats["rows"])), ("tasks", str(stats["tasks"]))]
    lines.append(("agents", str(stats["agents"])))
    steps = stats["steps_per_task"]
    if steps:
        lines.append(
            (
                "steps per task",
                f"mean {number(steps['mean'], 1)}, min {steps['min']}, max {steps['max']}",
            )
        )
    reward = stats["reward"]
    if reward["count"]:
        lines.append(
            (
                "reward_t",
                f"mean {number(reward['mean'])}, std {number(reward['std'])}, "
                f"min {number(reward['min'])}, max {number(reward['max'])} "
                f"({reward['count']} rows have one)",
            )
        )
    else:
        lines.append(("reward_t", "no row has one"))
    lines.append(("success rate", _pct(stats["success_rate"]) + " of tasks"))
    lines += _version_lines(stats["versions"], stats["rate_limit"])
    queue = stats["queue"]
    if queue["leased"] + queue["expired"] + queue["consumed"]:  # only once rows were claimed
        lines.append(
            (
                "claims",
                f"{queue['unclaimed']} unclaimed, {queue['leased']} leased, "
                f"{queue['expired']} expired, {queue['consumed']} consumed",
            )
        )
        for consumer, held in sorted(queue["consumers"].items()):
            lines.append(
                (
                    f"  {consumer}",
                    f"{held['leased']} leased, {held['expired']} expired, "
                    f"{held['consumed']} consumed",
                )
            )
    lines += _prompt_lines(queue)
    typer.echo(header)
    for name, value in lines:
        typer.echo(f"  {name:<15} {value}")
    groups = stats.get("groups")
    if not by or not groups:
        return
    typer.echo("")
    if by == "agent":
        headers = ["agent_id", "rows", "tasks", "mean reward", "success"]
        cells = [
            [
                g["agent_id"],
                str(g["rows"]),
                str(g["tasks"]),
                number(g["mean_reward"]),
                _pct(g["success_rate"]),
            ]
            for g in groups[:limit]
        ]
    else:
        headers = ["task_id", "agent_id", "steps", "total reward", "final reward", "success"]
        cells = [
            [
                g["task_id"],
                g["agent_id"],
                str(g["steps"]),
                number(g["total_reward"]),
                number(g["final_reward"]),
                "yes" if g["success"] else "no",
            ]
            for g in groups[:limit]
        ]
    right = [h for h in headers if not h.endswith("_id")]
    typer.echo(render_table(headers, cells, right=right))
    if len(groups) > limit:
        typer.echo(f"({len(groups) - limit} more; raise --limit or use --json)")


def slow_read_note(
    buf: ReplayBuffer, rows: int, took: float, *, slow_s: float = SLOW_S
) -> str | None:
    """What whole-buffer stats that read every one of ``rows`` rows in ``took`` seconds say
    about it: how to make them fast when that was slower than ``slow_s`` seconds and the
    buffer keeps no task summaries (which stats then read instead); None otherwise."""
    if took <= slow_s or buf.sql.summary_state() is not None:
        return None
    return (
        f"(read every row of {rows} in {took:.0f} s; `expstore summary --create` keeps a "
        "row per task, which stats read instead)"
    )


def stats(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    by: Annotated[
        GroupBy | None, typer.Option("--by", help="Add a table per agent or per task.")
    ] = None,
    where: WhereOption = None,
    as_json: JsonOption = False,
    limit: Annotated[
        int, typer.Option("--limit", min=1, metavar="N", help="Rows of the --by table to show.")
    ] = 20,
    success_above: Annotated[
        float,
        typer.Option(
            "--success-above",
            metavar="R",
            help="A task succeeds when its last step's reward_t is above R.",
        ),
    ] = 0.0,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE.png",
            help=(
                "Also draw episode return and success rate per agent over time, and a "
                "per-agent bar chart, into this PNG (needs: pip install 'expstore[plot]')."
            ),
        ),
    ] = None,
) -> None:
    """Summarise a buffer: rows, tasks, agents, steps per task, rewards, success rate.

    A task's steps are its rows; it succeeds when its last step (highest step) has a
    reward_t above --success-above (default 0).

    \b
    Example:
      expstore stats --db sqlite:///demo.db --buffer demo --by agent
      expstore stats --where "task_name = 'checkout'" --json
    """
    db = database or db  # a positional DATABASE wins over --db
    condition = where_condition(where)
    buf = open_buffer(db, buffer)
    try:
        started = time.monotonic()
        result = compute_stats(
            buf, condition, by=by.value if by else None, success_above=success_above
        )
        took = time.monotonic() - started
        if condition is None and by is None:
            note = slow_read_note(buf, result["rows"], took)
            if note is not None:
                echo_err(note)
        if plot is not None:
            why_not = plot_stats(buf, condition, plot, success_above=success_above)
            echo_err(f"Wrote {plot}" if why_not is None else f"skipped --plot: {why_not}")
    finally:
        buf.close()
    if as_json:
        about = {
            "database": show_url(buf.storage.url),
            "buffer": buffer,
            "where": None if condition is None else str(condition),
        }
        typer.echo(json.dumps({**about, **result}))
        return
    url = show_url(buf.storage.url)
    header = f"buffer {buffer!r} in {url}" + (f" where {condition}" if condition else "")
    _print(result, header, by.value if by else None, limit)
