"""The answers as the analyses read them before the columnar path (issue 39): rows through SQLAlchemy, one
Python object per answer, into `TrialData.pool`. Kept only as the reference the columnar path
(`service.stats.queries.trial_data`) must equal (tests/support/view_cells.py's `python-columns` cells)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import select

from posbias.schemas import ParseStatus, TrialStatus
from posbias.service.stats.queries import _option_counts, shows_sets_again
from posbias.service.stats.trial_data import ResultRow, TrialData, TrialRow
from posbias.service.store import Database, Job, Result, Trial


def reference_trial_data(
    db: Database, *, job_ids: Collection[int], batch_size: int, variant: str
) -> TrialData:
    """What `queries.trial_data` gave at 1fe6a19, row by row."""
    ids = sorted(set(job_ids))
    with db.read() as session:
        specs: dict[int, dict[str, Any]] = {
            job_id: spec for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(ids)))
        }
        rotation = {job_id: spec.get("design") == "rotation" for job_id, spec in specs.items()}
        set_cluster = {job_id: shows_sets_again(spec) for job_id, spec in specs.items()}
        trial_rows = session.execute(
            select(
                Trial.id,
                Trial.job_id,
                Trial.iteration,
                Trial.question_ids,
                Trial.choice_orders,
                Trial.answer_order,
                Trial.probe_position,
                Trial.filler_tokens,
            )
            .where(
                Trial.job_id.in_(ids),
                Trial.batch_size == batch_size,
                Trial.variant == variant,
                Trial.status == TrialStatus.done,
            )
            .order_by(Trial.job_id, Trial.index)
        ).all()
        options = _option_counts(session, {qid for row in trial_rows for qid in row.question_ids})
        results = [
            ResultRow(trial_id, position, status == ParseStatus.ok, correct, gold, slot, distance)
            for trial_id, position, status, correct, gold, slot, distance in session.execute(
                select(
                    Result.trial_id,
                    Result.position,
                    Result.parse_status,
                    Result.correct,
                    Result.gold_prob,
                    Result.answer_slot,
                    Result.token_distance,
                )
                .where(Result.job_id.in_(ids), Result.batch_size == batch_size, Result.variant == variant)
                .order_by(Result.trial_id, Result.position)
            )
        ]
    trials = [
        TrialRow(
            trial_id=row.id,
            job_id=row.job_id,
            iteration=row.iteration,
            question_ids=row.question_ids,
            choice_orders=row.choice_orders,
            rotation_design=rotation.get(row.job_id, False),
            n_options=[options.get(qid, 0) or 1 for qid in row.question_ids],
            answer_order=row.answer_order,
            probe=row.probe_position,
            filler_tokens=row.filler_tokens,
            set_cluster=set_cluster.get(row.job_id, False),
        )
        for row in trial_rows
    ]
    return TrialData.from_rows(trials, results, batch_size=batch_size)
