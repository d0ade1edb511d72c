"""Prompt queues (issue: durable actors): completion targets, admission, acked counts.

- ``expstore_targets``: ``(key, buffer_id, target, done)``, a prompt row's completion
  target (``store_prompts(rows, n_samples=G)``) and how many completions acks stored for it
  so far; the row stays claimable until ``done`` reaches ``target``. Goes with its row (a
  foreign key to ``expstore_rows.key``, ON DELETE CASCADE).
- ``expstore_produced``: ``(key, buffer_id, claim_id, consumer, prompt_buffer_id,
  prompt_key, prompt_id, produced_at)``: which prompt claim (and actor) produced a row
  stored by ``claim.ack(produce=rows, into=buffer)``; goes with the produced row.
- ``expstore_admission``: one row per prompt buffer with an admission bound
  (``set_admission``): the buffer its completions go to, the learner's batch, the
  staleness, the backlog bound and the default wait.
- ``expstore_consumers.acked``: how many rows each consumer ever acked, filled here from
  the acks already recorded in ``expstore_consumption``.

- ``expstore_rows.oldest_version`` and ``newest_version``: the policy versions of the
  first and last segments of a row generated over several (NULL for the rows before).

New tables and columns: nothing stored is rewritten.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "expstore_targets",
        sa.Column("key", _KEY, nullable=False, autoincrement=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_targets_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_targets")),
    )
    op.create_index(
        op.f("ix_expstore_targets_buffer_id"), "expstore_targets", ["buffer_id"], unique=False
    )
    op.create_table(
        "expstore_produced",
        sa.Column("key", _KEY, nullable=False, autoincrement=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("claim_id", sa.String(32), nullable=False),
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("prompt_buffer_id", sa.Integer(), nullable=False),
        sa.Column("prompt_key", sa.BigInteger(), nullable=True),
        sa.Column("prompt_id", sa.Text(), nullable=True),
        sa.Column("produced_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_produced_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_produced")),
    )
    op.create_table(
        "expstore_admission",
        sa.Column("buffer_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("into_id", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.BigInteger(), nullable=True),
        sa.Column("max_staleness", sa.BigInteger(), nullable=True),
        sa.Column("max_backlog", sa.BigInteger(), nullable=True),
        sa.Column("timeout_s", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("buffer_id", name=op.f("pk_expstore_admission")),
    )
    with op.batch_alter_table("expstore_consumers") as batch:
        batch.add_column(sa.Column("acked", sa.BigInteger(), server_default="0", nullable=False))
    # Plain ADD COLUMN (nullable, no default) on both backends: no copy of the rows.
    op.add_column("expstore_rows", sa.Column("oldest_version", sa.BigInteger(), nullable=True))
    op.add_column("expstore_rows", sa.Column("newest_version", sa.BigInteger(), nullable=True))
    consumers = sa.table(
        "expstore_consumers",
        sa.column("buffer_id", sa.Integer()),
        sa.column("consumer", sa.String()),
        sa.column("acked", sa.BigInteger()),
    )
    consumption = sa.table(
        "expstore_consumption",
        sa.column("buffer_id", sa.Integer()),
        sa.column("consumer", sa.String()),
        sa.column("acked_at", sa.Double()),
    )
    counted = (
        sa.select(sa.func.count())
        .where(
            consumption.c.buffer_id == consumers.c.buffer_id,
            consumption.c.consumer == consumers.c.consumer,
            consumption.c.acked_at.is_not(None),
        )
        .scalar_subquery()
    )
    op.execute(consumers.update().values(acked=counted))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35 and later): a batch copy of expstore_rows would drop
    # the old table, and its foreign keys would take every row's entries with it.
    op.drop_column("expstore_rows", "newest_version")
    op.drop_column("expstore_rows", "oldest_version")
    with op.batch_alter_table("expstore_consumers") as batch:
        batch.drop_column("acked")
    op.drop_table("expstore_admission")
    op.drop_table("expstore_produced")
    op.drop_table("expstore_targets")
