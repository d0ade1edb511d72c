"""Add claims: expstore_consumption (which rows are claimed, by whom, until when, acked
with which checkpoint), expstore_checkpoints (every checkpoint a consumer acked with),
expstore_consumers (each consumer's last checkpoint number) and expstore_sample_counts
(how many times samplers with consume_after drew each row). New tables only; the rows
table is not touched. buffer_id has no foreign key here: checking one would lock the
buffer's row, which every write holds, so claims and acks would wait for writers.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "expstore_consumption",
        sa.Column("key", _KEY, autoincrement=False, nullable=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("claim_id", sa.String(32), nullable=True),
        sa.Column("consumer", sa.String(255), nullable=True),
        sa.Column("claimed_at", sa.Double(), nullable=True),
        sa.Column("lease_until", sa.Double(), nullable=True),
        sa.Column("acked_at", sa.Double(), nullable=True),
        sa.Column("checkpoint_seq", sa.BigInteger(), nullable=True),
        sa.Column("times_claimed", sa.Integer(), nullable=False, server_default="0"),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_consumption_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_consumption")),
    )
    op.create_index(
        op.f("ix_expstore_consumption_buffer_id_acked_at_lease_until"),
        "expstore_consumption",
        ["buffer_id", "acked_at", "lease_until"],
    )
    op.create_index(op.f("ix_expstore_consumption_claim_id"), "expstore_consumption", ["claim_id"])
    op.create_table(
        "expstore_checkpoints",
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("state", _JSON, nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint(
            "buffer_id", "consumer", "seq", name=op.f("pk_expstore_checkpoints")
        ),
    )
    op.create_table(
        "expstore_consumers",
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("buffer_id", "consumer", name=op.f("pk_expstore_consumers")),
    )
    op.create_table(
        "expstore_sample_counts",
        sa.Column("key", _KEY, autoincrement=False, nullable=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("times_sampled", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_sample_counts_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_sample_counts")),
    )


def downgrade() -> None:
    op.drop_table("expstore_sample_counts")
    op.drop_table("expstore_consumers")
    op.drop_table("expstore_checkpoints")
    op.drop_index(op.f("ix_expstore_consumption_claim_id"), table_name="expstore_consumption")
    op.drop_index(
        op.f("ix_expstore_consumption_buffer_id_acked_at_lease_until"),
        table_name="expstore_consumption",
    )
    op.drop_table("expstore_consumption")
