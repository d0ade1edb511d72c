"""Schema migrations: create, check and upgrade a database with the Alembic scripts.

The scripts live in ``migrations/`` at the top of the repository and ship inside the wheel as
``expstore/_migrations``, so an installed expstore can create and upgrade databases.

Opening a store calls :func:`ensure_schema`: an empty database is created at the head
revision; an older one raises :class:`SchemaVersionError` naming the command that upgrades it
(or is upgraded when asked); a newer one raises without writing anything.
"""

from __future__ import annotations

import io
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, inspect, text

from ..errors import SchemaVersionError
from .schema import VERSION_TABLE, compared, metadata

__all__ = [
    "current_revision",
    "downgrade",
    "ensure_schema",
    "head_revision",
    "known_revisions",
    "script_location",
    "upgrade",
    "upgrade_sql",
]

# An arbitrary constant: the key of the Postgres advisory lock that serialises migrations.
_PG_LOCK_KEY = 0x65787073  # "exps"

#: Alembic runs env.py through process-wide state (``alembic.context``), so two threads
#: migrating at once, even different databases, would cross-wire each other's
#: configuration: one Alembic command at a time in this process (taken before the
#: database's own lock, always in that order).
_ALEMBIC = threading.Lock()


def script_location() -> Path:
    """The folder holding env.py and versions/: inside the package when installed."""
    here = Path(__file__).resolve().parent.parent  # the package: expstore/db/ -> expstore/
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise SchemaVersionError(
        f"expstore's migration scripts are missing (looked in {here / '_migrations'} and "
        f"{here.parent / 'migrations'}); reinstall expstore"
    )


def _config(connection: Connection | None = None, url: str | None = None) -> Config:
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(script_location()))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    """The schema revision this library writes and expects."""
    head = _scripts().get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in _scripts().walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The revision a database is at, or None when expstore never touched it;
    SchemaVersionError (with the repair) when its version table holds several."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    try:
        return context.get_current_revision()
    except CommandError:
        found = sorted(
            connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
        )
        known = [r for r in found if r in known_revisions()]
        keep = max(known) if known else head_revision()
        raise SchemaVersionError(
            f"the schema version table {VERSION_TABLE} holds {len(found)} revisions "
            f"({', '.join(map(repr, found))}) where it must hold one; nothing was written. "
            f"If the schema is at {keep!r}, keep only that one: DELETE FROM {VERSION_TABLE} "
            f"WHERE version_num <> '{keep}'"
        ) from None


def _lock(connection: Connection) -> None:
    """Serialise schema changes between processes for the rest of this transaction."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
    # SQLite: the write engine begins transactions with BEGIN IMMEDIATE, which takes the
    # database's write lock up front.


def _check(revision: str | None, url: str, *, upgrade: bool) -> bool:
    """True when the schema must be created or upgraded; raises when it must not be."""
    head = head_revision()
    if revision == head:
        return False
    if revision is None:
        return True
    if revision not in known_revisions():
        raise SchemaVersionError(
            f"the database {url} has schema revision {revision!r}, newer than this expstore "
            f"(which knows up to {head!r}); nothing was written. Upgrade expstore "
            "(pip install -U expstore) to open it"
        )
    if not upgrade:
        raise SchemaVersionError(
            f"the database {url} has schema revision {revision!r}, older than this expstore's "
            f"{head!r}. Upgrade it with `expstore upgrade --db {url}` or open it with "
            "ReplayBuffer(url, upgrade=True)"
        )
    return True


def ensure_schema(engine: Engine, write_engine: Engine, *, upgrade: bool = False) -> None:
    """Create the schema in an empty database; check (or upgrade) an existing one.

    ``engine`` reads; ``write_engine`` must begin transactions that lock (see SqlStorage).
    """
    url = engine.url.render_as_string(hide_password=True)
    with engine.connect() as conn:  # a cheap read first: most opens find the head revision
        if not _check(current_revision(conn), url, upgrade=upgrade):
            return
    with _ALEMBIC, write_engine.begin() as conn:
        _lock(conn)
        revision = current_revision(conn)
        if revision is None and _expstore_tables(conn):
            _repair(conn, url)
        elif _check(revision, url, upgrade=upgrade):
            command.upgrade(_config(conn), "head")


def _expstore_tables(conn: Connection) -> set[str]:
    names = set(inspect(conn).get_table_names())
    return {t for t in metadata.tables if t in names}


def _repair(conn: Connection, url: str) -> None:
    """A database with expstore's tables but no schema revision: its creation was cut off
    (by an older expstore whose threads cross-wired Alembic, or by hand). If what is there
    is part of the head schema, create the rest and record the revision; otherwise say so
    and change nothing."""
    context = MigrationContext.configure(
        conn,
        opts={
            "compare_type": True,
            "version_table": VERSION_TABLE,
            "include_name": lambda name, kind, _parent: (
                kind != "table" or (name or "").startswith("expstore_")
            ),
            "include_object": compared(conn.dialect.name),
        },
    )
    differences = compare_metadata(context, metadata)
    unexpected = [d for d in differences if not _is_missing(d)]
    if unexpected:
        raise SchemaVersionError(
            f"the database {url} holds expstore tables but no schema revision, and they "
            f"differ from this expstore's schema (revision {head_revision()}): "
            f"{_describe(unexpected)}. Nothing was changed; open it with the expstore that "
            "made it, or move it aside and let expstore create a new one"
        )
    metadata.create_all(conn, checkfirst=True)
    command.stamp(_config(conn), "head")


def _is_missing(difference: Any) -> bool:
    """A table or index of the head schema that is not there yet (creating it repairs)."""
    return isinstance(difference, tuple) and difference[0] in ("add_table", "add_index")


def _describe(differences: list[Any]) -> str:
    shown = []
    for difference in differences[:3]:
        first = difference[0] if isinstance(difference, list) else difference
        kind, *about = first
        names = [str(getattr(part, "name", part)) for part in about[:3] if part is not None]
        shown.append(" ".join([kind, *names]))
    more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
    return "; ".join(shown) + more


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade (or create) the schema up to ``revision``."""
    with _ALEMBIC, engine.begin() as conn:
        _lock(conn)
        command.upgrade(_config(conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``"base"`` drops every expstore table)."""
    with _ALEMBIC, engine.begin() as conn:
        _lock(conn)
        command.downgrade(_config(conn), revision)


def upgrade_sql(url: str, revision: str = "head", *, from_revision: str | None = None) -> str:
    """The SQL that upgrading would run (Alembic's offline mode), without running it."""
    cfg = _config(url=url)
    out = io.StringIO()
    cfg.stdout = out
    cfg.output_buffer = out
    target = f"{from_revision}:{revision}" if from_revision else revision
    with _ALEMBIC:
        command.upgrade(cfg, target, sql=True)
    return out.getvalue()
