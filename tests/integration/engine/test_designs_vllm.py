"""Every design on the real vLLM CPU build: the tiny Gemma 2 (a 64-token window, far shorter than the prompts)
answers each design's shards leased from the queue, on SQLite and PostgreSQL, and what was stored is checked
against the prompts rendered again with its tokenizer, position by position (the dispatcher and Ray between
the queue and the engine are the fake engine's path, tests/integration/test_design_jobs.py; the demo model
runs a design through the CLI in tests/e2e/test_vllm_demo.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import GEMMA2_MAX_MODEL_LEN, GEMMA2_WINDOW
from sqlalchemy import select
from support.designs import Window, check_trial

from posbias.schemas import JobStatus, ParseStatus, Submitted
from posbias.service.store.database import Database
from posbias.service.store.tables import Result, Trial
from posbias.service.work import jobs, queue
from posbias.workers.shard import run_shards
from posbias.workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm

DESIGNS: dict[str, dict[str, Any]] = {
    "reverse": {"answer_order": "reverse"},
    "random order, filler after 2 (sweep)": {
        "answer_order": "random",
        "filler": {"tokens": [0, 60], "where": "after", "position": 2},
    },
    "probe, filler before": {
        "design": "probe",
        "iterations": 1,  # one set, every position probed in a prompt of its own
        "filler": {"tokens": [40], "where": "before"},
    },
    "random order, filler at the end": {"answer_order": "random", "filler": {"tokens": [80]}},
}


def test_every_design_on_the_tiny_gemma2(
    db: Database,
    make_job: Callable[..., Submitted],
    gemma2_engine: VllmEngine,
    tiny_gemma2_dir: Path,
) -> None:
    submitted = {
        name: make_job(
            db,
            model=str(tiny_gemma2_dir),
            engine={"name": "vllm", "max_model_len": GEMMA2_MAX_MODEL_LEN},
            answer_mode="constrained",  # a random model's free text parses to nothing
            **{"batch_sizes": (4,), "iterations": 2, **fields},
        ).job_id
        for name, fields in DESIGNS.items()
    }
    leases = queue.lease(db, owner="vllm-test", limit=100, lease_seconds=600, job_ids=submitted.values())
    shards = [lease.shard for lease in leases]
    outcomes = queue.complete(db, run_shards(shards, engine=gemma2_engine), owner="vllm-test")
    assert shards and all(outcome.written for outcome in outcomes), outcomes
    questions = {qid: q for shard in shards for qid, q in shard.questions.items()}
    by_trial = {(shard.job_id, trial.index): trial for shard in shards for trial in shard.trials}

    window = Window(tokens=GEMMA2_WINDOW, layers=4, sliding_layers=2)
    seen_inside = seen_beyond = 0
    for name, job_id in submitted.items():
        job = jobs.get(db, job_id)
        assert job.status is JobStatus.done, (name, job.error)
        with db.read() as session:
            rows = list(session.scalars(select(Trial).where(Trial.job_id == job_id)))
            results = {
                (r.trial_id, r.position): r
                for r in session.scalars(select(Result).where(Result.job_id == job_id))
            }
        assert len(rows) == job.spec.total_trials
        for row in rows:
            check_trial(
                name,
                job.spec,
                by_trial[(job_id, row.index)],
                row,
                results,
                questions,
                tokenizer=gemma2_engine.tokenizer,
                window=window,
            )
        # Constrained decoding answers every position asked, on the line the design puts it.
        assert all(r.parse_status is ParseStatus.ok for r in results.values()), name
        seen_inside += sum(bool(r.in_window) for r in results.values())
        seen_beyond += sum(r.in_window is False for r in results.values())
    assert seen_inside > 0 and seen_beyond > 0, "the prompts straddle the window"
