"""Alembic environment for expstore.

expstore runs migrations through :mod:`expstore.db.migrate`, which passes an open connection in
``config.attributes["connection"]`` (inside a transaction that holds a lock, so concurrent
openers never race). Running ``alembic`` by hand with ``sqlalchemy.url`` set also works.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from expstore.db.schema import VERSION_TABLE, compared, metadata

config = context.config
target_metadata = metadata


def _configure(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # Autogenerate leaves alone the path indexes users create (buffer.create_index)
        # and the other backend's indexes.
        include_object=compared(connection.dialect.name),
    )


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
