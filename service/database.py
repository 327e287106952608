"""The store's connection: URLs, engines, sessions, and the schema version (Alembic, configured here so the
migrations run from the installed package with no `alembic.ini` in the working folder).

SQLite (the embedded default) runs in WAL mode with a busy timeout and foreign keys on; every write
transaction starts with `BEGIN IMMEDIATE`, so writers queue for the one write lock up front instead of failing
half-way. PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from posbias import migrations
from posbias.schemas import PosbiasError

SQLITE_BUSY_TIMEOUT_MS = 30_000
IN_CHUNK = 1000
"""Ids per IN list at most: well under SQLite's and PostgreSQL's bound-parameter limits."""
POSTGRES_CONNECT_TIMEOUT_S = 10
UPGRADE_HINT = "run `posbias db upgrade`"
URL_HINT = "check POSBIAS_DATABASE_URL"

# An execution option on the engine behind write sessions; the SQLite `begin` hook reads it.
_WRITE_OPTION = "posbias_write"


def normalise_url(url: str | URL) -> URL:
    """Parse a database URL; `postgresql://` and `postgres://` become `postgresql+psycopg://` (psycopg 3)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise PosbiasError(
            f"{url!r} is not a database URL: {URL_HINT} (e.g. sqlite:///posbias.db or "
            "postgresql+psycopg://user:pass@host/db)"
        ) from None
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in {"sqlite", "postgresql"}:
        raise PosbiasError(
            f"unsupported database {parsed.get_backend_name()!r}: {URL_HINT} (SQLite or PostgreSQL)"
        )
    return parsed


def now_utc() -> datetime:
    """The store's clock: timezone-aware UTC. Lease expiry compares the dispatchers' clocks, which must agree
    to well within a lease."""
    return datetime.now(UTC)


def dialect_insert(dialect: str, table: Any) -> Any:
    """`INSERT` with `on_conflict_do_nothing` / `on_conflict_do_update` for the session's dialect."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


def describe(url: URL) -> str:
    """The URL as it may be shown to a user: without its password."""
    return url.render_as_string(hide_password=True)


def create_db_engine(url: str | URL, *, foreign_keys: bool = True) -> Engine:
    """An engine with posbias's connection settings. `foreign_keys=False` is for SQLite migrations, whose
    batch mode drops and recreates tables (with foreign keys on, dropping a table would cascade)."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(
            parsed, pool_pre_ping=True, connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
        )
    engine = create_engine(parsed)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control from the driver: the `begin` hook below issues BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        if parsed.database not in {None, "", ":memory:"}:
            cursor.execute("PRAGMA journal_mode = WAL")
            # Safe with WAL (no corruption on power loss; the last commits may roll back).
            cursor.execute("PRAGMA synchronous = NORMAL")
        try:
            cursor.execute("SELECT sqrt(4)")
        except sqlite3.OperationalError:
            # SQLite builds without the math functions (before 3.35, or compiled without them): the
            # `position_curve` view needs sqrt for its Wilson interval.
            dbapi_connection.create_function("sqrt", 1, _sqrt, deterministic=True)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _sqrt(value: float | None) -> float | None:
    return None if value is None or value < 0 else math.sqrt(value)


class Database:
    """An open store: an engine and its sessions. Use `connect` to get one that has been checked."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(engine.execution_options(**{_WRITE_OPTION: True}), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.engine.dialect.name

    @property
    def url(self) -> str:
        """The database URL without its password."""
        return describe(self.engine.url)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session in one write transaction: committed on exit, rolled back on error. On SQLite it holds
        the database's write lock from its first statement."""
        with self._write() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading (rolled back on exit)."""
        with self._read() as session:
            yield session

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(url: str | URL) -> Database:
    """Open the store at `url` after checking that it is reachable and at this posbias's schema version.

    Raises `PosbiasError` naming the fix: a bad or unreachable URL, a database never upgraded (or older than
    this posbias), or one migrated by a newer posbias.
    """
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in {None, "", ":memory:"}:
        path = Path(str(parsed.database))
        if not path.is_file():
            raise PosbiasError(
                f"there is no posbias database at {path}: {UPGRADE_HINT} to create it, or {URL_HINT}"
            )
    engine = create_db_engine(parsed)
    try:
        check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return Database(engine)


def check_schema(engine: Engine) -> None:
    """Raise `PosbiasError` unless the database behind `engine` is reachable and at the head revision."""
    try:
        with engine.connect() as connection:
            revision = MigrationContext.configure(connection).get_current_revision()
    except DBAPIError as exc:
        raise _unreachable(engine.url, exc) from None
    where = describe(engine.url)
    script = _script_directory()
    head = script.get_current_head()
    if revision == head:
        return
    if revision is None:
        raise PosbiasError(f"the database at {where} has no posbias tables yet: {UPGRADE_HINT}")
    if revision not in {rev.revision for rev in script.walk_revisions()}:
        raise PosbiasError(
            f"the database at {where} was migrated by a newer posbias (revision {revision}): upgrade posbias "
            f"(pip install -U posbias), or {URL_HINT}"
        )
    raise PosbiasError(
        f"the database at {where} is at schema revision {revision}, this posbias needs {head}: {UPGRADE_HINT}"
    )


def _unreachable(url: URL, exc: DBAPIError) -> PosbiasError:
    reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
    return PosbiasError(f"cannot open the database at {describe(url)} ({reason}): {URL_HINT}")


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration, built in code: the scripts ship inside the `migrations` package.

    With `connection`, migrations run on it (see `migrations/env.py`).
    """
    config = Config()
    # __path__, not __file__: an editable install made before migrations/ had an __init__.py maps it as a
    # namespace package, which has no __file__.
    config.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    config.attributes["connection"] = connection
    return config


def _script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    """The newest schema revision this posbias knows."""
    revision = _script_directory().get_current_head()
    assert revision is not None, "the migrations package has no revisions"
    return revision


@contextmanager
def _migration_connection(url: str | URL) -> Iterator[Connection]:
    """A connection in one transaction, committed when the migration succeeds."""
    engine = create_db_engine(url, foreign_keys=False)
    try:
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            raise _unreachable(engine.url, exc) from None
        with connection, connection.begin():
            yield connection
    finally:
        engine.dispose()


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Migrate the database at `url` up to `revision` (creating the SQLite file if it does not exist)."""
    with _migration_connection(url) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade(url: str | URL, revision: str) -> None:
    """Migrate the database at `url` down to `revision` (`base` removes every posbias table)."""
    with _migration_connection(url) as connection:
        command.downgrade(alembic_config(connection), revision)


def current(url: str | URL) -> str | None:
    """The database's schema revision; None when it was never upgraded."""
    with _migration_connection(url) as connection:
        return MigrationContext.configure(connection).get_current_revision()
