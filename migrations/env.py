"""Alembic environment. `service.store.migrate` passes an open connection in
`config.attributes["connection"]`; the alembic command line (see alembic.ini) gets its URL from `-x url=...`
or posbias's settings.

`render_as_batch` makes table changes copy-and-swap on SQLite, so one set of scripts serves both dialects.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from posbias.service.store.database import create_db_engine
from posbias.service.store.tables import Base

config = context.config
target_metadata = Base.metadata


def run(connection: Connection) -> None:
    """Run the pending migrations on `connection`, in its transaction."""
    context.configure(
        connection=connection, target_metadata=target_metadata, render_as_batch=True, compare_type=True
    )
    with context.begin_transaction():
        context.run_migrations()


def command_line_url() -> str:
    """The URL for the alembic command line: `-x url=...`, else POSBIAS_DATABASE_URL (or its default)."""
    url = context.get_x_argument(as_dictionary=True).get("url")
    if url:
        return url
    from posbias.service.settings import Settings

    return Settings().database_url


given = config.attributes.get("connection")
if given is not None:
    run(given)
elif context.is_offline_mode():
    context.configure(url=command_line_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    if config.config_file_name is not None:
        fileConfig(config.config_file_name)
    engine = create_db_engine(command_line_url(), foreign_keys=False)
    with engine.begin() as connection:
        run(connection)
    engine.dispose()
