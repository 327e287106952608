"""Exporting a job's results to a file: every result row with its trial's coordinates and the job's model,
variant, design and filler, as CSV or Parquet; the same rows (and one row per trial) as Arrow tables for
`posbias.results` and `posbias.trials`.

Every export has one schema whatever the job: the columns of `RESULT_COLUMNS`, in that order, with those
Arrow types (a column a job has no value for is null, never a column of another type), so the Parquet files
of different jobs read as one table (`pandas.read_parquet(folder)`, DuckDB's `read_parquet('dir/*.parquet')`)
with no options. The rows go from the database cursor to the file in Arrow record batches
(`export_columns.result_batches`), a Parquet row group or a block of CSV lines (`csv_text`) per batch: a
million results are a few batches, never a Python object each, and memory holds one batch.

Where the rows go decides how they are written. A new path, or an existing regular file (only with
`overwrite`), gets a temporary file beside it that is renamed over it once complete, so a reader never sees
half an export and a failed one leaves nothing behind. A device or a pipe (`/dev/stdout`, `/dev/null`, a
FIFO) is written to directly: renaming a file over it would replace the node itself. A symbolic link is
followed (the file it points to is written, the link stays). Folders, block devices and sockets are refused.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import case, func, select

from posbias.schemas import ConflictError, ExportSummary, ParseStatus, PosbiasError
from posbias.service.reports import csv_text
from posbias.service.reports.export_columns import RESULT_COLUMNS as RESULT_COLUMNS
from posbias.service.reports.export_columns import TRIAL_COLUMNS as TRIAL_COLUMNS
from posbias.service.reports.export_columns import arrow_schema, job_values, result_batches
from posbias.service.store import Database, tables

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

FORMATS = ("csv", "parquet")


class OutputExists(ConflictError):
    """The export's target is an existing file and overwriting was not asked for."""


def export_format(path: Path, format: str | None = None) -> str:
    """`format`, or the one `path`'s suffix names. `PosbiasError` when neither is csv or parquet."""
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise PosbiasError(
            f"the export format must be csv or parquet (got {fmt[:20]!r}): pass --format, or end --out in "
            ".csv or .parquet"
        )
    return fmt


@dataclass(frozen=True)
class Target:
    """Where an export writes: `path` itself (a device or pipe), or a temporary file renamed to `path`."""

    path: Path
    through: bool
    """Write to `path` directly (a device or a pipe) instead of through a temporary file."""
    mode: int | None = None
    """Permissions to give the new file (those of the file it replaces); None for a new file's default."""


def target(path: Path, *, overwrite: bool) -> Target:
    """How an export to `path` is written; `PosbiasError` naming the fix when it cannot be (a missing
    folder, a folder, a block device), `OutputExists` for an existing file without `overwrite`."""
    try:
        info = os.stat(path)  # follows symbolic links: what a write would reach
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise PosbiasError(f"cannot export to {path}: {exc.strerror}") from None
    if info is None:
        real = Path(os.path.realpath(path))  # a dangling link: create the file it points to
        folder = real.parent
        if not folder.is_dir():
            raise PosbiasError(f"the folder {folder} does not exist: create it, or choose another --out")
        return Target(path=real, through=False)
    if stat.S_ISDIR(info.st_mode):
        raise PosbiasError(f"{path} is a folder: give a file name, e.g. --out {path / 'results.csv'}")
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode):
        return Target(path=path, through=True)
    if not stat.S_ISREG(info.st_mode):
        kind = "a block device" if stat.S_ISBLK(info.st_mode) else "a socket or other special file"
        raise PosbiasError(f"{path} is {kind}: posbias does not write over it; choose another --out")
    real = Path(os.path.realpath(path))
    if real.parts[:2] == ("/", "proc"):
        return Target(path=path, through=True)  # /dev/stdout redirected to a file: write to the descriptor
    if not overwrite:
        raise OutputExists(f"{path} exists: pass --force to replace it, or choose another --out")
    return Target(path=real, through=False, mode=stat.S_IMODE(info.st_mode))


def export_results(
    db: Database, job_id: int, *, path: Path, format: str | None = None, overwrite: bool = False
) -> ExportSummary:
    """Write every result of `job_id` to `path` (see the module's docstring for how). `NotFoundError`
    when there is no such job; nothing is created then."""
    fmt = export_format(path, format)
    where = target(path, overwrite=overwrite)
    batches = result_batches(db, job_id, json_text=fmt == "csv")
    try:
        with _opened(where) as handle:
            written = _write_csv(batches, handle) if fmt == "csv" else _write_parquet(batches, handle)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a stream cut short still ends its query (and its server-side cursor)
    return ExportSummary(job_id=job_id, path=path, format=fmt, rows=written)


@contextlib.contextmanager
def _opened(where: Target) -> Iterator[IO[bytes]]:
    """A binary handle on `where`; for a temporary file, renamed over the target on success and removed on
    failure."""
    if where.through:
        with open(where.path, "wb") as handle:
            yield handle
        return
    fd, name = tempfile.mkstemp(dir=where.path.parent, prefix=f".{where.path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.chmod(name, where.mode if where.mode is not None else 0o666 & ~_umask())
        os.replace(name, where.path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_csv(batches: Iterator[pa.RecordBatch], handle: IO[bytes]) -> int:
    count = 0
    handle.write(csv_text.header([name for name, _ in RESULT_COLUMNS]))
    for batch in batches:
        handle.write(csv_text.lines(batch))
        count += batch.num_rows
    return count


def _write_parquet(batches: Iterator[pa.RecordBatch], handle: IO[bytes]) -> int:
    import pyarrow.parquet as pq

    schema = arrow_schema(RESULT_COLUMNS)
    count = 0
    with pq.ParquetWriter(handle, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)  # a row group per batch (`export_columns.BATCH_ROWS` rows at most)
            count += batch.num_rows
        if count == 0:
            writer.write_table(schema.empty_table())
    return count


def results_table(
    db: Database, job_id: int, *, variant: str | None = None, batch_size: int | None = None
) -> pa.Table:
    """Every result of `job_id` (of one variant, of one batch size) as an Arrow table of
    `RESULT_COLUMNS`. `NotFoundError` when there is no such job."""
    import pyarrow as pa

    batches = list(result_batches(db, job_id, variant=variant, batch_size=batch_size))
    return pa.Table.from_batches(batches, schema=arrow_schema(RESULT_COLUMNS))


def trials_table(
    db: Database, job_id: int, *, variant: str | None = None, batch_size: int | None = None
) -> pa.Table:
    """Every trial of `job_id` (of one variant, of one batch size) as an Arrow table of `TRIAL_COLUMNS`,
    in trial order. `NotFoundError` when there is no such job."""
    job = job_values(db, job_id)
    t, r = tables.Trial, tables.Result
    counts = (
        select(
            r.trial_id,
            func.count().label("answers"),
            func.sum(case((r.parse_status == ParseStatus.ok, 1), else_=0)).label("parsed"),
            func.sum(case((r.correct, 1), else_=0)).label("correct"),
        )
        .where(r.job_id == job_id)
        .group_by(r.trial_id)
        .subquery()
    )
    query = (
        select(t, counts.c.answers, counts.c.parsed, counts.c.correct)
        .outerjoin(counts, counts.c.trial_id == t.id)
        .where(t.job_id == job_id)
        .order_by(t.index)
    )
    if variant is not None:
        query = query.where(t.variant == variant)
    if batch_size is not None:
        query = query.where(t.batch_size == batch_size)
    rows: list[list[Any]] = []
    with db.read() as session:
        for trial, answers, parsed, correct in session.execute(query):
            values = {
                **job,
                "job_id": job_id,
                "variant": trial.variant,
                "trial_id": trial.id,
                "trial_index": trial.index,
                "batch_size": trial.batch_size,
                "iteration": trial.iteration,
                "rotation": trial.rotation,
                "answer_order": trial.answer_order,
                "probe_position": trial.probe_position,
                "filler_tokens": trial.filler_tokens,
                "filler_token_start": trial.filler_token_start,
                "filler_token_end": trial.filler_token_end,
                "question_ids": trial.question_ids,
                "status": trial.status.value,
                "skip_reason": trial.skip_reason,
                "prompt_tokens": trial.prompt_tokens,
                "output_tokens": trial.output_tokens,
                "output_text": trial.output_text,
                "answers": int(answers or 0),
                "parsed": int(parsed or 0),
                "correct": int(correct or 0),
            }
            rows.append([values[name] for name, _ in TRIAL_COLUMNS])
    return _table(rows, arrow_schema(TRIAL_COLUMNS))


def _table(rows: list[list[Any]], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.names]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """`table` as a DataFrame whose types do not depend on the values: integers `Int64` and booleans
    `boolean` (missing values stay missing, never a float column), texts `string`, lists as arrays."""
    import pandas as pd
    import pyarrow as pa

    mapping = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype(), pa.string(): pd.StringDtype()}
    frame: pd.DataFrame = table.to_pandas(types_mapper=mapping.get)
    return frame
