"""Tombstones: a compact record of each row that left a buffer (issue 32, retention).

- ``expstore_tombstones``: one row per row evicted (capacity, stale) or deleted, written
  in the transaction that deleted it: when and why, and its consumption record as it was
  then, so that ``buffer.lineage(ids)`` answers ``evicted`` instead of forgetting the row.
  Keyed by ``(buffer_id, seq)``, the order tombstones were written in (clustered on
  SQLite), with a ``(buffer_id, id)`` index for lineage.
- ``expstore_buffers.keep_tombstones``: how many a buffer keeps (NULL: the default).

Nothing is rewritten: a new table and a nullable column.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("expstore_buffers", sa.Column("keep_tombstones", sa.BigInteger(), nullable=True))
    op.create_table(
        "expstore_tombstones",
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("key", sa.BigInteger(), nullable=False),
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("policy", sa.String(32), nullable=True),
        sa.Column("evicted_at", sa.Double(), nullable=False),
        sa.Column("consumer", sa.String(255), nullable=True),
        sa.Column("claimed_at", sa.Double(), nullable=True),
        sa.Column("lease_until", sa.Double(), nullable=True),
        sa.Column("acked_at", sa.Double(), nullable=True),
        sa.Column("checkpoint_seq", sa.BigInteger(), nullable=True),
        sa.Column("times_claimed", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["buffer_id"],
            ["expstore_buffers.id"],
            name=op.f("fk_expstore_tombstones_buffer_id_expstore_buffers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("buffer_id", "seq", name=op.f("pk_expstore_tombstones")),
        sqlite_with_rowid=False,
    )
    op.create_index(
        op.f("ix_expstore_tombstones_buffer_id_id"), "expstore_tombstones", ["buffer_id", "id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_expstore_tombstones_buffer_id_id"), table_name="expstore_tombstones")
    op.drop_table("expstore_tombstones")
    if op.get_bind().dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a copy
        op.execute(sa.text("ALTER TABLE expstore_buffers DROP COLUMN keep_tombstones"))
    else:
        op.drop_column("expstore_buffers", "keep_tombstones")
