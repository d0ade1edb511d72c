"""Add policy versions, content hashes and rate limits (issue: actors and learners II).

- ``expstore_rows.policy_version`` (the version of the policy that produced the row, NULL
  for rows stored before) with a ``(buffer_id, policy_version)`` index;
- ``expstore_rows.content_hash`` (a digest of the row's content, for deduplication) with a
  ``(buffer_id, content_hash)`` index; NULL for rows stored before;
- ``expstore_buffers.policy_version`` (the trainer's current version), ``.stale_after``
  (eviction "stale") and ``.inserted`` (rows ever stored, set to the rows present now);
- ``expstore_rate_limits``: a buffer's rate limit and the samples counted under it.

Plain ``ALTER TABLE ... ADD COLUMN`` on both backends (never a table copy, which on SQLite
would delete every row through the foreign keys' ON DELETE CASCADE).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("expstore_rows", sa.Column("policy_version", sa.BigInteger(), nullable=True))
    op.add_column("expstore_rows", sa.Column("content_hash", sa.String(32), nullable=True))
    op.create_index(
        op.f("ix_expstore_rows_buffer_id_policy_version"),
        "expstore_rows",
        ["buffer_id", "policy_version"],
    )
    op.create_index(
        op.f("ix_expstore_rows_buffer_id_content_hash"),
        "expstore_rows",
        ["buffer_id", "content_hash"],
    )
    op.add_column("expstore_buffers", sa.Column("policy_version", sa.BigInteger(), nullable=True))
    op.add_column("expstore_buffers", sa.Column("stale_after", sa.BigInteger(), nullable=True))
    op.add_column(
        "expstore_buffers",
        sa.Column("inserted", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.execute(
        "UPDATE expstore_buffers SET inserted = "
        "(SELECT count(*) FROM expstore_rows WHERE expstore_rows.buffer_id = expstore_buffers.id)"
    )
    op.create_table(
        "expstore_rate_limits",
        sa.Column("buffer_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("min_size", sa.BigInteger(), nullable=False),
        sa.Column("samples_per_insert", sa.Double(), nullable=False),
        sa.Column("min_diff", sa.Double(), nullable=False),
        sa.Column("max_diff", sa.Double(), nullable=False),
        sa.Column("block_writers", sa.Boolean(), nullable=False),
        sa.Column("timeout_s", sa.Double(), nullable=True),
        sa.Column("inserted_base", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("buffer_id", name=op.f("pk_expstore_rate_limits")),
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.dialect.dbapi.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            "downgrading below revision 0005 drops columns, which needs SQLite 3.35 or later "
            f"(this is {bind.dialect.dbapi.sqlite_version}); upgrade SQLite, or keep the schema"
        )
    op.drop_table("expstore_rate_limits")
    op.drop_index(op.f("ix_expstore_rows_buffer_id_content_hash"), table_name="expstore_rows")
    op.drop_index(op.f("ix_expstore_rows_buffer_id_policy_version"), table_name="expstore_rows")
    for table, column in (
        ("expstore_buffers", "inserted"),
        ("expstore_buffers", "stale_after"),
        ("expstore_buffers", "policy_version"),
        ("expstore_rows", "content_hash"),
        ("expstore_rows", "policy_version"),
    ):
        if bind.dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a table copy
            op.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        else:
            op.drop_column(table, column)
