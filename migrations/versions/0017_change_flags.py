"""Tracked paths: changed() read from flags kept by every write (issue 34).

- ``expstore_tracked_paths``: ``(id, buffer_id, path)``, the paths whose changes a buffer
  tracks (``buffer.track_changes(path)``).
- ``expstore_changes``: ``(key, path_id, digest, same_previous, same_next)``, per row and
  tracked path (primary key ``(key, path_id)``, which the rows' ON DELETE CASCADE looks
  up), with indexes on ``(path_id, same_previous, key)`` and ``(path_id, same_next, key)``.

New tables only: nothing stored is rewritten. A downgrade drops them (``changed()`` then
compares the steps as it did before, by a correlated probe).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "expstore_tracked_paths",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(1000), nullable=False),
        sa.ForeignKeyConstraint(
            ["buffer_id"],
            ["expstore_buffers.id"],
            name=op.f("fk_expstore_tracked_paths_buffer_id_expstore_buffers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_expstore_tracked_paths")),
        sa.UniqueConstraint(
            "buffer_id", "path", name=op.f("uq_expstore_tracked_paths_buffer_id_path")
        ),
    )
    op.create_table(
        "expstore_changes",
        sa.Column("key", _KEY, autoincrement=False, nullable=False),
        sa.Column("path_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(32), nullable=True),
        sa.Column("same_previous", sa.Boolean(), nullable=False),
        sa.Column("same_next", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["path_id"],
            ["expstore_tracked_paths.id"],
            name=op.f("fk_expstore_changes_path_id_expstore_tracked_paths"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_changes_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", "path_id", name=op.f("pk_expstore_changes")),
    )
    op.create_index(
        op.f("ix_expstore_changes_path_id_same_previous_key"),
        "expstore_changes",
        ["path_id", "same_previous", "key"],
    )
    op.create_index(
        op.f("ix_expstore_changes_path_id_same_next_key"),
        "expstore_changes",
        ["path_id", "same_next", "key"],
    )


def downgrade() -> None:
    for name in ("path_id_same_previous_key", "path_id_same_next_key"):
        op.drop_index(op.f(f"ix_expstore_changes_{name}"), table_name="expstore_changes")
    op.drop_table("expstore_changes")
    op.drop_table("expstore_tracked_paths")
