"""Per-task summaries and the largest row key ever handed out (issue: Scale I).

- ``expstore_task_stats``: one row per task of a buffer that keeps summaries
  (``buffer.create_summary()``), which ``expstore stats`` reads instead of every row;
- ``expstore_buffers.summary_from`` / ``summary_through``: whether a buffer keeps them and
  how far they are built (NULL: none kept, as for every buffer on upgrade);
- ``expstore_counters``: ``row_key``, the largest key ever given to a row, set on upgrade to
  the largest key present; SQLite writers take new keys above it, so a deleted newest row's
  key is never handed out again.

Plain ``ALTER TABLE ... ADD COLUMN`` on both backends (never a table copy).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("expstore_buffers", sa.Column("summary_from", sa.BigInteger(), nullable=True))
    op.add_column("expstore_buffers", sa.Column("summary_through", sa.BigInteger(), nullable=True))
    op.create_table(
        "expstore_task_stats",
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=255), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("reward_count", sa.BigInteger(), nullable=False),
        sa.Column("reward_sum", sa.Double(), nullable=False),
        sa.Column("reward_sumsq", sa.Double(), nullable=False),
        sa.Column("reward_min", sa.Double(), nullable=True),
        sa.Column("reward_max", sa.Double(), nullable=True),
        sa.Column("time_min", sa.Double(), nullable=False),
        sa.Column("time_max", sa.Double(), nullable=False),
        sa.Column("version_count", sa.BigInteger(), nullable=False),
        sa.Column("version_base", sa.BigInteger(), nullable=True),
        sa.Column("version_sum", sa.Double(), nullable=False),
        sa.Column("version_sumsq", sa.Double(), nullable=False),
        sa.Column("version_min", sa.BigInteger(), nullable=True),
        sa.Column("version_max", sa.BigInteger(), nullable=True),
        sa.Column("last_key", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("last_reward", sa.Double(), nullable=True),
        sa.Column("dirty", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(
            ["buffer_id"],
            ["expstore_buffers.id"],
            name=op.f("fk_expstore_task_stats_buffer_id_expstore_buffers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("buffer_id", "task_id", name=op.f("pk_expstore_task_stats")),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_expstore_task_stats_dirty",
        "expstore_task_stats",
        ["buffer_id", "dirty", "task_id"],
        sqlite_where=sa.text("dirty = 1"),  # as SQLite's queries spell it
        postgresql_where=sa.text("dirty"),
    )
    op.create_table(
        "expstore_counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_expstore_counters")),
    )
    op.execute(
        "INSERT INTO expstore_counters (name, value) "
        "SELECT 'row_key', coalesce(max(key), 0) FROM expstore_rows"
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.dialect.dbapi.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            "downgrading below revision 0007 drops columns, which needs SQLite 3.35 or later "
            f"(this is {bind.dialect.dbapi.sqlite_version}); upgrade SQLite, or keep the schema"
        )
    op.drop_table("expstore_counters")
    op.drop_table("expstore_task_stats")
    for column in ("summary_through", "summary_from"):
        if bind.dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a table copy
            op.execute(sa.text(f"ALTER TABLE expstore_buffers DROP COLUMN {column}"))
        else:
            op.drop_column("expstore_buffers", column)
