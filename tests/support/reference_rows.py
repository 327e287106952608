"""The answers as the analyses read them before the columnar path (issue 39): rows through SQLAlchemy, one
Python object per answer, into `TrialData.pool` and options by position's `OptionData`. Kept only as the
reference the columnar path (`queries.trial_data`, `options.load`) must equal (tests/support/view_cells.py's
`python-columns` cells)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from sqlalchemy import select

from posbias.schemas import ParseStatus, TrialStatus
from posbias.service.stats import queries
from posbias.service.stats.options import OptionData
from posbias.service.stats.queries import _option_counts, shows_sets_again
from posbias.service.stats.trial_data import ResultRow, TrialData, TrialRow, cluster_codes
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


def reference_options(db: Database, *, job_ids: Sequence[int], batch_size: int, variant: str) -> OptionData:
    """What `options.load` gave at 1fe6a19, row by row."""
    ids = sorted(set(job_ids))
    with db.read() as session:
        trials = session.execute(
            select(Trial.id, Trial.choice_orders)
            .where(Trial.job_id.in_(ids), Trial.batch_size == batch_size, Trial.variant == variant)
            .order_by(Trial.job_id, Trial.index)
        ).all()
        results = session.execute(
            select(
                Result.trial_id,
                Result.position,
                Result.gold,
                Result.predicted,
                Result.parse_status,
                Result.option_probs,
            ).where(Result.job_id.in_(ids), Result.batch_size == batch_size, Result.variant == variant)
        ).all()
    clusters = queries.clusters_of(db, job_ids=ids)
    answered = {r.trial_id for r in results}
    kept = [t for t in trials if t.id in answered]
    row = {t.id: i for i, t in enumerate(kept)}
    width = max(
        [len(r.option_probs) for r in results if r.option_probs] + [r.gold + 1 for r in results] + [2]
    )
    shape = (len(kept), batch_size)
    gold = np.full(shape, -1, dtype=np.int64)
    predicted = np.full(shape, -1, dtype=np.int64)
    probs = np.full((*shape, width), np.nan)
    for r in results:
        i, j = row[r.trial_id], r.position - 1
        gold[i, j] = r.gold
        if ParseStatus(str(r.parse_status)) is ParseStatus.ok and r.predicted is not None:
            predicted[i, j] = r.predicted
        if r.option_probs:
            probs[i, j, : len(r.option_probs)] = r.option_probs
            probs[i, j, len(r.option_probs) :] = 0.0
    return OptionData(
        batch_size=batch_size,
        gold=gold,
        predicted=predicted,
        probs=probs,
        shuffled=np.array([t.choice_orders is not None for t in kept], dtype=bool),
        cluster=cluster_codes([clusters.get(t.id, t.id) for t in kept]),
    )
