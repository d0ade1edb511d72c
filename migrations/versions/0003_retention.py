"""Add expstore_buffers.capacity and .eviction, a buffer's retention, kept with the buffer so
that every handle and process that writes to it evicts alike; and expstore_priority_log with
expstore_buffers.priority_version, the recent priority updates, so other processes bring
their cached priorities up to date without reading every row again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE ... ADD COLUMN on both backends. (A batch-mode copy of the table would
    # drop the old one, and on SQLite with foreign keys on that deletes every row through
    # expstore_rows' ON DELETE CASCADE.)
    op.add_column("expstore_buffers", sa.Column("capacity", sa.BigInteger(), nullable=True))
    op.add_column("expstore_buffers", sa.Column("eviction", sa.String(32), nullable=True))
    op.add_column(
        "expstore_buffers",
        sa.Column("priority_version", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_table(
        "expstore_priority_log",
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.BigInteger(), nullable=False),
        sa.Column("priority", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["buffer_id"],
            ["expstore_buffers.id"],
            name=op.f("fk_expstore_priority_log_buffer_id_expstore_buffers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("buffer_id", "seq", "key", name=op.f("pk_expstore_priority_log")),
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.dialect.dbapi.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            "downgrading below revision 0003 drops columns of expstore_buffers, which needs "
            "SQLite 3.35 or later (this is "
            f"{bind.dialect.dbapi.sqlite_version}); upgrade SQLite, or keep the schema"
        )
    op.drop_table("expstore_priority_log")
    for column in ("priority_version", "eviction", "capacity"):
        if bind.dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a table copy
            op.execute(sa.text(f"ALTER TABLE expstore_buffers DROP COLUMN {column}"))
        else:
            op.drop_column("expstore_buffers", column)
