"""A job's export as it was written before the columnar path (issue 39): rows through SQLAlchemy, one Python
object per answer, into `csv.writer` or Arrow arrays built from Python lists. Kept only as the reference the
columnar export (`service.reports.export_columns`, `csv_text`) must equal, byte for byte in CSV and value for
value in Arrow (tests/integration/test_export_columns.py, and the export cells of the view matrices)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pyarrow as pa
from sqlalchemy import select

from posbias.schemas import ParseStatus
from posbias.service.reports.export_columns import RESULT_COLUMNS, arrow_schema, job_values
from posbias.service.store import Database, Result, Trial

_EXPORTED = (
    Result.job_id,
    Result.variant,
    Result.trial_id,
    Trial.index,
    Result.batch_size,
    Trial.iteration,
    Trial.rotation,
    Trial.answer_order,
    Trial.probe_position,
    Trial.filler_tokens,
    Trial.filler_token_start,
    Trial.filler_token_end,
    Result.position,
    Result.answer_slot,
    Result.question_id,
    Result.subject,
    Result.gold,
    Result.predicted,
    Result.correct,
    Result.parse_status,
    Trial.prompt_tokens,
    Result.question_token_start,
    Result.question_token_end,
    Result.answer_token_index,
    Result.token_distance,
    Result.rope_distance,
    Result.in_window,
    Result.visible_layers,
    Result.gold_prob,
    Result.option_probs,
)
_NAMES = (
    "job_id",
    "variant",
    "trial_id",
    "trial_index",
    *(column.key for column in _EXPORTED[4:]),
)


def reference_rows(
    db: Database, job_id: int, *, variant: str | None = None, batch_size: int | None = None
) -> list[list[Any]]:
    """What `queries.export_results` streamed at 6b0a117, each row's values in `RESULT_COLUMNS` order."""
    job = {"job_id": job_id, **job_values(db, job_id)}
    query = (
        select(*_EXPORTED)
        .join(Trial, Trial.id == Result.trial_id)
        .where(Result.job_id == job_id)
        .order_by(Trial.index, Result.position)
    )
    rows: list[list[Any]] = []
    with db.read() as session:
        for found in session.execute(query):
            values = dict(zip(_NAMES, found, strict=True))
            values["parse_status"] = ParseStatus(str(values["parse_status"])).value
            if (variant is None or values["variant"] == variant) and (
                batch_size is None or values["batch_size"] == batch_size
            ):
                values.update(job)
                rows.append([values[name] for name, _ in RESULT_COLUMNS])
    return rows


def reference_csv(db: Database, job_id: int) -> bytes:
    """The CSV file `export_results` wrote at 6b0a117."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow([name for name, _ in RESULT_COLUMNS])
    for values in reference_rows(db, job_id):
        writer.writerow([json.dumps(v) if isinstance(v, list) else ("" if v is None else v) for v in values])
    return text.getvalue().encode()


def reference_table(
    db: Database, job_id: int, *, variant: str | None = None, batch_size: int | None = None
) -> pa.Table:
    """The Arrow table (Parquet's, `posbias.results`') of `RESULT_COLUMNS` at 6b0a117."""
    schema = arrow_schema(RESULT_COLUMNS)
    rows = reference_rows(db, job_id, variant=variant, batch_size=batch_size)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.names]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )
