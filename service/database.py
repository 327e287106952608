"""The store's connection: URLs, engines, sessions, and the schema version (Alembic, configured here so the
migrations run from the installed package with no `alembic.ini` in the working folder).

SQLite (the embedded default) runs in WAL mode with a busy timeout and foreign keys on; every write
transaction starts with `BEGIN IMMEDIATE`, so writers queue for the one write lock up front instead of failing
half-way. PostgreSQL goes through psycopg 3.
"""

from __future__ import annotations

import functools
import math
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import psycopg
from sqlalchemy import URL, Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker

from posbias import migrations

if TYPE_CHECKING:
    import alembic.config
from posbias.schemas import PosbiasError, one_line

SQLITE_BUSY_TIMEOUT_MS = 30_000
IN_CHUNK = 1000
"""Ids per IN list at most: well under SQLite's and PostgreSQL's bound-parameter limits."""
POSTGRES_CONNECT_TIMEOUT_S = 10
UPGRADE_HINT = "run `posbias db upgrade`"
URL_HINT = "check POSBIAS_DATABASE_URL"
DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg",)}
"""The database drivers posbias ships with, by backend; the first is the default."""
URL_EXAMPLES = "e.g. sqlite:///posbias.db or postgresql+psycopg://user:pass@host/db"

# An execution option on the engine behind write sessions; the SQLite `begin` hook reads it.
_WRITE_OPTION = "posbias_write"


def normalise_url(url: str | URL) -> URL:
    """Parse a database URL and check it names a store posbias can open: SQLite, or PostgreSQL through
    psycopg 3 (`postgresql://` and `postgres://` become `postgresql+psycopg://`), with a port in range.
    `PosbiasError` naming the fix otherwise, before any driver is loaded."""
    if isinstance(url, str) and ("\x00" in url or not url.strip()):
        raise PosbiasError(f"the database URL is empty or holds a NUL character: {URL_HINT} ({URL_EXAMPLES})")
    try:
        parsed = make_url(url)
        port = parsed.port
    except (ArgumentError, ValueError):
        shown = url if isinstance(url, URL) else (url[:200] + ("..." if len(url) > 200 else ""))
        raise PosbiasError(f"{str(shown)!r} is not a database URL: {URL_HINT} ({URL_EXAMPLES})") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    if backend not in DRIVERS:
        raise PosbiasError(
            f"unsupported database {backend[:40]!r}: {URL_HINT} (SQLite or PostgreSQL, {URL_EXAMPLES})"
        )
    if driver and driver not in DRIVERS[backend]:
        raise PosbiasError(
            f"the database driver {driver[:40]!r} is not one posbias uses: write "
            f"{backend}+{DRIVERS[backend][0]}:// (or {backend}://) in POSBIAS_DATABASE_URL"
        )
    parsed = parsed.set(drivername=f"{backend}+{DRIVERS[backend][0]}" if backend == "postgresql" else backend)
    if port is not None and not 1 <= port <= 65535:
        raise PosbiasError(f"the database port {port} is not between 1 and 65535: {URL_HINT}")
    if backend == "postgresql" and not parsed.database:
        raise PosbiasError(
            f"the database URL names no database (…/DBNAME at its end): {URL_HINT} ({URL_EXAMPLES})"
        )
    return parsed


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL; None for PostgreSQL and in-memory SQLite."""
    if url.get_backend_name() != "sqlite" or url.database in {None, "", ":memory:"}:
        return None
    return Path(str(url.database))


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
    """The URL as it may be shown to a user: without its password (and a SQLite file as a path, not the
    `file:` URI posbias opens it with)."""
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database.startswith("file:") and url.query.get("uri") == "true":
        url = url.set(database=unquote(database.removeprefix("file:")), query={})
    return url.render_as_string(hide_password=True)


def create_db_engine(
    url: str | URL, *, foreign_keys: bool = True, read_only: bool = False, create: bool = True
) -> Engine:
    """An engine with posbias's connection settings. `foreign_keys=False` is for SQLite migrations, whose
    batch mode drops and recreates tables (with foreign keys on, dropping a table would cascade).
    `read_only`: every transaction is read-only (PostgreSQL `default_transaction_read_only`, SQLite
    `query_only`), for commands that only look. `create=False`: a SQLite file that does not exist is an
    error, not a new empty file."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "postgresql":
        options = "-c default_transaction_read_only=on" if read_only else None
        connect_args: dict[str, Any] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
        if options:
            connect_args["options"] = options
        return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    path = sqlite_path(parsed)
    target = parsed
    if path is not None and not create:
        # A URI with mode=rw opens an existing file only, so a typo in the URL cannot create one.
        target = parsed.set(
            database=f"file:{quote(str(path.absolute()))}", query={"mode": "rw", "uri": "true"}
        )
    engine = create_engine(target)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control from the driver: the `begin` hook below issues BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        if read_only:
            cursor.execute("PRAGMA query_only = ON")
        elif path is not None:
            if create:
                # WAL is a property of the file: set where a store is created (`upgrade`), never on a file
                # that is only opened, which may be another application's (or not a database at all).
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
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write and not read_only else "BEGIN")

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


def connect(url: str | URL, *, read_only: bool = False) -> Database:
    """Open the store at `url` after checking that it is reachable and at this posbias's schema version.

    `read_only` for commands that only look: the store is opened so that nothing can be written. Raises
    `PosbiasError` naming the fix: a bad or unreachable URL, a database never upgraded (or older than this
    posbias), or one migrated by a newer posbias. Nothing is created, not even an empty SQLite file.
    """
    parsed = normalise_url(url)
    path = sqlite_path(parsed)
    if path is not None:
        _check_sqlite_file(path)
    engine = create_db_engine(parsed, read_only=read_only, create=False)
    try:
        check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return Database(engine)


def _check_sqlite_file(path: Path) -> None:
    try:
        size = path.stat().st_size
        regular = path.is_file()
    except FileNotFoundError:
        size, regular = -1, False
    except OSError as exc:
        raise PosbiasError(f"cannot open the database at {path} ({exc.strerror}): {URL_HINT}") from None
    if size < 0:
        raise PosbiasError(
            f"there is no posbias database at {path}: {UPGRADE_HINT} to create it, or {URL_HINT}"
        )
    if not regular:
        raise PosbiasError(f"{path} is not a database file (a folder or a device): {URL_HINT}")
    if size == 0:
        # Opening it would turn it into a (WAL) database; an empty file is more likely a mistake.
        raise PosbiasError(
            f"{path} is an empty file, not a posbias database: {UPGRADE_HINT} to make it one, or {URL_HINT}"
        )


def check_schema(engine: Engine) -> None:
    """Raise `PosbiasError` unless the database behind `engine` is reachable and at the head revision."""
    try:
        with engine.connect() as connection:
            revision = _current_revision(connection)
    except DBAPIError as exc:
        raise explain(exc, url=engine.url) from None
    where = describe(engine.url)
    newest = head()
    if revision == newest:
        return
    if revision is None:
        raise PosbiasError(f"the database at {where} has no posbias tables yet: {UPGRADE_HINT}")
    if revision not in revisions():
        raise PosbiasError(
            f"the database at {where} is at schema revision {revision[:40]!r}, which this posbias does not "
            f"know: it was migrated by a newer posbias (pip install -U posbias) or belongs to another "
            f"application ({URL_HINT})"
        )
    raise PosbiasError(
        f"the database at {where} is at schema revision {revision}, this posbias needs {newest}: "
        f"{UPGRADE_HINT}"
    )


# --- what went wrong, on one line -----------------------------------------------------------------------


class Problem(StrEnum):
    """What kind of store error a `StoreError` is."""

    unreachable = "unreachable"
    """No connection (server down, restarting, wrong host or credentials)."""
    full = "full"
    """The disk or the database is full."""
    read_only = "read-only"
    """The store refuses writes (a replica, a read-only file or mount)."""
    busy = "busy"
    """Locked, a deadlock or a serialization failure: the same transaction may work a moment later."""
    damaged = "damaged"
    """Not a database, or a damaged one."""
    schema = "schema"
    """Tables missing or not posbias's."""
    refused = "refused"
    """A value or row the store will not take (too long, out of range, a constraint)."""


DriverError = sqlite3.Error | psycopg.Error
"""What the drivers raise where posbias uses them directly (COPY, executemany), below SQLAlchemy."""
STORE_ERRORS = (SQLAlchemyError, sqlite3.Error, psycopg.Error)
"""Everything a store operation may raise when the store fails: catch these, then `explain`."""

TRANSIENT = frozenset({Problem.unreachable, Problem.full, Problem.read_only, Problem.busy})
"""Problems a dispatcher waits out: the same write may succeed once the store recovers."""


class StoreError(PosbiasError):
    """The store could not do what was asked, with the fix on one line; `problem` says what kind."""

    def __init__(self, message: str, *, problem: Problem) -> None:
        super().__init__(message)
        self.problem = problem

    @property
    def transient(self) -> bool:
        """True when the store may take the same transaction once it recovers."""
        return self.problem in TRANSIENT


@dataclass(frozen=True)
class _Diagnosis:
    problem: Problem
    reason: str


_SQLITE_CODES = {
    "SQLITE_FULL": Problem.full,
    "SQLITE_READONLY": Problem.read_only,
    "SQLITE_READONLY_DBMOVED": Problem.read_only,
    "SQLITE_READONLY_DIRECTORY": Problem.read_only,
    "SQLITE_READONLY_RECOVERY": Problem.read_only,
    "SQLITE_READONLY_CANTLOCK": Problem.read_only,
    "SQLITE_BUSY": Problem.busy,
    "SQLITE_LOCKED": Problem.busy,
    "SQLITE_CANTOPEN": Problem.unreachable,
    "SQLITE_IOERR": Problem.unreachable,
    "SQLITE_NOTADB": Problem.damaged,
    "SQLITE_CORRUPT": Problem.damaged,
}


def _diagnose(exc: DBAPIError | DriverError) -> _Diagnosis:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    reason = _reason(orig)
    sqlstate = str(getattr(orig, "sqlstate", "") or "")
    if sqlstate:
        if sqlstate.startswith("08") or sqlstate in {"57P01", "57P02", "57P03", "53300"}:
            return _Diagnosis(Problem.unreachable, reason)
        if sqlstate in {"53100", "53200"}:
            return _Diagnosis(Problem.full, reason)
        if sqlstate == "25006":
            return _Diagnosis(Problem.read_only, reason)
        if sqlstate in {"40001", "40P01", "55P03", "57014"}:
            return _Diagnosis(Problem.busy, reason)
        if sqlstate.startswith("42") or sqlstate == "3F000":
            return _Diagnosis(Problem.schema, reason)
        if sqlstate.startswith(("22", "23")):
            return _Diagnosis(Problem.refused, reason)
    name = str(getattr(orig, "sqlite_errorname", "") or "")
    if name == "SQLITE_ERROR":  # SQLite's "SQL error": no such table, table already exists
        return _Diagnosis(Problem.schema, reason)
    for prefix, problem in _SQLITE_CODES.items():
        if name == prefix or name.startswith(prefix + "_"):
            return _Diagnosis(problem, reason)
    kind = type(orig).__name__
    if isinstance(exc, IntegrityError | DataError) or kind in {"IntegrityError", "DataError"}:
        return _Diagnosis(Problem.refused, reason)
    if isinstance(exc, ProgrammingError) or "no such table" in reason or "no such column" in reason:
        return _Diagnosis(Problem.schema, reason)
    invalidated = isinstance(exc, DBAPIError) and exc.connection_invalidated
    if (
        isinstance(exc, OperationalError | InterfaceError)
        or invalidated
        or kind in {"OperationalError", "InterfaceError"}
    ):
        return _Diagnosis(Problem.unreachable, reason)
    return _Diagnosis(Problem.refused, reason)


def _reason(orig: BaseException | None) -> str:
    """The driver's own message, first line only: never the statement or its parameters."""
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = str(primary or orig or "").strip()
    first = text.splitlines()[0].strip() if text else type(orig).__name__
    return first[:300]


def explain(exc: SQLAlchemyError | DriverError, *, url: str | URL | None = None) -> StoreError:
    """A store error (SQLAlchemy's, or a driver's raised on a bulk path below SQLAlchemy) as one line that
    names the fix, without the SQL statement or its parameters (those are for `--debug`). `url` names the
    store in the message."""
    try:
        where = f" at {describe(make_url(url))}" if url is not None else ""
    except (ArgumentError, ValueError):
        where = ""
    if not isinstance(exc, DBAPIError | DriverError):
        return StoreError(f"the store{where} failed: {one_line(exc, typed=True)}", problem=Problem.refused)
    found = _diagnose(exc)
    reason = found.reason
    start = "check the file's folder" if str(url or "").startswith("sqlite") else "start the server"
    messages = {
        Problem.unreachable: f"cannot open the database{where} ({reason}): {start}, or {URL_HINT}",
        Problem.full: f"the database{where} is full ({reason}): free space on its disk, then run the "
        "command again (nothing was written)",
        Problem.read_only: f"the database{where} is read-only ({reason}): point POSBIAS_DATABASE_URL at a "
        "writable database (the primary, not a replica) or fix the file's permissions",
        Problem.busy: f"the database{where} is busy ({reason}): run the command again",
        Problem.damaged: f"the database{where} is not a database or is damaged ({reason}): {URL_HINT}, or "
        "restore it from a backup",
        Problem.schema: f"the database{where} does not have posbias's tables as expected ({reason}): "
        f"{UPGRADE_HINT}, or {URL_HINT} (it may belong to another application)",
        Problem.refused: f"the database{where} refused a value ({reason}); nothing was written",
    }
    return StoreError(messages[found.problem], problem=found.problem)


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


_REVISION = re.compile(r'^(revision|down_revision)\b[^=\n]*=\s*(?:"([^"]+)"|None)\s*$', re.M)


@functools.cache
def revisions() -> dict[str, str | None]:
    """Every schema revision of the migrations package and the one it follows (None for the first), read
    from the scripts' `revision` and `down_revision` lines. Importing Alembic costs every command a few
    tenths of a second, and only `db upgrade` and `db downgrade` need it (a unit test checks that this
    reads what Alembic reads)."""
    found: dict[str, str | None] = {}
    for script in sorted((Path(next(iter(migrations.__path__))) / "versions").glob("[0-9]*.py")):
        fields = {name: value for name, value in _REVISION.findall(script.read_text(encoding="utf-8"))}
        found[fields["revision"]] = fields.get("down_revision") or None
    return found


def head() -> str:
    """The newest schema revision this posbias knows: the one no other revision follows."""
    followed = set(revisions().values())
    heads = [revision for revision in revisions() if revision not in followed]
    assert len(heads) == 1, f"the migrations package must have one head, not {heads}"
    return heads[0]


def _current_revision(connection: Connection) -> str | None:
    """The database's Alembic revision, as Alembic keeps it (`alembic_version`); None when it has none."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return str(found[0]) if found else None


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
    revision = _current_revision(connection)
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
        _check_sqlite_file(path)
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
            _check_sqlite_file(path)
        except PosbiasError:
            if path.is_file() and path.stat().st_size == 0:
                return None  # an empty file is an empty database; opening it is not asked for
            raise
    with _migration_connection(parsed, read_only=True, create=False) as connection:
        return _current_revision(connection)
