"""A consumer's incarnation is its generation: ``expstore_consumers.epoch`` renamed
``generation`` (issue 47: "epoch" meant both a consumer's incarnation and a sampler's pass
over the data; the API already said ``generation``).

A rename in place (``ALTER TABLE ... RENAME COLUMN``, SQLite 3.25 and Postgres alike):
nothing stored is rewritten, the values are kept.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("ALTER TABLE expstore_consumers RENAME COLUMN epoch TO generation"))


def downgrade() -> None:
    op.execute(sa.text("ALTER TABLE expstore_consumers RENAME COLUMN generation TO epoch"))
