"""``expstore ui``: serve the trajectory viewer (:mod:`expstore.ui`) on a local port."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from .._optional import require
from ._common import (
    DEFAULT_URL,
    CliError,
    DatabaseArgument,
    DbOption,
    inspect_database,
    parse_url,
    show_url,
)

__all__ = ["ui"]


def ui(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    buffer: Annotated[
        str | None,
        typer.Option("--buffer", "-b", metavar="NAME", help="Open this buffer's rows first."),
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="Address to listen on; the default lets only this machine in.",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, metavar="N")] = 8765,
    allow_delete: Annotated[
        bool,
        typer.Option(
            "--allow-delete",
            help="Let a row's page delete it (after its id is typed again); read-only without.",
        ),
    ] = False,
    live_every: Annotated[
        float,
        typer.Option("--live-every", min=0.5, metavar="S", help="Seconds between live refreshes."),
    ] = 5.0,
) -> None:
    """Look at a database in the browser: buffers, rows with --where filters,
    trajectories with their screenshots, GRPO groups, and live state.

    \b
    Example:
      expstore ui runs/agents.db --buffer rollouts
    """
    db = database or db
    url = parse_url(db)
    _, names = inspect_database(url)  # an expstore database at this revision, or an error
    if buffer is not None and buffer not in names:
        raise CliError(
            f"{show_url(url)} has no buffer named {buffer!r}; it has "
            + (", ".join(repr(n) for n in names) or "none")
        )
    uvicorn = require("uvicorn", "the viewer (expstore ui)")
    from ..ui import make_app

    app = make_app(
        url.render_as_string(hide_password=False),
        buffer=buffer,
        allow_delete=allow_delete,
        live_every=live_every,
    )
    shown = f"[{host}]" if ":" in host else host
    where = f"http://{shown}:{port}/" + (f"b/{buffer}/rows" if buffer else "")
    mode = "with deletes enabled" if allow_delete else "read-only"
    typer.echo(f"expstore ui: serving {show_url(url)} {mode} at {where}")
    if _loopback(host):
        typer.echo(f"  bound to {host}: only this machine can reach it (--host to change)")
    else:
        typer.echo(
            f"  WARNING: bound to {host}: anyone who can reach this machine on port {port} "
            "can read every row" + (" and delete rows" if allow_delete else "")
        )
    typer.echo("  press Ctrl+C to stop")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
