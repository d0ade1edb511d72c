"""Compression per payload path: ``expstore_buffers.compression_fields`` (issue 34).

A JSON object of canonical payload paths to compression settings (the values of
``compression``), over the buffer's own setting for the arrays under each path
(``buffer.set_compression(..., fields={...})``); NULL: none. A new nullable column, added
by a plain ALTER TABLE on both backends; nothing stored is rewritten.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("expstore_buffers", sa.Column("compression_fields", sa.Text(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, no table copy
        op.execute(sa.text("ALTER TABLE expstore_buffers DROP COLUMN compression_fields"))
    else:
        op.drop_column("expstore_buffers", "compression_fields")
