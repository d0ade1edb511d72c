"""Stored priorities in a narrow table of their own (issue: Scale I).

- ``expstore_priorities``: ``(key, buffer_id, priority)`` for each row that has a priority,
  filled on upgrade from ``expstore_rows.priority``; its entry goes when the row goes
  (a foreign key to ``expstore_rows.key``, ON DELETE CASCADE), and a ``(buffer_id,
  priority)`` index gives a buffer's smallest and largest priority in two probes;
- ``expstore_rows.priority`` and its index go.

An update of 256 priorities rewrote 256 wide rows and every index of ``expstore_rows``
(a priority in an index rules out Postgres's in-page updates); now it writes 256 narrow
rows and two small indexes.

Plain ``ALTER TABLE ... DROP COLUMN`` on both backends (never a table copy, which on SQLite
would delete every row through the foreign keys' ON DELETE CASCADE); SQLite needs 3.35 or
later for it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_ROWS_INDEX = "ix_expstore_rows_buffer_id_priority"


def _check_sqlite() -> None:
    dbapi = op.get_bind().dialect.dbapi  # None when printing the SQL (--sql)
    if op.get_bind().dialect.name == "sqlite" and dbapi and dbapi.sqlite_version_info < (3, 35):
        raise RuntimeError(
            "upgrading to revision 0008 drops a column, which needs SQLite 3.35 or later "
            f"(this is {dbapi.sqlite_version}); upgrade SQLite, or keep the "
            "schema (and the expstore version that made it)"
        )


def _drop_priority_column() -> None:
    if op.get_bind().dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, never a copy
        op.execute(sa.text("ALTER TABLE expstore_rows DROP COLUMN priority"))
    else:
        op.drop_column("expstore_rows", "priority")


def upgrade() -> None:
    _check_sqlite()
    op.create_table(
        "expstore_priorities",
        sa.Column("key", _KEY, autoincrement=False, nullable=False),
        sa.Column("buffer_id", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["key"],
            ["expstore_rows.key"],
            name=op.f("fk_expstore_priorities_key_expstore_rows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_expstore_priorities")),
    )
    op.execute(
        "INSERT INTO expstore_priorities (key, buffer_id, priority) "
        "SELECT key, buffer_id, priority FROM expstore_rows WHERE priority IS NOT NULL"
    )
    op.create_index(
        op.f("ix_expstore_priorities_buffer_id_priority"),
        "expstore_priorities",
        ["buffer_id", "priority"],
    )
    op.drop_index(_ROWS_INDEX, table_name="expstore_rows")
    _drop_priority_column()


def downgrade() -> None:
    op.add_column("expstore_rows", sa.Column("priority", sa.Double(), nullable=True))
    op.execute(
        "UPDATE expstore_rows SET priority = (SELECT p.priority FROM expstore_priorities p "
        "WHERE p.key = expstore_rows.key) "
        "WHERE key IN (SELECT key FROM expstore_priorities)"
    )
    op.create_index(_ROWS_INDEX, "expstore_rows", ["buffer_id", "priority"])
    op.drop_table("expstore_priorities")
