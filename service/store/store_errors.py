"""What went wrong with the store, on one line: a driver's or SQLAlchemy's error as a `StoreError` that names
the fix and says what kind of problem it is (`Problem`), without the SQL statement or its parameters.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, make_url
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

from posbias.schemas import NotFoundError, PosbiasError, one_line
from posbias.service.store.database_url import UPGRADE_HINT, URL_HINT, describe


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
    changed = "changed"
    """A SQLite store's file or its shared-memory file was deleted, replaced, truncated or made unwritable
    while open (`service.store.sqlite_files`): nothing more may be written through that handle."""


if TYPE_CHECKING:
    import psycopg

    DriverError = sqlite3.Error | psycopg.Error
    """What the drivers raise where posbias uses them directly (COPY, executemany), below SQLAlchemy."""
    STORE_ERRORS: tuple[type[SQLAlchemyError], type[sqlite3.Error], type[psycopg.Error]]
    """Everything a store operation may raise when the store fails: catch these, then `explain`."""
else:

    def __getattr__(name: str) -> Any:
        # `DriverError` and `STORE_ERRORS` name psycopg's error type, so they are made when first asked
        # for: a command on a SQLite store (that asks for neither unless something failed) does not
        # import psycopg, a twentieth of a second of every command's start.
        if name == "DriverError":
            value: Any = sqlite3.Error | _driver_errors()[1]
        elif name == "STORE_ERRORS":
            value = (SQLAlchemyError, *_driver_errors())
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value


def _driver_errors() -> tuple[type[sqlite3.Error], type[psycopg.Error]]:
    """The drivers' base errors (sqlite3's, psycopg's): `DriverError` as a tuple for `isinstance`."""
    import psycopg

    return sqlite3.Error, psycopg.Error


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
    sqlite_error, psycopg_error = _driver_errors()
    if not isinstance(exc, DBAPIError | sqlite_error | psycopg_error):
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


def not_found(job_id: int) -> NotFoundError:
    """The error for a job id that names no job."""
    return NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
