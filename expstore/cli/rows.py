"""``expstore query`` and ``expstore sample``: look at rows."""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Any

import typer

from ..model.layout import ORDERABLE
from ..model.rows import DataRow
from ..samplers import (
    KeySampler,
    LatestSampler,
    PrioritizedSampler,
    RandomTaskSampler,
    RecencySampler,
    RewardWeightedSampler,
    SliceSampler,
    StalenessAwareSampler,
    StratifiedSampler,
    UniformSampler,
)
from ..samplers.base import SamplerOptions
from ._common import (
    DEFAULT_URL,
    BufferOption,
    CliError,
    CsvOption,
    DatabaseArgument,
    DbOption,
    WhereOption,
    dumps,
    number,
    open_buffer,
    render_table,
    row_json,
    rows_csv,
    summarize,
    warn_unknown_paths,
    where_condition,
)

ORDERS = ORDERABLE


def print_rows(
    rows: Sequence[DataRow], *, as_json: bool, as_csv: bool = False, title: str | None = None
) -> None:
    """Rows as a table (or JSON Lines with ``as_json``, CSV with ``as_csv``) on stdout."""
    if as_json and as_csv:
        raise CliError("give either --json or --csv, not both")
    if as_csv:
        typer.echo(rows_csv(rows), nl=False)
        return
    if as_json:
        for row in rows:
            typer.echo(dumps(row_json(row)))
        return
    if title:
        typer.echo(title)
    if not rows:
        return
    cells = []
    for row in rows:
        meta, data = row.exp_meta, row.exp_data
        content = summarize(data.state, 60)
        if data.actions not in (None, [], ()):
            content += " | " + summarize(data.actions, 40)
        cells.append(
            [
                meta.task_id,
                meta.agent_id,
                str(meta.step),
                "" if meta.policy_version is None else str(meta.policy_version),
                number(data.reward_t),
                "yes" if data.done else "",
                content,
            ]
        )
    headers = ["task_id", "agent_id", "step", "version", "reward", "done", "state / actions"]
    typer.echo(render_table(headers, cells, right=("step", "version", "reward")))


def query(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    where: WhereOption = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=0, metavar="N", help="At most N rows.")
    ] = 20,
    order: Annotated[
        str,
        typer.Option(
            "--order",
            metavar="COLUMN",
            help=f"Sort by one of {', '.join(ORDERS)} (key is insertion order); "
            "a leading - sorts newest/largest first.",
        ),
    ] = "key",
    count: Annotated[bool, typer.Option("--count", help="Print only how many rows match.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON Lines (one row per line) instead.")
    ] = False,
    as_csv: CsvOption = False,
) -> None:
    """Show the rows matching a filter.

    The filter language: comparisons (= != > >= < <=), in (...), not in (...),
    like '%x%', not like, between a and b, is null, is not null,
    changed(path) / unchanged(path) (against the previous step of the task;
    changed(path, next): the next), combined with and / or (and binds tighter)
    and parentheses. Strings take single quotes.
    Fields: task_id, agent_id, step, reward_t, done, ... and paths into the
    data such as exp_data.state.url or exp_data.actions.0.name.

    \b
    Example:
      expstore query --where "task_id = 't1' and (agent_id in ('a', 'b') or step >= 3)"
      expstore query --where "exp_data.state.url like '%login%'" --limit 5 --json
    """
    db = database or db  # a positional DATABASE wins over --db
    if order.lstrip("-") not in ORDERS:
        raise CliError(
            f"--order must be one of {', '.join(ORDERS)} (optionally with -), got {order!r}"
        )
    condition = where_condition(where)
    buf = open_buffer(db, buffer)
    try:
        total = buf.count(condition)
        if not total:
            warn_unknown_paths(buf, condition)
        if count:
            typer.echo(str(total))
            return
        rows = list(buf.query(condition, limit=limit, order_by=order))
    finally:
        buf.close()
    scope = f" where {condition}" if condition is not None else ""
    title = f"{len(rows)} of {total} matching rows{scope}"
    print_rows(rows, as_json=as_json, as_csv=as_csv, title=title)


class SamplerName(str, Enum):
    uniform = "uniform"
    recency = "recency"
    prioritized = "prioritized"
    reward = "reward"
    stratified = "stratified"
    slice = "slice"
    latest = "latest"
    task = "task"


_SAMPLERS: dict[str, Any] = {
    "uniform": UniformSampler,
    "recency": RecencySampler,
    "prioritized": PrioritizedSampler,
    "reward": RewardWeightedSampler,
    "stratified": StratifiedSampler,
    "slice": SliceSampler,
    "staleness": StalenessAwareSampler,
    "latest": LatestSampler,
    "task": RandomTaskSampler,
}
_DEFAULTS: dict[str, dict[str, Any]] = {"slice": {"slice_len": 4}}


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word: a string


def make_sampler(name: str, options: Sequence[str], seed: int | None) -> Any:
    """The sampler ``name`` built with ``key=value`` options (values read as JSON)."""
    cls = _SAMPLERS[name]
    params = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    if issubclass(cls, KeySampler):  # seed, consume_after, max_staleness
        params += list(SamplerOptions.__annotations__)
    accepted = [p for p in params if p != "seed"]
    kwargs: dict[str, Any] = dict(_DEFAULTS.get(name, {}))
    for item in options:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise CliError(f"--option takes key=value, such as power=2; got {item!r}")
        if key not in accepted:
            takes = ", ".join(accepted) if accepted else "no options"
            raise CliError(f"--option {key}: the {name} sampler takes {takes}")
        kwargs[key] = _option_value(value)
    if "seed" in params:
        kwargs["seed"] = seed
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise CliError(f"{name} sampler: {exc}") from None


def sample(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    sampler: Annotated[
        SamplerName,
        typer.Option(
            "--sampler",
            "-s",
            metavar="NAME",
            help="uniform, recency, prioritized, reward, stratified, slice, latest or task.",
        ),
    ] = SamplerName.uniform,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size", "-n", min=1, metavar="N", help="Rows (tasks for --sampler task)."
        ),
    ] = 8,
    where: WhereOption = None,
    seed: Annotated[
        int | None, typer.Option("--seed", metavar="S", help="Seed for a repeatable draw.")
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            "-o",
            metavar="KEY=VALUE",
            help="A sampler setting: power=2 (recency), temperature=0.5 (reward), "
            "alpha/beta (prioritized), by=exp_meta.task_id (stratified), slice_len=4 (slice), "
            "replacement=false (uniform).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON Lines (one row per line) instead.")
    ] = False,
    as_csv: CsvOption = False,
) -> None:
    """Draw a batch with one of the samplers, as a trainer would.

    Samplers: uniform, recency (newer rows likelier), prioritized (stored priorities),
    reward (probability grows with exp(reward_t / temperature)), stratified (equal share
    per agent), slice (runs of consecutive steps), latest (newest rows), task (whole
    tasks, each a trajectory).

    \b
    Example:
      expstore sample --sampler recency -o power=2 --batch-size 4 --seed 0
      expstore sample --sampler task -n 2 --where "agent_id = 'agent-0'"
    """
    db = database or db  # a positional DATABASE wins over --db
    condition = where_condition(where)
    chosen = make_sampler(sampler.value, option or [], seed)
    buf = open_buffer(db, buffer)
    try:
        if condition is not None and not buf.count(condition):
            warn_unknown_paths(buf, condition)
        if sampler is SamplerName.task:
            tasks = buf.sample_task(chosen, condition, batch_size=batch_size)
            rows = [row for task_rows in tasks for row in task_rows]
            title = f"{len(tasks)} tasks, {len(rows)} rows, sampled with RandomTaskSampler"
        else:
            rows = buf.sample(chosen, condition, batch_size=batch_size)
            title = f"{len(rows)} rows sampled with {type(chosen).__name__}"
    finally:
        buf.close()
    if condition is not None:
        title += f" where {condition}"
    print_rows(rows, as_json=as_json, as_csv=as_csv, title=title)
