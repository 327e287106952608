"""The export read as columns (issue 39) writes what the export wrote row by row before it
(`support.reference_export`): the same CSV, byte for byte, and the same Parquet table, type for type and value
for value, for jobs of every shape on both stores; through ADBC in batches of a few rows (so that a column
NULL in a batch's first rows and a number later, and trials split between batches, are met), and through
SQLAlchemy where no driver is installed."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.job_runs import answer_every_shard
from support.reference_export import reference_csv, reference_table

from posbias.schemas import QuestionResult, ShardResult, ShardSpec, Submitted
from posbias.service.reports import export, export_columns
from posbias.service.reports.export_columns import RESULT_COLUMNS, arrow_schema, result_batches
from posbias.service.store import columns
from posbias.service.store.database import Database


def _varied(answer: Callable[..., ShardResult]) -> Callable[..., ShardResult]:
    """`answer`, with what engines leave out or add by trial: no option probabilities in the first trials
    (the fake engine's probabilities come later), answer slots, windows and visible layers in some, and
    probabilities that need exponents (1e-05, 2.5e-07) or are whole (0, 1)."""

    def varied(shard: ShardSpec, **how: Any) -> ShardResult:
        built = answer(shard, **how)
        rows: list[QuestionResult] = []
        for r in built.results:
            late = r.trial_index >= 3
            probs = (1e-05, 2.5e-07, 1.0, 0.33333333) if r.position % 3 == 0 else r.option_probs
            rows.append(
                r.model_copy(
                    update={
                        "option_probs": probs if late else None,
                        "gold_prob": (probs[r.gold] if probs else None) if late else None,
                        "answer_slot": r.position if r.trial_index % 2 else None,
                        "in_window": (r.position % 2 == 0) if r.trial_index % 3 else None,
                        "visible_layers": r.position if late else None,
                    }
                )
            )
        fields = built.model_dump(exclude={"answers"})
        return ShardResult.model_validate({**fields, "results": rows})

    return varied


SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "variants-filler-reverse": {
        "batch_sizes": (4,),
        "iterations": 2,
        "filler": {"tokens": [16], "where": "after", "position": 2},
        "answer_order": "reverse",
        "variants": ["baseline", {"name": "late-drop", "fake": {"last": 0.1}}],
    },
    "random-order": {"batch_sizes": (1, 3), "iterations": 6, "answer_order": "random"},
    "probe": {"batch_sizes": (3,), "iterations": 4, "design": "probe"},
    "rotation-sweep": {
        "batch_sizes": (3,),
        "iterations": 3,
        "design": "rotation",
        "filler": {"tokens": [0, 8]},
    },
}
"""The jobs compared: the default (batch sizes 2 and 3), two variants with filler and a reverse order, a
random order, probes and a rotation over two filler lengths."""


@pytest.fixture
def jobs(db: Database, make_job: Callable[..., Submitted], answer: Callable[..., ShardResult]) -> list[int]:
    """Every shape of `SHAPES` answered (varied, some answers unparsed, one trial skipped), and a job not
    run."""
    made = []
    for fields in SHAPES.values():
        job_id = make_job(db, **fields).job_id
        answer_every_shard(
            db,
            job_id,
            _varied(answer),
            unparsed=lambda trial, position: (trial + position) % 5 == 0,
            skip=lambda trial: trial == 1,
        )
        made.append(job_id)
    made.append(make_job(db, batch_sizes=(2,), iterations=1).job_id)
    return made


@pytest.fixture(params=["adbc", "sqlalchemy"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the columns are read: ADBC in batches of 3 rows, or SQLAlchemy (no driver) in chunks of 3."""
    monkeypatch.setattr(export_columns, "BATCH_ROWS", 3)  # the answers
    monkeypatch.setattr(columns, "BATCH_ROWS", 3)  # the trials
    if request.param == "sqlalchemy":
        monkeypatch.setattr(columns, "adbc_connection", lambda _db: None)
    return str(request.param)


def test_the_csv_is_the_row_by_row_exports_byte_for_byte(
    db: Database, jobs: list[int], reader: str, tmp_path: Path
) -> None:
    for job_id in jobs:
        path = tmp_path / f"job{job_id}.csv"
        summary = export.export_results(db, job_id, path=path)
        expected = reference_csv(db, job_id)
        assert path.read_bytes() == expected, f"job {job_id}"
        assert summary.rows == expected.count(b"\r\n") - 1


def test_the_parquet_table_is_the_row_by_row_exports(
    db: Database, jobs: list[int], reader: str, tmp_path: Path
) -> None:
    for job_id in jobs:
        path = tmp_path / f"job{job_id}.parquet"
        export.export_results(db, job_id, path=path)
        found, expected = pq.read_table(path), reference_table(db, job_id)
        assert found.schema == expected.schema == arrow_schema(RESULT_COLUMNS)
        _same(found, expected, f"job {job_id}")
    assert sum(pq.read_metadata(tmp_path / f"job{job_id}.parquet").num_rows for job_id in jobs) == sum(
        reference_table(db, job_id).num_rows for job_id in jobs
    )


def test_results_of_a_variant_or_a_batch_size_are_the_row_by_row_ones(
    db: Database, jobs: list[int], reader: str
) -> None:
    variants = jobs[1]
    for variant, batch_size in [("late-drop", None), ("baseline", 4), (None, 4), ("none-such", None)]:
        found = export.results_table(db, variants, variant=variant, batch_size=batch_size)
        expected = reference_table(db, variants, variant=variant, batch_size=batch_size)
        _same(found, expected, f"{variant} at {batch_size}")
    plain = jobs[0]
    _same(export.results_table(db, plain, batch_size=3), reference_table(db, plain, batch_size=3), "n=3")


def test_the_json_columns_are_lists_as_json_loads_reads_them(db: Database, jobs: list[int]) -> None:
    table = export.results_table(db, jobs[0])
    probs = [p for p in table["option_probs"].to_pylist() if p is not None]
    assert [1e-05, 2.5e-07, 1.0, 0.33333333] in probs and [None] not in probs
    assert table["option_probs"].null_count > 0 and table["gold_prob"].null_count > 0
    reverse = export.results_table(db, jobs[1])["answer_order"].to_pylist()
    assert set(map(tuple, reverse)) == {(4, 3, 2, 1)}
    assert table["answer_order"].null_count == table.num_rows  # forward: none stored


def test_a_stream_closed_early_ends_its_query(db: Database, jobs: list[int], reader: str) -> None:
    batches = result_batches(db, jobs[0])
    first = next(batches)
    assert first.num_rows > 0 and first.schema == arrow_schema(RESULT_COLUMNS)
    batches.close()  # type: ignore[attr-defined]
    with db.read() as session:  # the store is still readable (no cursor or lock left behind)
        assert session.connection().exec_driver_sql("SELECT count(*) FROM results").scalar()


def _same(found: pa.Table, expected: pa.Table, what: str) -> None:
    assert found.schema == expected.schema, what
    assert found.num_rows == expected.num_rows, what
    for name in found.column_names:
        got, want = found[name].to_pylist(), expected[name].to_pylist()
        assert _equal(got, want), f"{what}: column {name}"


def _equal(got: Any, want: Any) -> bool:
    """Equal, floats bit for bit (and NaN equal to NaN)."""
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_equal(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(got, float) and isinstance(want, float):
        return got.hex() == want.hex() or (math.isnan(got) and math.isnan(want))
    return bool(type(got) is type(want) and got == want)
