"""Tracked changes' flags on the rows: changed(path) tests a column through an index (issue 34).

- ``expstore_rows.change_flags`` (BIGINT NOT NULL DEFAULT 0): two bits per tracked path,
  bit ``2 * slot`` set when the row's value at the path equals the previous step's, bit
  ``2 * slot + 1`` when it equals the next step's; indexed ``(buffer_id, change_flags)`` on
  SQLite, ``(buffer_id, change_flags, key)`` on Postgres (an index-only scan).
- ``expstore_tracked_paths.slot``: which bits a path takes, the lowest free when it was
  tracked (a unique index per buffer).
- ``expstore_changes`` keeps the digests only: ``same_previous`` and ``same_next`` and their
  indexes go, moved into the rows' flags.

Plain ALTER TABLE on both backends (a batch-mode copy of expstore_rows would drop it, and on
SQLite with foreign keys on that deletes every row's dependants); no row's data is
rewritten, only the flags of rows whose tracked values equal a neighbour's. Each buffer's
paths take slots in the order they were tracked; paths beyond the 31st of a buffer (the
most it can track now) are untracked, and ``changed()`` on them probes the neighbours as on
any path not tracked. A downgrade moves the flags back into ``expstore_changes``.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_MAX_TRACKED = 31

_rows = sa.table(
    "expstore_rows", sa.column("key", sa.BigInteger()), sa.column("change_flags", sa.BigInteger())
)
_paths = sa.table(
    "expstore_tracked_paths",
    sa.column("id", sa.Integer()),
    sa.column("buffer_id", sa.Integer()),
    sa.column("slot", sa.Integer()),
)
_changes = sa.table(
    "expstore_changes",
    sa.column("key", sa.BigInteger()),
    sa.column("path_id", sa.Integer()),
    sa.column("same_previous", sa.Boolean()),
    sa.column("same_next", sa.Boolean()),
)
_FLAGS = ("same_previous", "same_next")


def _drop_column(table: str, column: str) -> None:
    if op.get_bind().dialect.name == "sqlite":  # ALTER TABLE ... DROP COLUMN, no table copy
        op.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN {column}"))
    else:
        op.drop_column(table, column)


def _bit(slot: sa.ColumnElement[int], towards_next: bool) -> sa.ColumnElement[int]:
    """``1 << (2 * slot + towards_next)`` in SQL, shifting a BIGINT on both backends (a
    bare 1 is an int4 on Postgres, whose shifts wrap at 32 bits; offline SQL prints the
    literal bare, so the cast is written out)."""
    one = sa.cast(sa.literal(1, sa.BigInteger()), sa.BigInteger())
    return one.op("<<")(slot * 2 + int(towards_next))


def upgrade() -> None:
    bind = op.get_bind()
    dbapi = bind.dialect.dbapi
    if bind.dialect.name == "sqlite" and dbapi is not None and dbapi.sqlite_version_info < (3, 35):
        raise RuntimeError(
            "upgrading to revision 0018 drops two columns of expstore_changes, which needs "
            f"SQLite 3.35 or later (this is {dbapi.sqlite_version}); upgrade SQLite, or keep "
            "the schema"
        )
    op.add_column(
        "expstore_rows",
        sa.Column("change_flags", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column(
        "expstore_tracked_paths",
        sa.Column("slot", sa.Integer(), nullable=False, server_default="0"),
    )
    # Each buffer's paths take slots 0, 1, ... in the order they were tracked.
    other = _paths.alias("other")
    earlier = (
        sa.select(sa.func.count())
        .where(other.c.buffer_id == _paths.c.buffer_id, other.c.id < _paths.c.id)
        .scalar_subquery()
    )
    op.execute(sa.update(_paths).values(slot=earlier))
    # Paths beyond the most a buffer can track are untracked (changed() probes them again).
    beyond = sa.select(_paths.c.id).where(_paths.c.slot >= _MAX_TRACKED)
    op.execute(sa.delete(_changes).where(_changes.c.path_id.in_(beyond)))
    op.execute(sa.delete(_paths).where(_paths.c.slot >= _MAX_TRACKED))
    # Each row's flags: the sum of the bits of its paths whose flags were set.
    slot = _paths.c.slot
    bits = sa.case((_changes.c.same_previous, _bit(slot, False)), else_=0) + sa.case(
        (_changes.c.same_next, _bit(slot, True)), else_=0
    )
    total = (
        sa.select(sa.func.coalesce(sa.func.sum(bits), 0))
        .select_from(_changes.join(_paths, _paths.c.id == _changes.c.path_id))
        .where(_changes.c.key == _rows.c.key)
        .scalar_subquery()
    )
    flagged = sa.select(_changes.c.key).where(
        sa.or_(_changes.c.same_previous, _changes.c.same_next)
    )
    op.execute(sa.update(_rows).where(_rows.c.key.in_(flagged)).values(change_flags=total))
    if bind.dialect.name == "sqlite":
        op.create_index(
            op.f("ix_expstore_rows_buffer_id_change_flags"),
            "expstore_rows",
            ["buffer_id", "change_flags"],
        )
    else:
        op.create_index(
            op.f("ix_expstore_rows_buffer_id_change_flags_key"),
            "expstore_rows",
            ["buffer_id", "change_flags", "key"],
        )
    op.create_index(
        op.f("ix_expstore_tracked_paths_buffer_id_slot"),
        "expstore_tracked_paths",
        ["buffer_id", "slot"],
        unique=True,
    )
    for column in _FLAGS:
        op.drop_index(op.f(f"ix_expstore_changes_path_id_{column}_key"), "expstore_changes")
        _drop_column("expstore_changes", column)


def downgrade() -> None:
    bind = op.get_bind()
    for column in _FLAGS:
        op.add_column(
            "expstore_changes",
            sa.Column(column, sa.Boolean(), nullable=False, server_default=sa.false()),
        )
    slot = sa.select(_paths.c.slot).where(_paths.c.id == _changes.c.path_id).scalar_subquery()
    flags = sa.select(_rows.c.change_flags).where(_rows.c.key == _changes.c.key).scalar_subquery()

    def flag(towards_next: bool) -> sa.ColumnElement[bool]:
        return flags.op("&")(_bit(slot, towards_next)) != 0

    op.execute(sa.update(_changes).values(same_previous=flag(False), same_next=flag(True)))
    for column in _FLAGS:
        op.create_index(
            op.f(f"ix_expstore_changes_path_id_{column}_key"),
            "expstore_changes",
            ["path_id", column, "key"],
        )
    op.drop_index(
        op.f("ix_expstore_tracked_paths_buffer_id_slot"), table_name="expstore_tracked_paths"
    )
    if bind.dialect.name == "sqlite":
        op.drop_index(op.f("ix_expstore_rows_buffer_id_change_flags"), table_name="expstore_rows")
    else:
        op.drop_index(
            op.f("ix_expstore_rows_buffer_id_change_flags_key"), table_name="expstore_rows"
        )
    _drop_column("expstore_tracked_paths", "slot")
    _drop_column("expstore_rows", "change_flags")
