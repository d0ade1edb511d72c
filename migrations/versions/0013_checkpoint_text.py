"""Checkpoints stored as text; discarded rows and the last insert and sample for rate limits
(issue 32).

- ``expstore_checkpoints.state`` becomes TEXT holding the checkpoint's JSON, so that it
  comes back exactly as given: SQLite's JSON column had numeric affinity (a bare ``1.0``
  came back as ``1``, ``2**64 + 1`` as a float) and Postgres' JSONB normalised numbers
  (``1e20`` came back as an int). Stored values are kept (as their JSON text). On SQLite
  the table is copied (batch mode); it has no foreign keys, so no row elsewhere is touched.
- ``expstore_buffers.discarded`` (rows ever inserted that can never be drawn, 0 for the
  past) and ``.inserted_at`` (when the last write inserted rows, NULL until the next one);
- ``expstore_rate_limits.discarded_base`` (the buffer's discards when the limit was set:
  0, since there were none before) and ``.sampled_at`` (when samples were last counted).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def _checkpoints(state: sa.types.TypeEngine[object]) -> sa.Table:
    """``expstore_checkpoints`` with ``state`` of the given type, for a SQLite table copy
    (given, not reflected, so ``--sql`` can print the migration too)."""
    return sa.Table(
        "expstore_checkpoints",
        sa.MetaData(),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("state", state, nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("buffer_id", "consumer", "seq", name="pk_expstore_checkpoints"),
    )


def _state_type(old: sa.types.TypeEngine[object], new: sa.types.TypeEngine[object]) -> None:
    if op.get_context().dialect.name == "postgresql":
        cast = "state::text" if isinstance(new, sa.Text) else "state::jsonb"
        op.alter_column(
            "expstore_checkpoints", "state", type_=new, existing_type=old, postgresql_using=cast
        )
        return
    with op.batch_alter_table(
        "expstore_checkpoints", copy_from=_checkpoints(old), recreate="always"
    ) as batch:
        batch.alter_column("state", type_=new, existing_type=old)


def upgrade() -> None:
    _state_type(_JSON, sa.Text())
    op.add_column(
        "expstore_buffers",
        sa.Column("discarded", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column("expstore_buffers", sa.Column("inserted_at", sa.Double(), nullable=True))
    op.add_column(
        "expstore_rate_limits",
        sa.Column("discarded_base", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column("expstore_rate_limits", sa.Column("sampled_at", sa.Double(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.dialect.dbapi.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            "downgrading below revision 0013 drops columns, which needs SQLite 3.35 or later "
            f"(this is {bind.dialect.dbapi.sqlite_version}); upgrade SQLite, or keep the schema"
        )
    for table, column in (
        ("expstore_rate_limits", "sampled_at"),
        ("expstore_rate_limits", "discarded_base"),
        ("expstore_buffers", "inserted_at"),
        ("expstore_buffers", "discarded"),
    ):
        op.drop_column(table, column)
    _state_type(sa.Text(), _JSON)
