"""``expstore buffers``: the buffers of a database, with their row counts and settings."""

from __future__ import annotations

import json
from typing import Any

import typer

from ._common import (
    DEFAULT_URL,
    DatabaseArgument,
    DbOption,
    JsonOption,
    inspect_database,
    parse_url,
    read_database,
    render_table,
    show_url,
)

__all__ = ["buffers_", "list_buffers"]


def list_buffers(db: str) -> list[dict[str, Any]]:
    """Each buffer of the database: name, rows, capacity, eviction, policy version."""
    url = parse_url(db)
    inspect_database(url)  # an expstore database at the current revision, or an error
    _, found = read_database(url)
    return [info._asdict() for info in found or []]


def buffers_(
    database: DatabaseArgument = None, db: DbOption = DEFAULT_URL, as_json: JsonOption = False
) -> None:
    """List the buffers of a database with their row counts.

    \b
    Example:
      expstore buffers --db runs/agents.db
    """
    db = database or db  # a positional DATABASE wins over --db
    listed = list_buffers(db)
    if as_json:
        typer.echo(json.dumps({"database": show_url(parse_url(db)), "buffers": listed}))
        return
    if not listed:
        typer.echo(f"{show_url(parse_url(db))} holds no buffer yet")
        return
    cells = [
        [
            b["name"],
            str(b["rows"]),
            "unlimited" if b["capacity"] is None else str(b["capacity"]),
            b["eviction"],
            "" if b["policy_version"] is None else str(b["policy_version"]),
        ]
        for b in listed
    ]
    headers = ["buffer", "rows", "capacity", "eviction", "version"]
    typer.echo(render_table(headers, cells, right=("rows", "capacity", "version")))
