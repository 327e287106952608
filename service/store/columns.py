"""Rows out of the store as columns: a query's result as Arrow record batches, never a Python object per row.

The analyses read a job's answers as arrays (a million results is a few columns of a million numbers), so
the store hands them over the way the database drivers of Apache Arrow (ADBC) read them: SQLite's and
PostgreSQL's drivers fill Arrow buffers in C (PostgreSQL's through binary `COPY`), in batches, about four
times faster than SQLAlchemy's rows on SQLite and without a Python tuple per row. Where no ADBC driver is
installed for the store (another database, a platform without the wheels) the same batches come from
SQLAlchemy in chunks: slower, the same arrays, the same bounded memory. The drivers are driven through ADBC's
low-level bindings (`adbc_driver_manager`), not its DB-API module, which imports `pyarrow.dataset` (and
through it pandas): a tenth to a third of a second of every view's start, for nothing a read uses.

A SQLite store's ADBC readers stay open as long as the store (`Database.held`, closed by `Database.close`),
and are lent out one query at a time. The driver links its own copy of SQLite, and a process's POSIX locks
on a file belong to the process, not to a library: when one copy closes its descriptors of the database and
its `-shm`, the locks the other copy (Python's `sqlite3`, which the store's sessions use) holds there are
gone too. Another process closing its last connection then finds itself the last one, checkpoints and
deletes the `-shm` that this process still has mapped; its next transaction stops on "the store's
shared-memory file was deleted" (`sqlite_files.py`), and a reader and a short command at once, or the viewer
and any command, met it. A reader opened once and closed with the store closes nothing in between.

Why not DuckDB (which scans SQLite, PostgreSQL and Parquet): its SQLite and PostgreSQL scanners are
extensions it downloads on first use, which neither this machine nor an air-gapped cluster can do.

One rule for queries read here: a nullable column is selected through `filled` (a sentinel for NULL), since
SQLite's driver infers a column's type from its first rows and refuses a later row of another type (a
`gold_prob` that is NULL for a thousand rows and then a number).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from sqlalchemy import func
from sqlalchemy.sql import Select

from posbias.service.store.database import Database
from posbias.service.store.database_url import sqlite_path

BATCH_ROWS = 262_144
"""Rows per batch (SQLite's driver; the fallback's chunks): 262k rows of a few columns is a few MB."""


def filled(column: Any, sentinel: float | str) -> Any:
    """`column`, with NULL read as `sentinel` (see the module's docstring)."""
    return func.coalesce(column, sentinel)


def record_batches(
    db: Database, query: Select[*tuple[Any, ...]], *, batch_rows: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of `query` as Arrow record batches, in the query's order, column names as labelled; of
    `batch_rows` rows at most on SQLite and through SQLAlchemy (by default `BATCH_ROWS`; PostgreSQL's driver
    sizes its own). Empty batches are skipped; no rows, no batches."""
    rows = batch_rows or BATCH_ROWS
    with _lent(db) as connection:
        if connection is None:
            yield from _sqlalchemy_batches(db, query, batch_rows=rows)
            return
        sql = str(query.compile(dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}))
        names = [c.name for c in query.selected_columns]
        for batch in connection.batches(sql, batch_rows=rows):
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(batch.columns, names=names)


_LENDING = threading.Lock()


@contextmanager
def _lent(db: Database) -> Iterator[AdbcReader | None]:
    """An ADBC reader of `db` for one query, or None where there is no driver. PostgreSQL's is opened and
    closed; a SQLite store's is one of those it holds, or a new one it then holds (the module's docstring)."""
    if db.files is None:
        reader = adbc_connection(db)
        if reader is None:
            yield None
            return
        with reader:
            yield reader
        return
    db.files.check_database()  # a held reader reads the file opened, as the store's sessions do
    with _LENDING:
        reader = next((r for r in db.held if isinstance(r, AdbcReader) and not r.lent), None)
        if reader is not None:
            reader.lent = True
    if reader is None:
        reader = adbc_connection(db)
        if reader is None:
            yield None
            return
        reader.lent = True
        with _LENDING:
            db.held.append(reader)
    try:
        yield reader
    finally:
        reader.lent = False


def to_numpy(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any]:
    """An Arrow column as a numpy array: a column of numbers without NULLs by DLPack (no copy), booleans from
    their bits, anything else by pyarrow's `to_numpy`, which imports pandas (a fifth of a second of a
    view's start) the first time it is called, for nothing a column of numbers needs. The array may be
    read-only."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if len(column) and not column.null_count:
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            return np.from_dlpack(column)
        if pa.types.is_boolean(kind):
            bits = np.frombuffer(column.buffers()[1], dtype=np.uint8)
            end = column.offset + len(column)
            return np.unpackbits(bits, count=end, bitorder="little")[column.offset :].astype(bool)
    return np.asarray(column.to_numpy(zero_copy_only=False))


def read_table(db: Database, query: Select[*tuple[Any, ...]]) -> pa.Table:
    """The rows of `query` as one Arrow table (for results whose size is bounded: per trial, per point)."""
    names = [c.name for c in query.selected_columns]
    batches = list(record_batches(db, query))
    if not batches:
        return pa.table({name: pa.array([], type=pa.null()) for name in names})
    return pa.Table.from_batches(batches)


class AdbcReader:
    """A read connection by ADBC to a store's database (its driver's database and connection handles):
    `batches` runs a query; closed on leaving a `with` block."""

    def __init__(self, database: Any, *, dialect: str) -> None:
        import adbc_driver_manager

        self.dialect = dialect
        self.lent = False
        """In use by a query (a held reader is lent to one at a time)."""
        self._database = database
        try:
            self._connection = adbc_driver_manager.AdbcConnection(database)
        except BaseException:
            database.close()
            raise

    def batches(self, sql: str, *, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows of `sql` as Arrow record batches (of `batch_rows` rows on SQLite)."""
        import adbc_driver_manager

        statement = adbc_driver_manager.AdbcStatement(self._connection)
        try:
            if self.dialect == "sqlite":
                statement.set_options(**{"adbc.sqlite.query.batch_rows": str(batch_rows)})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            yield from pa.RecordBatchReader.from_stream(stream)
        finally:
            statement.close()

    def close(self) -> None:
        try:
            self._connection.close()
        finally:
            self._database.close()

    def __enter__(self) -> AdbcReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def adbc_connection(db: Database) -> AdbcReader | None:
    """A read connection by ADBC to `db`'s database, or None where there is no driver for it (the tests set
    this to a function that always says None, to read through SQLAlchemy)."""
    url = db.engine.url
    try:
        if db.dialect == "sqlite":
            import adbc_driver_sqlite

            path = db.files.path if db.files is not None else sqlite_path(url)
            if path is None:  # an in-memory store: only its own connection sees it
                return None
            uri = f"file:{quote(str(path.absolute()))}?mode=ro"
            return AdbcReader(adbc_driver_sqlite.connect(uri), dialect="sqlite")
        if db.dialect == "postgresql":
            import adbc_driver_postgresql

            uri = url.set(drivername="postgresql").render_as_string(hide_password=False)
            return AdbcReader(adbc_driver_postgresql.connect(uri), dialect="postgresql")
    except ImportError:
        return None
    return None


def _sqlalchemy_batches(
    db: Database, query: Select[*tuple[Any, ...]], *, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    names = [c.name for c in query.selected_columns]
    with db.read() as session:
        result = session.execute(query.execution_options(yield_per=batch_rows))
        try:
            for rows in result.partitions():
                columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
                yield pa.RecordBatch.from_arrays([pa.array(c) for c in columns], names=names)
        finally:
            result.close()
