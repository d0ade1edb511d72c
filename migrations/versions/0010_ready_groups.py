"""The ready-group index of group claims (issue: GRPO in production).

A group claim summarised every group of the buffer (consumed ones too) to find the ready
ones, so its cost grew with the whole history: 52 ms at 10k rows, 481 ms at 100k on
SQLite, and on Postgres a plan that hinged on a manual ``ANALYZE``. Now claims keep an
index of their own, brought up to date in their transactions from the rows written since:

- ``expstore_group_specs``: one row per (buffer, condition, group spec, staleness) claimed
  by, with how far it has followed the buffer and how many groups it left out for good;
- ``expstore_ready_groups``: its groups not consumed yet (ready, or waiting for rows),
  each going at the ack of its claim, when it goes stale, or when its rows go;
- ``expstore_discarded`` and ``expstore_discard_counts``: the rows such an index found can
  never be drawn, each counted once as discarded by the rate limit, in a counter row of
  its own (a claim never locks the buffer's row).

New tables only: nothing stored is rewritten; an index is built by the first group claim
that needs it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "expstore_group_specs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("scanned_to", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("seen_version", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("oldest", sa.BigInteger(), nullable=True),
        sa.Column("filtered", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("stale", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_expstore_group_specs")),
        sa.UniqueConstraint(
            "buffer_id", "digest", name=op.f("uq_expstore_group_specs_buffer_id_digest")
        ),
    )
    op.create_table(
        "expstore_ready_groups",
        sa.Column("spec_id", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("first_key", _KEY, nullable=False, autoincrement=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=True),
        sa.Column("keys", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("spec_id", "first_key", name=op.f("pk_expstore_ready_groups")),
    )
    op.create_index(
        op.f("ix_expstore_ready_groups_spec_id_ready_first_key"),
        "expstore_ready_groups",
        ["spec_id", "ready", "first_key"],
    )
    op.create_index(
        op.f("ix_expstore_ready_groups_spec_id_version"),
        "expstore_ready_groups",
        ["spec_id", "version"],
    )
    op.create_index(
        op.f("ix_expstore_ready_groups_first_key"), "expstore_ready_groups", ["first_key"]
    )
    op.create_table(
        "expstore_discarded",
        sa.Column("key", _KEY, nullable=False, autoincrement=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_discarded_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_discarded")),
    )
    op.create_table(
        "expstore_discard_counts",
        sa.Column("buffer_id", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("rows", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("buffer_id", name=op.f("pk_expstore_discard_counts")),
    )


def downgrade() -> None:
    op.drop_table("expstore_discard_counts")
    op.drop_table("expstore_discarded")
    op.drop_table("expstore_ready_groups")
    op.drop_table("expstore_group_specs")
