"""The store's connection: engines, sessions, and `connect`, which opens a store after checking it.

SQLite (the embedded default) runs in WAL mode with a busy timeout and foreign keys on; every write
transaction starts with `BEGIN IMMEDIATE`, so writers queue for the one write lock up front instead of failing
half-way. PostgreSQL goes through psycopg 3.

Next to it: URLs in `service.store.database_url`, errors in `service.store.store_errors`, the schema version
in `service.store.schema_version` and migrating it in `service.store.migrate`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from posbias.schemas import PosbiasError
from posbias.service.store.database_url import check_sqlite_file, describe, normalise_url, sqlite_path
from posbias.service.store.schema_version import check_schema
from posbias.service.store.sqlite_files import SqliteFiles

SQLITE_BUSY_TIMEOUT_MS = 30_000
IN_CHUNK = 1000
"""Ids per IN list at most: well under SQLite's and PostgreSQL's bound-parameter limits."""
POSTGRES_CONNECT_TIMEOUT_S = 10

# An execution option on the engine behind write sessions; the SQLite `begin` hook reads it.
_WRITE_OPTION = "posbias_write"


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


def _stored_json(text: str) -> Any:
    """A JSON column's value as read back from SQLite, which (unlike PostgreSQL) stores any text there."""
    try:
        return json.loads(text)
    except ValueError:
        raise PosbiasError(
            "the store holds a value that is not JSON where posbias wrote JSON (it was changed outside "
            "posbias): restore the database from a backup"
        ) from None


def create_db_engine(
    url: str | URL,
    *,
    foreign_keys: bool = True,
    read_only: bool = False,
    create: bool = True,
    files: SqliteFiles | None = None,
) -> Engine:
    """An engine with posbias's connection settings. `foreign_keys=False` is for SQLite migrations, whose
    batch mode drops and recreates tables (with foreign keys on, dropping a table would cascade).
    `read_only`: every transaction is read-only (PostgreSQL `default_transaction_read_only`, SQLite
    `query_only`), for commands that only look. `create=False`: a SQLite file that does not exist is an
    error, not a new empty file. `files`: a SQLite store's files, checked before every transaction
    (`service.store.sqlite_files`)."""
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
    connect_args = {} if files is None else {"factory": files.connection_factory()}
    engine = create_engine(target, json_deserializer=_stored_json, connect_args=connect_args)

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
        if files is not None:
            files.check_before_transaction()
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write and not read_only else "BEGIN")

    return engine


def _sqrt(value: float | None) -> float | None:
    return None if value is None or value < 0 else math.sqrt(value)


class Database:
    """An open store: an engine and its sessions. Use `connect` to get one that has been checked."""

    def __init__(self, engine: Engine, *, files: SqliteFiles | None = None) -> None:
        """`files`: a SQLite store's files, the engine's (`create_db_engine`)."""
        self.engine = engine
        self.files = files
        self._read = sessionmaker(engine, expire_on_commit=False)
        self.held: list[Any] = []
        """Connections another driver opened to this store and keeps until `close` (each has `close()`):
        `service/store/columns.py`'s ADBC readers of a SQLite file (why: its docstring)."""
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
        the database's write lock from its first statement. A SQLite store's transaction counts only if its
        file is still the one opened, before and after the commit (`StoreError` otherwise)."""
        with self._write() as session:
            with session.begin():
                yield session
                if self.files is not None:
                    self.files.check_database()  # rolled back: nothing goes to a file that replaced it
            if self.files is not None:
                self.files.check_database()  # committed to a file deleted meanwhile: it does not count

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading (rolled back on exit)."""
        with self._read() as session:
            yield session

    def close(self) -> None:
        """Close every pooled connection, and those other drivers keep (`held`)."""
        try:
            while self.held:
                self.held.pop().close()
        finally:
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
    files = None
    if path is not None:
        check_sqlite_file(path)
        files = SqliteFiles(path)
    engine = create_db_engine(parsed, read_only=read_only, create=False, files=files)
    try:
        check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return Database(engine, files=files)
