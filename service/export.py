"""Exporting a job's results to a file: every result row with its trial's coordinates, as CSV or Parquet.

Where the rows go decides how they are written. A new path, or an existing regular file (only with
`overwrite`), gets a temporary file beside it that is renamed over it once complete, so a reader never sees
half an export and a failed one leaves nothing behind. A device or a pipe (`/dev/stdout`, `/dev/null`, a
FIFO) is written to directly: renaming a file over it would replace the node itself. A symbolic link is
followed (the file it points to is written, the link stays). Folders, block devices and sockets are refused.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from posbias.schemas import ConflictError, ExportSummary, PosbiasError
from posbias.service import queries
from posbias.service.database import Database

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
    rows = queries.export_results(db, job_id)
    try:
        with _opened(where) as handle:
            written = _write_csv(rows, handle) if fmt == "csv" else _write_parquet(rows, handle)
    finally:
        close = getattr(rows, "close", None)
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


def _write_csv(rows: Iterator[queries.ExportRow], handle: IO[bytes]) -> int:
    count = 0
    text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
    try:
        writer = csv.writer(text)
        writer.writerow(queries.EXPORT_COLUMNS)
        for row in rows:
            writer.writerow([json.dumps(v) if isinstance(v, list) else ("" if v is None else v) for v in row])
            count += 1
        text.flush()
    finally:
        text.detach()  # the caller closes (or renames) the file
    return count


def _write_parquet(rows: Iterator[queries.ExportRow], handle: IO[bytes]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([row._asdict() for row in rows])
    if table.num_rows == 0:
        table = pa.Table.from_pylist([], schema=pa.schema([(c, pa.null()) for c in queries.EXPORT_COLUMNS]))
    pq.write_table(table, handle)
    return int(table.num_rows)
