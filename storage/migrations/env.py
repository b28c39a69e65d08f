"""Alembic environment: runs on the connection handed in by `storage.db.migrate`."""

from alembic import context
from sqlmodel import SQLModel

import storage.models  # noqa: F401  (registers the tables on SQLModel.metadata)

target_metadata = SQLModel.metadata
connection = context.config.attributes.get("connection")
if connection is None:
    from sqlalchemy import create_engine

    from examforge.settings import load_settings

    # `alembic` run by hand: use DATABASE_URL like every other entry point.
    connection = create_engine(load_settings().database_url).connect()

context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
