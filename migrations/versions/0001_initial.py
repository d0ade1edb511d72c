"""The initial schema: buffers and rows.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BLOB = sa.LargeBinary().with_variant(postgresql.BYTEA(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "expstore_buffers",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_expstore_buffers")),
        sa.UniqueConstraint("name", name=op.f("uq_expstore_buffers_name")),
    )
    op.create_table(
        "expstore_rows",
        sa.Column("key", KEY, autoincrement=True, nullable=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("agent_id", sa.String(255), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("execute_time", sa.Double(), nullable=False),
        sa.Column("pre_agent", sa.String(255), nullable=True),
        sa.Column("reward_t", sa.Double(), nullable=True),
        sa.Column("adv_t", sa.Double(), nullable=True),
        sa.Column("v_t", sa.Double(), nullable=True),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.Column("tensors", BLOB, nullable=True),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_rows")),
        sa.ForeignKeyConstraint(
            ["buffer_id"],
            ["expstore_buffers.id"],
            name=op.f("fk_expstore_rows_buffer_id_expstore_buffers"),
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("buffer_id", "id", name=op.f("uq_expstore_rows_buffer_id_id")),
    )
    for name, cols in _INDEXES.items():
        op.create_index(op.f(name), "expstore_rows", cols)


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(op.f(name), table_name="expstore_rows")
    op.drop_table("expstore_rows")
    op.drop_table("expstore_buffers")


_INDEXES = {
    "ix_expstore_rows_buffer_id_key": ["buffer_id", "key"],
    "ix_expstore_rows_buffer_id_task_id_step": ["buffer_id", "task_id", "step"],
    "ix_expstore_rows_buffer_id_agent_id": ["buffer_id", "agent_id"],
    "ix_expstore_rows_buffer_id_reward_t": ["buffer_id", "reward_t"],
}
