"""A job's results read back from the store: was every (trial, position) written, and only once?"""

from __future__ import annotations

from sqlalchemy import text

from posbias.service.store.database import Database
from posbias.service.work import jobs


def result_rows(db: Database, job_id: int) -> tuple[int, int]:
    """(result rows, distinct (trial, position) pairs) of a job."""
    with db.read() as session:
        rows = session.execute(
            text(
                "SELECT count(*), count(DISTINCT trial_id * 1000 + position) FROM results WHERE job_id = :j"
            ),
            {"j": job_id},
        ).one()
    return int(rows[0]), int(rows[1])


def expected_rows(db: Database, job_id: int) -> int:
    """trials x N over the job: what a finished job must hold, exactly."""
    spec = jobs.get(db, job_id).spec
    return sum(spec.trials_per_batch_size(n) * n for n in spec.batch_sizes)
