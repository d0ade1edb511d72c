"""Consumers with epochs: fencing of a learner's older incarnations (issue 32).

- ``expstore_consumers.epoch``: the consumer's current incarnation, bumped by each
  ``buffer.consumer(name)``; 0 for a consumer never opened that way (its plain claims go
  on as before). Claims, acks, releases, renewals and checkpoints carrying another epoch
  are refused (now :mod:`expstore.claims.generations`; the column is ``generation`` since 0020).

Plain ``ALTER TABLE ... ADD COLUMN`` on both backends (never a table copy).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "expstore_consumers",
        sa.Column("epoch", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a table copy
        dbapi = bind.dialect.dbapi
        if dbapi is not None and dbapi.sqlite_version_info < (3, 35, 0):
            raise RuntimeError(
                "downgrading below revision 0011 drops a column, which needs SQLite 3.35 or "
                f"later (this is {dbapi.sqlite_version}); upgrade SQLite, or keep the schema"
            )
        op.execute(sa.text("ALTER TABLE expstore_consumers DROP COLUMN epoch"))
    else:
        op.drop_column("expstore_consumers", "epoch")
