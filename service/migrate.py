"""Migrating the store's schema with Alembic (`posbias db upgrade`, `downgrade`, `current`), configured here
so the migrations run from the installed package with no `alembic.ini` in the working folder.

Alembic is imported only inside these functions: it costs every command a few tenths of a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import URL, Connection, inspect
from sqlalchemy.exc import DBAPIError

from posbias import migrations
from posbias.schemas import PosbiasError, one_line
from posbias.service.database import create_db_engine
from posbias.service.database_url import URL_HINT, check_sqlite_file, describe, normalise_url, sqlite_path
from posbias.service.schema_version import current_revision, revisions
from posbias.service.store_errors import explain

if TYPE_CHECKING:
    import alembic.config


def alembic_config(connection: Connection | None = None) -> alembic.config.Config:
    """Alembic's configuration, built in code: the scripts ship inside the `migrations` package.

    With `connection`, migrations run on it (see `migrations/env.py`).
    """
    from alembic.config import Config

    config = Config()
    # __path__, not __file__: an editable install made before migrations/ had an __init__.py maps it as a
    # namespace package, which has no __file__.
    config.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    config.attributes["connection"] = connection
    return config


@contextmanager
def _migration_connection(
    url: str | URL, *, read_only: bool = False, create: bool = True
) -> Iterator[Connection]:
    """A connection in one transaction, committed when the migration succeeds."""
    engine = create_db_engine(url, foreign_keys=False, read_only=read_only, create=create)
    try:
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            raise explain(exc, url=engine.url) from None
        with connection, connection.begin():
            yield connection
    except DBAPIError as exc:
        raise explain(exc, url=engine.url) from exc
    except Exception as exc:
        from alembic.util.exc import CommandError

        if isinstance(exc, CommandError):
            raise RevisionError(f"{one_line(exc)}: `posbias db current` shows the revisions") from None
        raise
    finally:
        engine.dispose()


class RevisionError(PosbiasError):
    """A schema revision that Alembic does not know was asked for (a usage error)."""


def _foreign(connection: Connection) -> tuple[str | None, list[str]]:
    """The database's Alembic revision (None if it has none) and its other tables and views."""
    revision = current_revision(connection)
    inspector = inspect(connection)
    names = [*inspector.get_table_names(), *inspector.get_view_names()]
    return revision, sorted(n for n in names if n != "alembic_version" and not n.startswith("sqlite_"))


def upgrade(url: str | URL, revision: str = "head", *, force: bool = False) -> None:
    """Migrate the database at `url` up to `revision` (creating the SQLite file if it does not exist).

    A database that already holds tables but no posbias schema (another application's) is refused unless
    `force`: posbias's tables would be added among them. One whose Alembic revision is not posbias's is
    always refused.
    """
    parsed = normalise_url(url)
    path = sqlite_path(parsed)
    if path is not None and not path.absolute().parent.is_dir():
        raise PosbiasError(
            f"cannot open the database at {describe(parsed)}: the folder {path.absolute().parent} does not "
            f"exist; create it, or {URL_HINT}"
        )
    if path is None or (path.is_file() and path.stat().st_size > 0):
        # Looked at read-only first: a store that is refused is left exactly as it was.
        with _migration_connection(parsed, read_only=True, create=False) as connection:
            current, tables = _foreign(connection)
        where = describe(parsed)
        if current is not None and current not in revisions():
            raise PosbiasError(
                f"the database at {where} is at Alembic revision {current[:40]!r}, which is not posbias's: "
                f"it was migrated by a newer posbias (pip install -U posbias) or by another application; "
                f"{URL_HINT}"
            )
        if current is None and tables and not force:
            shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
            raise PosbiasError(
                f"the database at {where} already holds tables of another application ({shown}) and no "
                "posbias schema: use a database of its own (or pass --force to add posbias's tables beside "
                "them)"
            )
    from alembic import command

    with _migration_connection(parsed) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade(url: str | URL, revision: str) -> None:
    """Migrate the database at `url` down to `revision` (`base` removes every posbias table)."""
    parsed = normalise_url(url)
    path = sqlite_path(parsed)
    if path is not None:
        check_sqlite_file(path)
    from alembic import command

    with _migration_connection(parsed, create=False) as connection:
        command.downgrade(alembic_config(connection), revision)


def current(url: str | URL) -> str | None:
    """The database's schema revision; None when it was never upgraded. Opens it read-only and creates
    nothing: a SQLite file that does not exist is a `PosbiasError`."""
    parsed = normalise_url(url)
    path = sqlite_path(parsed)
    if path is not None:
        try:
            check_sqlite_file(path)
        except PosbiasError:
            if path.is_file() and path.stat().st_size == 0:
                return None  # an empty file is an empty database; opening it is not asked for
            raise
    with _migration_connection(parsed, read_only=True, create=False) as connection:
        return current_revision(connection)
