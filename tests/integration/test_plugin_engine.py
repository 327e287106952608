"""A plug-in engine (the toy of `support/toy_engine`) runs a real job through the queue: submitted through the
API in this process, where the test registers it, and dispatched by `posbias worker` in a process of its own,
which finds it as an installed package would declare it (the entry-point group `posbias.engines`). The
dispatcher places its actor, hands it the declaration, and the toy's answers are stored."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from support import toy_engine
from support.job_runs import summary_of, worker_process
from support.results import expected_rows, result_rows

import posbias
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.store.tables import JobStatus
from posbias.service.work import jobs
from posbias.workers import engines

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy() -> Iterator[engines.EngineDeclaration]:
    yield engines.register(toy_engine.DECLARATION)
    engines.unregister(toy_engine.NAME)


def _installed(folder: Path) -> Path:
    """A folder that, on the path, makes the toys installed plug-ins: a distribution's metadata declaring them
    under the entry-point group `posbias.engines`."""
    info = folder / "toy_engine_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engine-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[posbias.engines]\n{toy_engine.NAME} = support.toy_engine:DECLARATION\n"
        f"{toy_engine.DYING_NAME} = support.toy_engine:DYING\n"
    )
    return folder


# The plug-in path is the same on either store: SQLite alone keeps the suite shorter.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_plug_in_engine_runs_a_job_whose_answers_are_stored(
    toy: engines.EngineDeclaration,
    db: Database,
    fast_settings: Callable[..., Settings],
    mmlu_dir: Path,
    tmp_path: Path,
) -> None:
    settings = fast_settings(db.url, mmlu_dir=mmlu_dir)
    spec = {
        "model": "toy/model",
        "engine": {"name": toy.name},
        "batch_sizes": [2, 3],
        "iterations": 2,
        "shard_size": 2,
    }
    job = posbias.submit(spec, settings=settings).job_id

    path = os.pathsep.join([str(TESTS), str(_installed(tmp_path / "site")), os.environ.get("PYTHONPATH", "")])
    summary = summary_of(worker_process(db.url, tmp_path, "--until-empty", PYTHONPATH=path))

    assert jobs.get(db, job).status is JobStatus.done
    assert summary["shards_failed"] == 0
    rows, distinct = result_rows(db, job)
    assert rows == distinct == expected_rows(db, job) == 2 * (2 + 3)
    with db.read() as session:
        predicted = session.execute(
            text("SELECT DISTINCT predicted FROM results WHERE job_id = :j"), {"j": job}
        ).scalars()
        assert list(predicted) == [0], "the toy answers the first option everywhere"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_engine_whose_every_actor_dies_at_load_fails_its_job_and_the_worker_ends(
    db: Database,
    fast_settings: Callable[..., Settings],
    mmlu_dir: Path,
    tmp_path: Path,
) -> None:
    # Before, the pool kept the reason ("every worker for this model died") but no job was failed with it:
    # `posbias worker --until-empty` waited for ever on shards no actor would run.
    settings = fast_settings(db.url, mmlu_dir=mmlu_dir)
    engines.register(toy_engine.DYING)
    try:
        spec = {"model": "toy/model", "engine": {"name": toy_engine.DYING_NAME}, "batch_sizes": [2]}
        job = posbias.submit({**spec, "iterations": 2}, settings=settings).job_id
    finally:
        engines.unregister(toy_engine.DYING_NAME)

    path = os.pathsep.join([str(TESTS), str(_installed(tmp_path / "site")), os.environ.get("PYTHONPATH", "")])
    summary = summary_of(worker_process(db.url, tmp_path, "--until-empty", PYTHONPATH=path), timeout=180)

    record = jobs.get(db, job)
    assert record.status is JobStatus.failed
    assert record.error is not None and ("died" in record.error or "failed to load" in record.error)
    assert summary["results_written"] == 0
