"""Exporting a job's results to a file: every result row with its trial's coordinates, as CSV or Parquet."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from posbias.schemas import ExportSummary, PosbiasError
from posbias.service import store
from posbias.service.database import Database

FORMATS = ("csv", "parquet")


def export_format(path: Path, format: str | None = None) -> str:
    """`format`, or the one `path`'s suffix names. `PosbiasError` when neither is csv or parquet."""
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise PosbiasError(
            f"the export format must be csv or parquet (got {fmt!r}): pass --format, or end --out in .csv or "
            ".parquet"
        )
    return fmt


def export_results(db: Database, job_id: int, *, path: Path, format: str | None = None) -> ExportSummary:
    """Write every result of `job_id` to `path` (through a temporary file renamed over it when complete).
    `NotFoundError` when there is no such job."""
    fmt = export_format(path, format)
    rows = store.export_results(db, job_id)
    written = _write_csv(rows, path) if fmt == "csv" else _write_parquet(rows, path)
    return ExportSummary(job_id=job_id, path=path, format=fmt, rows=written)


def _write_csv(rows: Iterator[store.ExportRow], path: Path) -> int:
    count = 0
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(store.EXPORT_COLUMNS)
        for row in rows:
            writer.writerow([json.dumps(v) if isinstance(v, list) else ("" if v is None else v) for v in row])
            count += 1
    tmp.replace(path)
    return count


def _write_parquet(rows: Iterator[store.ExportRow], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([row._asdict() for row in rows])
    if table.num_rows == 0:
        table = pa.Table.from_pylist([], schema=pa.schema([(c, pa.null()) for c in store.EXPORT_COLUMNS]))
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return int(table.num_rows)
