"""``expstore buffers``: the buffers of a database, with their row counts and settings."""

from __future__ import annotations

import json
from typing import Any

import typer
from sqlalchemy import func, select

from ..db.engine import create_sql_engine
from ..db.schema import buffers, rows
from ._common import (
    DEFAULT_URL,
    DatabaseArgument,
    DbOption,
    JsonOption,
    inspect_database,
    parse_url,
    render_table,
    show_url,
)

__all__ = ["buffers_", "list_buffers"]


def list_buffers(db: str) -> list[dict[str, Any]]:
    """Each buffer of the database: name, rows, capacity, eviction, policy version."""
    url = parse_url(db)
    inspect_database(url)  # an expstore database at the current revision, or an error
    counts = (
        select(rows.c.buffer_id, func.count().label("rows")).group_by(rows.c.buffer_id).subquery()
    )
    stmt = (
        select(
            buffers.c.name,
            func.coalesce(counts.c.rows, 0),
            buffers.c.capacity,
            buffers.c.eviction,
            buffers.c.policy_version,
        )
        .select_from(buffers.outerjoin(counts, counts.c.buffer_id == buffers.c.id))
        .order_by(buffers.c.id)
    )
    engine = create_sql_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(stmt).all()
    finally:
        engine.dispose()
    return [
        {
            "name": name,
            "rows": int(count),
            "capacity": capacity,
            "eviction": eviction or "fifo",
            "policy_version": version,
        }
        for name, count, capacity, eviction, version in found
    ]


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
