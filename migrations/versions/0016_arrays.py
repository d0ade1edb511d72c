"""Arrays stored once, compressed (issue 34).

- ``expstore_arrays``: ``(buffer_id, digest, nbytes, data)``, each array of at least the
  codec's threshold stored once per buffer by its digest, compressed (see
  ``expstore.codec.compression``); on Postgres ``data`` is STORAGE EXTERNAL (TOAST moves
  it out of line without compressing bytes that are compressed already).
- ``expstore_array_refs``: ``(key, digest, buffer_id)``, which row refers to which array
  (a foreign key to ``expstore_rows.key``, ON DELETE CASCADE), with an index on
  ``(buffer_id, digest)``.
- ``expstore_buffers.compression`` and ``max_array_bytes``: the buffer's setting (NULL:
  the defaults).

New tables and nullable columns only: nothing stored is rewritten, and rows written before
(every array in their blob) stay readable as they are. A downgrade drops the tables: arrays
stored by digest go with them (export the buffer first to keep them).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_BLOB = sa.LargeBinary().with_variant(postgresql.BYTEA(), "postgresql")


def upgrade() -> None:
    op.add_column("expstore_buffers", sa.Column("compression", sa.String(16), nullable=True))
    op.add_column("expstore_buffers", sa.Column("max_array_bytes", sa.BigInteger(), nullable=True))
    op.create_table(
        "expstore_arrays",
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.Column("nbytes", sa.BigInteger(), nullable=False),
        sa.Column("data", _BLOB, nullable=False),
        sa.ForeignKeyConstraint(
            ["buffer_id"],
            ["expstore_buffers.id"],
            name=op.f("fk_expstore_arrays_buffer_id_expstore_buffers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("buffer_id", "digest", name=op.f("pk_expstore_arrays")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE expstore_arrays ALTER COLUMN data SET STORAGE EXTERNAL")
    op.create_table(
        "expstore_array_refs",
        sa.Column("key", _KEY, nullable=False, autoincrement=False),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_array_refs_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", "digest", name=op.f("pk_expstore_array_refs")),
    )
    op.create_index(
        op.f("ix_expstore_array_refs_buffer_id_digest"),
        "expstore_array_refs",
        ["buffer_id", "digest"],
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.dialect.dbapi.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            "downgrading below revision 0016 drops columns of expstore_buffers, which needs "
            f"SQLite 3.35 or later (this is {bind.dialect.dbapi.sqlite_version}); upgrade "
            "SQLite, or keep the schema"
        )
    op.drop_index(op.f("ix_expstore_array_refs_buffer_id_digest"), table_name="expstore_array_refs")
    op.drop_table("expstore_array_refs")
    op.drop_table("expstore_arrays")
    for column in ("max_array_bytes", "compression"):
        if bind.dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a table copy
            op.execute(sa.text(f"ALTER TABLE expstore_buffers DROP COLUMN {column}"))
        else:
            op.drop_column("expstore_buffers", column)
