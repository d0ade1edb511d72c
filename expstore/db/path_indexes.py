"""Indexes on payload paths: ``buffer.create_index("exp_data.state.difficulty")``.

A condition on a path no index covers is checked row by row. Samplers mostly do not mind
(they probe candidate keys, see :mod:`expstore.storage.key_space`), but a condition few rows
meet, a query, an export or a count scans the buffer. An index on the path makes those an
index range: ``(buffer_id, <the expression conditions compare>)``, the expression being the
one :func:`expstore.query.compiler.json_value` gives, so the planner matches it
(``json_extract(data, '$."state"."difficulty"')`` on SQLite, ``(data -> 'state') ->
'difficulty'`` on Postgres). It serves equality, ``in`` and number comparisons at that path;
string ordering and LIKE on Postgres read the text and are not served.

The index is on the rows table, so it serves every buffer of the database. It lives outside
the Alembic migrations (its name starts with ``ix_expstore_rows_path_``, which the
migrations' autogenerate ignores); upgrades never touch it. On Postgres it is built
``CONCURRENTLY``: writers go on while it is built.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from sqlalchemy import Index, text
from sqlalchemy.schema import CreateIndex

from ..errors import ExpstoreError, InvalidArgumentError
from ..model.layout import COLUMNS_BY_NAME, ID_COLUMN
from ..query.compiler import json_value
from ..query.fields import resolve_field
from .handle import BufferHandle
from .schema import PATH_INDEX_PREFIX, rows

__all__ = ["create_path_index", "drop_path_index", "list_path_indexes", "path_index"]


def path_index(handle: BufferHandle, path: str) -> Index:
    """The index :func:`create_path_index` makes for ``path`` (not created)."""
    field = resolve_field(path)
    if field.column is not None:
        expression: Any = rows.c[field.column.name]
    else:
        if any(not str(step).isascii() for step in (field.top, *field.steps)):
            raise InvalidArgumentError(
                f"cannot index {path!r}: a key with non-ASCII characters is matched under two "
                "spellings, which one index cannot serve; rename the key to ASCII"
            )
        expression = json_value(field, rows, handle.dialect.name)
    digest = hashlib.sha1(field.canonical.encode()).hexdigest()[:16]
    index = Index(PATH_INDEX_PREFIX + digest, rows.c.buffer_id, expression)
    # An Index on a table's columns joins that table's metadata, where it would stay for
    # the process: in the models autogenerate compares and create_all() builds. It is
    # this database's, not the schema's: keep it out (it still compiles against rows).
    rows.indexes.discard(index)
    return index


def create_path_index(handle: BufferHandle, path: str) -> bool:
    """Create the index on ``path`` unless it exists; whether it was made now."""
    index = path_index(handle, path)
    engine = handle.connections.engine
    with handle.errors(f"create an index on {path}"):
        if handle.dialect.name == "postgresql":
            index.dialect_options["postgresql"]["concurrently"] = True
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                if _invalid(conn, index.name):
                    index.drop(conn)
                made = not _exists(conn, index.name)
                conn.execute(CreateIndex(index, if_not_exists=True))
        else:
            with handle.write() as conn:
                made = not _exists(conn, index.name)
                conn.execute(CreateIndex(index, if_not_exists=True))
    return made


#: A path's steps in an index's definition: SQLite's JSON path (``'$."state"[0]."i"'``),
#: Postgres's ``->`` operands (``-> 'state'::text``, ``-> 0``), or a column of the rows.
_SQLITE_PATH = re.compile(r"'\$((?:\.\"[^\"]*\"|\[\d+\])+)'")
_SQLITE_STEP = re.compile(r'\."([^"]*)"|\[(\d+)\]')
_PG_STEP = re.compile(r"->\s*(?:'([^']*)'|(\d+))")
_COLUMN = re.compile(r"buffer_id\s*,\s*\(?\"?(\w+)\"?\)?\s*\)\s*$")


def list_path_indexes(handle: BufferHandle) -> dict[str, str]:
    """The path indexes of the database, ``{path: index name}``, read from the catalog:
    each definition's path is read back and kept only if :func:`path_index` of it names
    that very index (so an index made another way is never misnamed)."""
    if handle.dialect.name == "sqlite":
        catalog = text("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND name LIKE :p")
    else:
        catalog = text("SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE :p")
    with handle.errors("list the path indexes"), handle.read() as conn:
        found = conn.execute(catalog, {"p": PATH_INDEX_PREFIX + "%"}).all()
    out: dict[str, str] = {}
    for name, definition in found:
        path = _path_of(str(definition or ""))
        try:
            if path is not None and path_index(handle, path).name == name:
                out[path] = str(name)
        except ExpstoreError:  # not a path this module would index
            continue
    return dict(sorted(out.items()))


def _path_of(definition: str) -> str | None:
    """The field path an index definition indexes (None: not one this module makes)."""
    if "data" in definition:
        sqlite = _SQLITE_PATH.search(definition)
        if sqlite is not None:
            steps = [key or index for key, index in _SQLITE_STEP.findall(sqlite.group(1))]
        else:
            steps = [key or index for key, index in _PG_STEP.findall(definition)]
        return ".".join(["exp_data", *steps]) if steps else None
    column = _COLUMN.search(definition)
    if column is None:
        return None
    name = column.group(1)
    if name == ID_COLUMN.name:
        return ID_COLUMN.path
    spec = COLUMNS_BY_NAME.get(name)
    return None if spec is None else spec.path


def drop_path_index(handle: BufferHandle, path: str) -> bool:
    """Drop the index on ``path``; whether there was one."""
    index = path_index(handle, path)
    with handle.errors(f"drop the index on {path}"), handle.write() as conn:
        if not _exists(conn, index.name):
            return False
        index.drop(conn)
    return True


def _exists(conn: Any, name: Any) -> bool:
    """Whether the database has an index of that name (reflection skips expression
    indexes on SQLite, so the catalog is asked)."""
    if conn.dialect.name == "sqlite":
        catalog = text("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = :name")
    else:
        catalog = text("SELECT 1 FROM pg_class WHERE relkind = 'i' AND relname = :name")
    return conn.execute(catalog, {"name": name}).first() is not None


def _invalid(conn: Any, name: Any) -> bool:
    """Whether an index of that name is left invalid by an interrupted concurrent build:
    ``checkfirst`` would keep it, and the planner never uses it."""
    catalog = text(
        "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = :name AND NOT i.indisvalid"
    )
    return conn.execute(catalog, {"name": name}).first() is not None
