"""``expstore ui``: serve the trajectory viewer (:mod:`expstore.ui`) on a local port."""

from __future__ import annotations

import errno
import ipaddress
import socket
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
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            metavar="NAME",
            help="A host name (or NAME:PORT) browsers may reach the viewer by, besides "
            "localhost, 127.0.0.1, [::1] and --host; repeat for more. Every other Host "
            "header is refused (DNS rebinding).",
        ),
    ] = None,
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

    \b
    The viewer answers only to the names it is reached by: localhost, 127.0.0.1 and [::1]
    on its port, and the --host address. Bound to every address (--host 0.0.0.0), name
    the ones other machines use:
      expstore ui runs/agents.db --host 0.0.0.0 --allow-host gpu-box --allow-host 10.0.0.7
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
    from ..ui import LOOPBACK_HOSTS, make_app

    listening = _bind(host, port)  # before saying "serving": a port in use is said once
    port = listening.getsockname()[1]
    # The names it answers to: the loopback names, the bound address unless it is every
    # address, and --allow-host's, each on the viewer's port unless it gives its own.
    bound = [] if host in ("0.0.0.0", "::", "") else [host]
    app = make_app(
        url.render_as_string(hide_password=False),
        buffer=buffer,
        allow_delete=allow_delete,
        live_every=live_every,
        hosts=[*LOOPBACK_HOSTS, *bound, *(allow_host or [])],
        port=port,
    )
    shown = f"[{host}]" if ":" in host else host
    where = f"http://{shown}:{port}/" + (f"b/{_segment(buffer)}/rows" if buffer else "")
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
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[listening])


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; CliError when the address can't be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except (OSError, OverflowError) as exc:
        sock.close()
        reason = getattr(exc, "strerror", None) or str(exc)
        hint = (
            "another program (or another expstore ui) is using it: choose another with --port"
            if getattr(exc, "errno", None) == errno.EADDRINUSE
            else "choose another --host or --port"
        )
        raise CliError(f"cannot listen on {host}:{port}: {reason}; {hint}") from None
    sock.set_inheritable(True)
    return sock


def _segment(buffer: str) -> str:
    from ..ui import buffer_segment

    return buffer_segment(buffer)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
