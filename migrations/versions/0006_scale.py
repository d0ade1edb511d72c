"""Keep each buffer's row count and index priorities (issue: Scale I).

- ``expstore_buffers.row_count``: the rows a buffer holds, kept by every write, delete and
  eviction in its transaction; filled with the rows present on upgrade;
- a ``(buffer_id, priority)`` index on ``expstore_rows``: the smallest and largest priority
  of a buffer in two index probes.

Plain ``ALTER TABLE ... ADD COLUMN`` on both backends (never a table copy, which on SQLite
would delete every row through the foreign keys' ON DELETE CASCADE).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "expstore_buffers",
        sa.Column("row_count", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.execute(
        "UPDATE expstore_buffers SET row_count = "
        "(SELECT count(*) FROM expstore_rows WHERE expstore_rows.buffer_id = expstore_buffers.id)"
    )
    op.create_index(
        op.f("ix_expstore_rows_buffer_id_priority"), "expstore_rows", ["buffer_id", "priority"]
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.dialect.dbapi.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            "downgrading below revision 0006 drops a column, which needs SQLite 3.35 or later "
            f"(this is {bind.dialect.dbapi.sqlite_version}); upgrade SQLite, or keep the schema"
        )
    op.drop_index(op.f("ix_expstore_rows_buffer_id_priority"), table_name="expstore_rows")
    if bind.dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a table copy
        op.execute(sa.text("ALTER TABLE expstore_buffers DROP COLUMN row_count"))
    else:
        op.drop_column("expstore_buffers", "row_count")
