"""``expstore delete`` and ``expstore retention``: change what a buffer holds, after
saying what will go and asking (``--yes`` to skip the question, as scripts need);
``expstore summary``: whether a buffer keeps per-task summaries for ``stats``."""

from __future__ import annotations

import sys
from typing import Annotated, cast

import typer

from ..retention.eviction import Eviction
from ._common import (
    DEFAULT_URL,
    BufferOption,
    CliError,
    DatabaseArgument,
    DbOption,
    WhereOption,
    open_buffer,
    progress,
    show_url,
    where_condition,
)

__all__ = ["delete", "retention", "summary"]

YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do it without asking (for scripts).")]


def _confirm(question: str, yes: bool) -> None:
    """Ask ``question`` unless ``yes``; without a terminal to ask on, ask for --yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"{question} Nobody can answer here: add --yes to go ahead")
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)


def delete(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    where: WhereOption = None,
    yes: YesOption = False,
) -> None:
    """Delete the rows matching --where (required) from a buffer.

    \b
    Example:
      expstore delete --db runs/agents.db --where "reward_t < 0 and step > 40" --yes
    """
    db = database or db  # a positional DATABASE wins over --db
    if where is None:
        raise CliError('delete needs --where; to empty a buffer use --where "step >= 0"')
    condition = where_condition(where)
    with open_buffer(db, buffer) as store:
        matching = store.count(condition)
        if not matching:
            typer.echo(f"No row of buffer {buffer!r} matches {condition}; nothing deleted")
            return
        _confirm(
            f"Delete {matching} of {len(store)} rows of buffer {buffer!r} in "
            f"{show_url(store.storage.url)} where {condition}?",
            yes,
        )
        gone = store.delete(condition)
        typer.echo(f"Deleted {gone} rows; buffer {buffer!r} now holds {len(store)}")


def retention(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    capacity: Annotated[
        int | None,
        typer.Option("--capacity", min=1, metavar="N", help="Keep at most N rows."),
    ] = None,
    unlimited: Annotated[
        bool, typer.Option("--unlimited", help="Keep every row (no capacity).")
    ] = False,
    eviction: Annotated[
        str | None,
        typer.Option(
            "--eviction",
            metavar="POLICY",
            help="Which rows go beyond the capacity: fifo, max_reward, task_fifo or stale.",
        ),
    ] = None,
    stale_after: Annotated[
        int | None,
        typer.Option(
            "--stale-after",
            min=0,
            metavar="K",
            help="For --eviction stale: rows more than K policy versions behind go.",
        ),
    ] = None,
    yes: YesOption = False,
) -> None:
    """Show or change a buffer's retention (capacity and eviction), for every writer.

    Without options it shows the retention. Rows beyond a new capacity go at once, after
    a confirmation.

    \b
    Example:
      expstore retention --db runs/agents.db --capacity 100000 --eviction fifo --yes
    """
    db = database or db  # a positional DATABASE wins over --db
    if capacity is not None and unlimited:
        raise CliError("give either --capacity N or --unlimited, not both")
    with open_buffer(db, buffer) as store:
        held = len(store)
        kept = store.retention()
        current = f"capacity {kept.capacity or 'unlimited'}, eviction {kept.eviction}"
        if kept.eviction == "stale":
            current += f" (stale after {kept.stale_after} versions)"
        if capacity is None and not unlimited and eviction is None and stale_after is None:
            typer.echo(f"buffer {buffer!r} holds {held} rows; {current}")
            return
        new_capacity = None if unlimited else (capacity or kept.capacity)
        if new_capacity is not None and held > new_capacity or eviction == "stale":
            _confirm(
                f"Buffer {buffer!r} holds {held} rows; with capacity "
                f"{new_capacity or 'unlimited'} and eviction {eviction or kept.eviction}, "
                "rows beyond it go now. Go ahead?",
                yes,
            )
        # A name set_retention checks (an unknown policy is refused there, saying which exist).
        policy = cast("Eviction | None", eviction)
        gone = store.set_retention(new_capacity, policy, stale_after=stale_after)
        typer.echo(
            f"buffer {buffer!r}: capacity {new_capacity or 'unlimited'}, eviction "
            f"{store.retention().eviction}; {gone} rows went, {len(store)} remain"
        )


def summary(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: BufferOption = "default",
    create: Annotated[
        bool, typer.Option("--create", help="Keep them from now on (built for the rows held).")
    ] = False,
    drop: Annotated[bool, typer.Option("--drop", help="Stop keeping them.")] = False,
) -> None:
    """Show, create or drop a buffer's per-task summaries.

    A buffer that keeps them has a row per task, updated by every write and delete, which
    `expstore stats` reads instead of every row (seconds instead of minutes at 10M rows);
    each write costs a little more. Without options it says whether the buffer keeps them.

    \b
    Example:
      expstore summary --db runs/agents.db --create
    """
    db = database or db  # a positional DATABASE wins over --db
    if create and drop:
        raise CliError("give either --create or --drop, not both")
    with open_buffer(db, buffer) as store:
        sql = store.sql
        if create:
            with progress(len(store), "summarising tasks") as advance:
                store.create_summary(progress=advance)
        elif drop:
            dropped = store.drop_summary()
            typer.echo(
                f"buffer {buffer!r}: task summaries dropped"
                if dropped
                else f"buffer {buffer!r} kept no task summaries; nothing to drop"
            )
            return
        state = sql.summary_state()
        if state is None:
            typer.echo(
                f"buffer {buffer!r} keeps no task summaries: `expstore stats` reads every row. "
                "`expstore summary --create` keeps them"
            )
            return
        tasks = sql.summary_tasks()
        shown = "built" if state.built else "being built (`expstore summary --create` goes on)"
        typer.echo(
            f"buffer {buffer!r} keeps task summaries ({tasks} tasks, {len(store)} rows; "
            f"{shown}); `expstore stats` reads them"
        )
