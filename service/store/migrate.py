"""Migrating the store's schema with Alembic (`posbias db upgrade`, `downgrade`, `current`), configured here
so the migrations run from the installed package with no `alembic.ini` in the working folder.

Alembic is imported only inside these functions: it costs every command a few tenths of a second.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import URL, Connection, inspect
from sqlalchemy.exc import DBAPIError

from posbias import migrations
from posbias.schemas import PosbiasError, UsageError, one_line
from posbias.service.store.database import create_db_engine
from posbias.service.store.database_url import (
    URL_HINT,
    check_sqlite_file,
    describe,
    normalise_url,
    sqlite_path,
)
from posbias.service.store.schema_version import current_revision, head, revisions
from posbias.service.store.store_errors import explain

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


class RevisionError(UsageError):
    """A schema revision that Alembic does not know was asked for (a usage error)."""


def _foreign(connection: Connection) -> tuple[str | None, list[str], list[str]]:
    """The database's Alembic revision (None if it has none), its other tables, and its views."""
    revision = current_revision(connection)
    inspector = inspect(connection)
    tables = [
        n for n in inspector.get_table_names() if n != "alembic_version" and not n.startswith("sqlite_")
    ]
    return revision, sorted(tables), sorted(inspector.get_view_names())


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
            current, tables, views = _foreign(connection)
        where = describe(parsed)
        if current is not None and current not in revisions():
            raise PosbiasError(
                f"the database at {where} is at Alembic revision {current[:40]!r}, which is not posbias's: "
                f"it was migrated by a newer posbias (pip install -U posbias) or by another application; "
                f"{URL_HINT}"
            )
        _check_complete(where, current=current, tables=tables)
        if current is None and (tables or views) and not force:
            names = sorted([*tables, *views])
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise PosbiasError(
                f"the database at {where} already holds tables of another application ({shown}) and no "
                "posbias schema: use a database of its own (or pass --force to add posbias's tables beside "
                "them)"
            )
    from alembic import command

    with _migration_connection(parsed) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade(url: str | URL, revision: str) -> None:
    """Migrate the database at `url` down to `revision` (`base` removes every posbias table). A migration
    that refuses to go below its revision (data the older schema cannot hold) is a `PosbiasError` with its
    reason, and the store is left as it was (one transaction)."""
    parsed = normalise_url(url)
    path = sqlite_path(parsed)
    if path is not None:
        check_sqlite_file(path)
    from alembic import command

    try:
        with _migration_connection(parsed, create=False) as connection:
            command.downgrade(alembic_config(connection), revision)
    except RuntimeError as exc:
        if not _raised_by_a_migration(exc):
            raise
        raise PosbiasError(f"{one_line(exc)}; the store is unchanged") from None


def _raised_by_a_migration(exc: BaseException) -> bool:
    """True when `exc` was raised in one of the migration scripts (their refusals are `RuntimeError`s)."""
    folder = Path(next(iter(migrations.__path__))).resolve() / "versions"
    trace = exc.__traceback__
    last = None
    while trace is not None:
        last, trace = trace, trace.tb_next
    return last is not None and Path(last.tb_frame.f_code.co_filename).resolve().parent == folder


_CREATED = re.compile(r'create_table\(\s*"(\w+)"')
_DROPPED = re.compile(r'drop_table\(\s*"(\w+)"')


@functools.cache
def expected_tables(revision: str) -> frozenset[str]:
    """The tables a store at `revision` holds: those the migration scripts up to it create and do not drop
    again (read from their `upgrade` functions, as `schema_version.revisions` reads the revisions)."""
    chain: list[str] = []
    at: str | None = revision
    known = revisions()
    while at is not None and at in known and at not in chain:
        chain.append(at)
        at = known[at]
    folder = Path(next(iter(migrations.__path__))) / "versions"
    scripts = {}
    for script in folder.glob("[0-9]*.py"):
        text = script.read_text(encoding="utf-8")
        found = re.search(r'^revision\b[^=\n]*=\s*"([^"]+)"', text, re.M)
        if found:
            scripts[found.group(1)] = text
    tables: set[str] = set()
    for name in reversed(chain):
        body = scripts[name].split("def upgrade", 1)[-1].split("def downgrade", 1)[0]
        tables |= set(_CREATED.findall(body))
        tables -= set(_DROPPED.findall(body))
    return frozenset(tables)


def _check_complete(where: str, *, current: str | None, tables: list[str]) -> None:
    """Refuse a store whose tables are not the whole of posbias's schema: one at a posbias revision with a
    table missing (dropped by hand, or a restore that left one out), or one with some of posbias's tables
    and no revision (a create interrupted outside one transaction). Migrating either would leave a schema
    half written; reporting it as up to date would hide that results are gone."""
    present = set(tables)
    if current is not None:
        missing = sorted(expected_tables(current) - present)
        if missing:
            raise PosbiasError(
                f"the database at {where} is at revision {current} but lacks the table"
                f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}: it is damaged (a table dropped, or "
                "a restore that left it out); restore the database from a backup, or, when it holds "
                f"nothing to keep, start a new store ({URL_HINT}) and run `posbias db upgrade`"
            )
        return
    ours = present & expected_tables(head())
    if ours and ours == present:  # posbias's tables and none of another application's
        shown = ", ".join(sorted(ours)[:5]) + (f" and {len(ours) - 5} more" if len(ours) > 5 else "")
        raise PosbiasError(
            f"the database at {where} holds some of posbias's tables ({shown}) but no schema revision: a "
            "`posbias db upgrade` (or a copy of a store) was interrupted; drop those tables, or start a new "
            f"store ({URL_HINT}), and run `posbias db upgrade` again"
        )


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
