"""``expstore init``, ``expstore upgrade`` and ``expstore version``: the schema's life."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from sqlalchemy.exc import SQLAlchemyError

from .._version import __version__
from ..buffer import ReplayBuffer
from ..db import migrate
from ..errors import SchemaVersionError, StorageError
from ..storage import create_sql_engine
from ._common import (
    DEFAULT_URL,
    BufferOption,
    DatabaseArgument,
    DbOption,
    JsonOption,
    check_revision,
    describe_error,
    parse_url,
    show_url,
    sqlite_path,
)


def _revision_of(db_url: str) -> str | None:
    url = parse_url(db_url)
    engine = create_sql_engine(url)
    try:
        with engine.connect() as conn:
            return migrate.current_revision(conn)
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot read {show_url(url)}: {describe_error(exc)}") from None
    finally:
        engine.dispose()


def _reachable_revision(url: Any) -> str | None:
    """The revision of the database at ``url`` if it exists and can be read, else None
    (an empty database: the SQL that creates everything)."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return None
    try:
        revision = _revision_of(url.render_as_string(hide_password=False))
    except StorageError:
        return None
    if revision is not None:
        check_revision(revision, show_url(url), allow_older=True)
    return revision


def init(
    database: DatabaseArgument = None, db: DbOption = DEFAULT_URL, buffer: BufferOption = "default"
) -> None:
    """Create the expstore tables in a database (a new SQLite file is created).

    An empty database gets the current schema and an empty buffer (--buffer, by default
    "default"); one that already has the schema is left as it is; an older one is refused
    (run `expstore upgrade`).

    \b
    Example:
      expstore init --db sqlite:///runs/buffer.db
    """
    db = database or db  # a positional DATABASE wins over --db
    url = parse_url(db)
    shown = show_url(url)
    path = sqlite_path(url)
    if path is not None and not path.parent.exists():
        raise StorageError(f"cannot create {path}: the folder {path.parent} does not exist")
    before = _revision_of(db)
    check_revision(before, shown, allow_older=True)
    # Opening the buffer creates the schema in an empty database (and the buffer).
    ReplayBuffer(url, name=buffer).close()
    head = migrate.head_revision()
    if before == head:
        typer.echo(f"{shown} already has the expstore schema (revision {head}); nothing to do")
    else:
        typer.echo(f"Created the expstore schema (revision {head}) in {shown}")


def upgrade(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL the upgrade would run; change nothing.")
    ] = False,
    revision: Annotated[
        str, typer.Option("--revision", metavar="REV", help="Upgrade up to this revision.")
    ] = "head",
    from_revision: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="REV",
            help=(
                "With --sql: the revision the database is at (default: read from the "
                "database when it can be reached, else an empty one)."
            ),
        ),
    ] = None,
) -> None:
    """Upgrade a database's expstore schema to this library's revision (Alembic).

    With --sql nothing is run: the SQL is printed, to review or to hand to a DBA.

    \b
    Example:
      expstore upgrade --db postgresql+psycopg://me@db.internal/exp
      expstore upgrade --sql --db postgresql+psycopg://me@db.internal/exp > upgrade.sql
    """
    db = database or db  # a positional DATABASE wins over --db
    url = parse_url(db)
    shown = show_url(url)
    if revision != "head" and revision not in migrate.known_revisions():
        raise SchemaVersionError(
            f"--revision: unknown revision {revision!r}; known revisions are "
            f"{', '.join(sorted(migrate.known_revisions()))} (or head)"
        )
    if sql:
        if from_revision is None:
            from_revision = _reachable_revision(url)
        target = migrate.head_revision() if revision == "head" else revision
        if from_revision == target:
            typer.echo(f"-- {shown} is at revision {target} already: nothing to upgrade")
            return
        text = migrate.upgrade_sql(
            url.render_as_string(hide_password=False), revision, from_revision=from_revision
        )
        typer.echo(text, nl=False)
        return
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise StorageError(
            f"there is no database at {path}; create one with `expstore init --db {shown}`"
        )
    before = _revision_of(db)
    check_revision(before, shown, allow_older=True)
    engine = create_sql_engine(url).execution_options(expstore_begin="IMMEDIATE")
    try:
        migrate.upgrade(engine, revision)
        with engine.connect() as conn:
            after = migrate.current_revision(conn)
    finally:
        engine.dispose()
    if before == after:
        typer.echo(f"{shown} is already at revision {after}; nothing to do")
    else:
        typer.echo(f"Upgraded {shown} from revision {before or '(empty)'} to {after}")


def version(
    database: DatabaseArgument = None,
    db: DbOption = DEFAULT_URL,
    as_json: JsonOption = False,
) -> None:
    """Show the library version, its schema revision, and the database's revision.

    \b
    Example:
      expstore version --db sqlite:///runs/buffer.db
    """
    db = database or db  # a positional DATABASE wins over --db
    head = migrate.head_revision()
    url = parse_url(db)
    shown = show_url(url)
    path = sqlite_path(url)
    current: str | None = None
    if path is not None and not path.exists():
        state = "missing"
    else:
        current = _revision_of(db)
        if current is None:
            state = "empty"
        elif current == head:
            state = "current"
        elif current in migrate.known_revisions():
            state = "older"
        else:
            state = "newer"
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "expstore": __version__,
                    "schema_head": head,
                    "database": shown,
                    "database_revision": current,
                    "database_state": state,
                }
            )
        )
        return
    notes = {
        "missing": "does not exist yet; create it with `expstore init`",
        "empty": "has no expstore tables; create them with `expstore init`",
        "current": f"at revision {current} (up to date)",
        "older": f"at revision {current}, older; run `expstore upgrade`",
        "newer": f"at revision {current}, newer than this library; upgrade expstore",
    }
    typer.echo(f"expstore {__version__} (schema revision {head})")
    typer.echo(f"database {shown}: {notes[state]}")
