"""The ``expstore`` command: a thin layer over the library, one module per command group.

- :mod:`.schema`: ``init``, ``upgrade``, ``version``
- :mod:`.buffers`: ``buffers``
- :mod:`.stats`: ``stats``
- :mod:`.rows`: ``query``, ``sample``
- :mod:`.manage`: ``delete``, ``retention``
- :mod:`.transfer`: ``export``, ``import``
- :mod:`.ui`: ``ui`` (the trajectory viewer)
- :mod:`.demo`: ``demo``
- :mod:`.where`: the ``--where`` filter language

The database comes from ``--db URL``, else ``EXPSTORE_URL``, else ``sqlite:///expstore.db``.
"""

from __future__ import annotations

import typer

from .._version import __version__
from ..db import migrate
from . import buffers, demo, manage, rows, schema, stats, transfer, ui
from ._common import ExpstoreGroup

__all__ = ["app", "main"]

app = typer.Typer(
    name="expstore",
    cls=ExpstoreGroup,
    help=(
        "Look into, move and sample an expstore experience buffer (SQLite or PostgreSQL).\n\n"
        "The database comes from --db URL, else the EXPSTORE_URL variable, else "
        "sqlite:///expstore.db in the current folder.\n\n"
        "\b\nExample:\n  expstore demo\n  expstore stats --db sqlite:///expstore-demo/demo.db "
        "--buffer demo --by agent"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"expstore {__version__} (schema revision {migrate.head_revision()})")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,
        help="Show the version and schema revision, and exit.",
    ),
) -> None:
    """The options every command shares."""


app.command("demo")(demo.demo)
app.command("init")(schema.init)
app.command("upgrade")(schema.upgrade)
app.command("version")(schema.version)
app.command("buffers")(buffers.buffers_)
app.command("stats")(stats.stats)
app.command("query")(rows.query)
app.command("sample")(rows.sample)
app.command("delete")(manage.delete)
app.command("retention")(manage.retention)
app.command("summary")(manage.summary)
app.command("export")(transfer.export)
app.command("import")(transfer.import_)
app.command("ui")(ui.ui)


def main() -> None:
    """The console script's entry point."""
    app(prog_name="expstore")
