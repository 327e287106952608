"""A job as DataFrames and Parquet files, on SQLite and PostgreSQL: `posbias.results` (one row per answer) and
`posbias.trials` (one row per trial, its raw output included) carry the job's model, variant, design and
filler, with types that do not depend on the values; the Parquet exports of different jobs (filler or none,
finished or not started) have one schema, so DuckDB and pandas read a folder of them as one table with no
options."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.job_runs import answer_every_shard

import posbias
from posbias.schemas import NotFoundError, ShardResult, Submitted
from posbias.service.reports import export
from posbias.service.store.database import Database


@pytest.fixture
def three_jobs(
    db: Database, make_job: Callable[..., Submitted], answer: Callable[..., ShardResult]
) -> list[int]:
    """A finished plain job (20 results), a finished filler job with two variants (2 x 8 results, missing
    option probabilities on none), and a job not run yet (no results)."""
    plain = make_job(db).job_id
    answer_every_shard(db, plain, answer)
    filler = make_job(
        db,
        batch_sizes=(4,),
        iterations=2,
        filler={"tokens": [16], "where": "after", "position": 2},
        answer_order="reverse",
        variants=["baseline", {"name": "late-drop", "fake": {"last": 0.1}}],
    ).job_id
    answer_every_shard(db, filler, answer, unparsed=lambda trial, position: position == 3)
    waiting = make_job(db, batch_sizes=(2,), iterations=1).job_id
    return [plain, filler, waiting]


def test_results_and_trials_are_typed_frames_with_the_jobs_settings(
    database_url: str, three_jobs: list[int], tmp_path: Path
) -> None:
    settings = posbias.Settings(database_url=database_url, cache_dir=tmp_path)
    plain, filler, waiting = three_jobs
    answers = posbias.results(filler, settings=settings)
    assert len(answers) == 16
    assert set(answers.variant) == {"baseline", "late-drop"}
    assert set(answers.model) == {"fake/model"} and set(answers.design) == {"random"}
    assert set(answers.filler_where) == {"after"} and set(answers.filler_position) == {2}
    assert set(answers.answer_order_kind) == {"reverse"}
    assert answers.predicted.isna().sum() == 4  # position 3 unparsed in each of 4 trials
    assert str(answers.predicted.dtype) == "Int64" and str(answers.correct.dtype) == "boolean"
    assert str(posbias.results(plain, settings=settings).filler_position.dtype) == "Int64"

    one = posbias.results(filler, variant="late-drop", settings=settings)
    assert set(one.variant) == {"late-drop"} and len(one) == 8

    prompts = posbias.trials(filler, settings=settings)
    assert len(prompts) == 4 and set(prompts.status) == {"done"}
    assert all(text.startswith("1. 1") for text in prompts.output_text)
    assert list(prompts.answers) == [4] * 4 and list(prompts.parsed) == [3] * 4
    assert set(prompts.trial_id) == set(answers.trial_id)
    assert list(posbias.trials(waiting, settings=settings).status) == ["planned"]
    assert posbias.results(waiting, settings=settings).empty
    with pytest.raises(NotFoundError, match="there is no job 999"):
        posbias.results(999, settings=settings)


def test_exports_of_different_jobs_read_as_one_table(
    db: Database, three_jobs: list[int], tmp_path: Path
) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    for job_id in three_jobs:
        export.export_results(db, job_id, path=folder / f"job{job_id}.parquet")
    schemas = {str(pq.read_schema(path)) for path in folder.iterdir()}
    assert len(schemas) == 1  # the empty job's file too

    rows = duckdb.sql(
        f"SELECT job_id, variant, count(*) AS n FROM read_parquet('{folder}/*.parquet') GROUP BY ALL"
    )
    counts = {(job, variant): n for job, variant, n in rows.fetchall()}
    plain, filler, _ = three_jobs
    assert counts == {(plain, "baseline"): 20, (filler, "baseline"): 8, (filler, "late-drop"): 8}
    both = pd.read_parquet(folder)
    assert len(both) == 36 and list(both.columns) == [name for name, _ in export.RESULT_COLUMNS]
    nulls = duckdb.sql(f"SELECT count(*) FROM read_parquet('{folder}/*.parquet') WHERE predicted IS NULL")
    assert nulls.fetchall() == [(4,)]
