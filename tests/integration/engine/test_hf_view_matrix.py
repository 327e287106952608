"""Jobs of the `hf` engine in every view of the view matrix (issue 37; the cells are
tests/support/view_cells.py's), and in every view of their attention evidence (docs/attention.md).

Two jobs of the same trials on the tiny Gemma 2 (a sliding window of 64 tokens on two of its four layers),
run by `posbias worker` through the session's Ray: `hf`, as a user submits one (the gold answer sheet), and
`hf-gap`, with a position gap (`engine.position_gap`, which only `hf` takes) and the fixed answer sheet
(option 1 everywhere, so most answers are wrong). Each is shown in every view; the two are compared as a
pair; both are listed.

SQLite only: the views' store-dependent paths are the fake engine's matrix's, on both stores
(tests/e2e/test_view_matrix.py); these cells add what this engine writes (attention rows, the canary's layers,
teacher-forced answers).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from support import view_cells
from support.view_cells import ATTENTION_VIEWS, PAIR_VIEWS, STORE_VIEWS, VIEWS, Store

from posbias.service.store import database, migrate

GAP = 4096
"""`hf-gap`'s position gap: far past the window, as on Gemma 3 270M in docs/attention.md."""
JOBS: dict[str, dict[str, Any]] = {
    "hf": {"engine": {"name": "hf"}},
    "hf-gap": {"engine": {"name": "hf", "position_gap": GAP, "answer_sheet": "fixed"}},
}
"""The jobs, by name: what each adds to `BASE`."""
BASE = {
    "seed": 5,
    "batch_sizes": [1, 3],
    "iterations": 3,
    "shard_size": 3,
    "answer_mode": "constrained",
    "dataset": {"subjects": ["anatomy", "astronomy"]},
}


@pytest.fixture(scope="module")
def store(
    tmp_path_factory: pytest.TempPathFactory, mmlu_dir: Path, tiny_gemma2_dir: Path, ray_session: None
) -> Iterator[Store]:
    """A SQLite store holding `JOBS`, run to their end."""
    folder = tmp_path_factory.mktemp("hf-views")
    m = Store(url=f"sqlite:///{folder / 'posbias.db'}", folder=folder, mmlu_dir=mmlu_dir)
    migrate.upgrade(m.url)
    for name, fields in JOBS.items():
        m.submit(name, {"model": str(tiny_gemma2_dir), **BASE, **fields})
    m.work()
    yield m
    m.write_refusals()


def test_the_jobs_ran_on_hf_as_submitted(store: Store) -> None:
    with database.connect(store.url) as db, db.read() as session:
        runs = {
            job_id: (sheet, safe)
            for job_id, sheet, safe in session.execute(
                text("SELECT job_id, answer_sheet, position_gap_safe FROM attention_runs")
            ).all()
        }
    for name, job_id in store.jobs.items():
        status = store.fact(job_id)["status"]
        assert status["status"] == "done" and status["trials_done"] == 2 * 3, name
    # The gap was checked at load (the canary's zero pattern unchanged by it); the job without has none.
    assert runs == {store.jobs["hf"]: ("gold", None), store.jobs["hf-gap"]: ("fixed", True)}


@pytest.mark.parametrize("job", ["hf", "hf-gap"])
def test_each_answer_has_its_rope_distance(store: Store, job: str) -> None:
    """The RoPE distance is the token distance plus the gap (every answer is after it, every question
    before), and `curve --by rope-distance` bins it: the gap job's bins are its token bins moved by GAP."""
    gap = GAP if job == "hf-gap" else 0
    job_id = store.jobs[job]
    with database.connect(store.url) as db, db.read() as session:
        pairs = session.execute(
            text("SELECT token_distance, rope_distance FROM results WHERE job_id = :j"), {"j": job_id}
        ).all()
    assert pairs and all(t is not None and r == t + gap for t, r in pairs)
    curves = {
        by: json.loads(view_cells.cli(store, "curve", "--job", str(job_id), "--by", by, "--json").stdout)
        for by in ("token-distance", "rope-distance")
    }
    token = sorted(p["position"] for c in curves["token-distance"] for p in c["points"])
    rope = sorted(p["position"] for c in curves["rope-distance"] for p in c["points"])
    assert rope == [x + gap for x in token]  # bins of 256: the gap of 4,096 is 16 bins
    assert all(c["by"] == "rope-distance" for c in curves["rope-distance"])


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("job", list(JOBS))
def test_every_hf_job_opens_in_every_view(store: Store, job: str, view: str) -> None:
    view_cells.view(store, job, view)


@pytest.mark.parametrize("view", ATTENTION_VIEWS)
@pytest.mark.parametrize("job", list(JOBS))
def test_every_hf_job_shows_its_attention(store: Store, job: str, view: str) -> None:
    view_cells.attention(store, job, view)


@pytest.mark.parametrize("view", PAIR_VIEWS)
def test_the_gap_compares_with_the_job_without(store: Store, view: str) -> None:
    view_cells.pair(store, "hf", "hf-gap", view)


@pytest.mark.parametrize("view", STORE_VIEWS)
def test_every_hf_job_is_listed(store: Store, view: str) -> None:
    view_cells.listed(store, view)
