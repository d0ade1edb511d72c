"""Saved progress of claimed rows (issue: durable actors).

- ``expstore_progress``: ``(key, buffer_id, claim_id, state, saved_at)``, an actor's
  partial rollout on a prompt it holds (``claim.save_progress(state)``), read by whoever
  claims the prompt next (``claim.progress``); removed by the ack, and with its row
  (a foreign key to ``expstore_rows.key``, ON DELETE CASCADE).

A new table only: nothing stored is rewritten.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "expstore_progress",
        sa.Column("key", _KEY, nullable=False, autoincrement=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("claim_id", sa.String(32), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("saved_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_progress_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_progress")),
    )


def downgrade() -> None:
    op.drop_table("expstore_progress")
