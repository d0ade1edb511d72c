"""Add rows.priority, the stored priority of prioritized experience replay.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("expstore_rows") as batch:
        batch.add_column(sa.Column("priority", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("expstore_rows") as batch:
        batch.drop_column("priority")
