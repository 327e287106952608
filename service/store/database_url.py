"""Database URLs: checking and normalising the one posbias is given (POSBIAS_DATABASE_URL), showing it
without its password, and checking a SQLite URL's file before it is opened; with the hints the store's error
messages name.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from posbias.schemas import PosbiasError

UPGRADE_HINT = "run `posbias db upgrade`"
URL_HINT = "check POSBIAS_DATABASE_URL"
DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg",)}
"""The database drivers posbias ships with, by backend; the first is the default."""
URL_EXAMPLES = "e.g. sqlite:///posbias.db or postgresql+psycopg://user:pass@host/db"


def normalise_url(url: str | URL) -> URL:
    """Parse a database URL and check it names a store posbias can open: SQLite, or PostgreSQL through
    psycopg 3 (`postgresql://` and `postgres://` become `postgresql+psycopg://`), with a port in range.
    `PosbiasError` naming the fix otherwise, before any driver is loaded."""
    if isinstance(url, str) and ("\x00" in url or not url.strip()):
        raise PosbiasError(f"the database URL is empty or holds a NUL character: {URL_HINT} ({URL_EXAMPLES})")
    if isinstance(url, str) and any(ord(char) < 0x20 or char == "\x7f" for char in url):
        # A newline would otherwise become part of a file name or a database name: a new, empty store.
        raise PosbiasError(
            f"the database URL holds a control character (CR, LF, tab): {URL_HINT} on one line"
        )
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
    """The file of a SQLite URL (also of the `file:` URI posbias opens a store read-only with); None for
    PostgreSQL and in-memory SQLite."""
    if url.get_backend_name() != "sqlite" or url.database in {None, "", ":memory:"}:
        return None
    database = str(url.database)
    if database.startswith("file:") and url.query.get("uri") == "true":
        return Path(unquote(database.removeprefix("file:")))
    return Path(database)


def describe(url: URL) -> str:
    """The URL as it may be shown to a user: without its password (and a SQLite file as a path, not the
    `file:` URI posbias opens it with)."""
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database.startswith("file:") and url.query.get("uri") == "true":
        url = url.set(database=unquote(database.removeprefix("file:")), query={})
    return url.render_as_string(hide_password=True)


def check_sqlite_file(path: Path) -> None:
    """Raise `PosbiasError` naming the fix unless `path` is a SQLite file posbias may open: one that exists,
    is a regular file and is not empty (nothing is created)."""
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
