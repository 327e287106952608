"""Results out of the store: the queries behind curves, bootstraps, token-distance analyses and model lists
(exports read theirs in `service.reports.export_columns`). A curve is read from the per-(job, batch size,
position) totals `service.store.rows` keeps in `curve_points`, not from the results.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from sqlalchemy import Text, cast, func, select
from sqlalchemy.orm import Session

from posbias.schemas import BASELINE, JobStatus, LayerConfig, ModelInfo, ParseStatus, TrialStatus
from posbias.service.stats import trial_columns
from posbias.service.stats.trial_data import TrialData
from posbias.service.store import (
    IN_CHUNK,
    CurvePoint,
    Database,
    Job,
    JobVariant,
    Model,
    Result,
    Trial,
    not_found,
    tables,
)


def matching_jobs(
    db: Database,
    *,
    model: str | None = None,
    revision: str | None = None,
    batch_size: int | None = None,
    job_id: int | None = None,
    variant: str | None = None,
) -> list[int]:
    """Ids of the jobs with results that match: of `model` (any revision unless `revision` is given), or
    job `job_id`, and with results at `batch_size` and of `variant` when given."""
    query = select(CurvePoint.job_id).join(Job, Job.id == CurvePoint.job_id).distinct()
    query = _filter_jobs(
        query, model=model, revision=revision, batch_size=batch_size, job_id=job_id, variant=variant
    )
    with db.read() as session:
        return sorted(session.scalars(query))


def missing_results_fix(db: Database, job_id: int) -> str:
    """What to do about results job `job_id` does not have, by where it stands: a cancelled job will not run,
    a failed one needs `posbias retry`, a queued or running one the worker. `NotFoundError` when there is no
    such job."""
    with db.read() as session:
        row = session.execute(select(Job.status, Job.error).where(Job.id == job_id)).one_or_none()
    if row is None:
        raise not_found(job_id)
    status, error = row
    if status is JobStatus.cancelled:
        return f"job {job_id} was cancelled before it answered there; submit it again to run it"
    if status is JobStatus.failed:
        said = (error or "see `posbias status`").splitlines()[0][:200]
        return f"job {job_id} failed ({said}); `posbias retry {job_id}` puts its dead shards back"
    if status is JobStatus.done:
        return "check `posbias status` and `posbias models`"
    return "run it with `posbias worker --until-empty`"


def variants_of(db: Database, *, job_ids: Collection[int], batch_size: int | None = None) -> list[str]:
    """The variants with results among `job_ids` (at `batch_size` when given): the baseline first, then
    the others in the order their jobs list them."""
    ids = sorted(set(job_ids))
    query = select(CurvePoint.variant).where(CurvePoint.job_id.in_(ids)).distinct()
    if batch_size is not None:
        query = query.where(CurvePoint.batch_size == batch_size)
    with db.read() as session:
        found = set(session.scalars(query))
        order = session.execute(
            select(JobVariant.variant, func.min(JobVariant.ordinal))
            .where(JobVariant.job_id.in_(ids))
            .group_by(JobVariant.variant)
        ).all()
    rank = {name: ordinal for name, ordinal in order}
    return sorted(found, key=lambda name: (name != BASELINE, rank.get(name, len(rank)), name))


def _filter_jobs(
    query: Any,
    *,
    model: str | None,
    revision: str | None,
    batch_size: int | None,
    job_id: int | None,
    variant: str | None = None,
) -> Any:
    if model is None and job_id is None:
        raise ValueError("name a model or a job")
    if model is not None:
        query = query.where(Job.model == model)
        if job_id is None:  # a quick look (`limit`) is a job's own: never pooled into its model's curves
            query = query.where(Job.spec["limit"].as_integer().is_(None))
    if revision is not None:
        query = query.where(Job.revision == revision)
    if job_id is not None:
        query = query.where(Job.id == job_id)
    if batch_size is not None:
        query = query.where(CurvePoint.batch_size == batch_size)
    if variant is not None:
        query = query.where(CurvePoint.variant == variant)
    return query


class PositionCount(NamedTuple):
    """The stored totals behind one point: what `curve_points` holds per (job, batch size, position)."""

    batch_size: int
    position: int
    n: int
    n_correct: int
    n_parsed: int
    gold_prob_sum: float = 0.0
    n_gold_prob: int = 0


def curve_counts(
    db: Database,
    *,
    model: str | None = None,
    revision: str | None = None,
    batch_size: int | None = None,
    job_id: int | None = None,
    variant: str | None = BASELINE,
) -> list[PositionCount]:
    """Counts per (batch size, position) of `variant`, summed over the matching jobs (see
    `matching_jobs`), in order. Read from the `curve_points` totals, not from the results."""
    columns = (
        CurvePoint.n,
        CurvePoint.n_correct,
        CurvePoint.n_parsed,
        CurvePoint.gold_prob_sum,
        CurvePoint.n_gold_prob,
    )
    query = (
        select(CurvePoint.batch_size, CurvePoint.position, *(func.sum(column) for column in columns))
        .join(Job, Job.id == CurvePoint.job_id)
        .group_by(CurvePoint.batch_size, CurvePoint.position)
        .order_by(CurvePoint.batch_size, CurvePoint.position)
    )
    query = _filter_jobs(
        query, model=model, revision=revision, batch_size=batch_size, job_id=job_id, variant=variant
    )
    with db.read() as session:
        return [
            PositionCount(
                batch_size=row[0],
                position=row[1],
                n=int(row[2]),
                n_correct=int(row[3]),
                n_parsed=int(row[4]),
                gold_prob_sum=float(row[5]),
                n_gold_prob=int(row[6]),
            )
            for row in session.execute(query)
        ]


def batch_sizes(db: Database, *, job_ids: Collection[int], variant: str | None = None) -> list[int]:
    """The batch sizes at which `job_ids` have results (of `variant`, when given), in order."""
    query = select(CurvePoint.batch_size).where(CurvePoint.job_id.in_(sorted(set(job_ids)))).distinct()
    if variant is not None:
        query = query.where(CurvePoint.variant == variant)
    with db.read() as session:
        return sorted(session.scalars(query))


TRIAL_BATCH_ROWS = 8_192
"""Trials read at a time: each carries its question ids as JSON text (50 ids: about 1.7 kB)."""


def trial_data(
    db: Database,
    *,
    job_ids: Collection[int],
    batch_size: int,
    variant: str = BASELINE,
    placement: bool = True,
) -> TrialData:
    """Every answered trial of `variant` of `job_ids` at `batch_size`, with its answers, as the analyses
    read them: pooled so that a trial two jobs share is counted once (see `TrialData.pool`), clustered by
    sampled set for jobs of the rotation design, for filler sweeps (each set shown at several lengths) and
    for probes (each set asked at every position).
    Variants are never pooled: each is its own curve.

    Read as columns (`service.store.columns`), batch by batch: memory is the trials x positions arrays, not
    a Python object per answer. `placement=False` leaves out each answer's slot and token distance (slot
    and distance None), which curves by position and comparisons do not read: two fewer arrays."""
    from posbias.service.store import columns  # Arrow costs half a second to import: only when read

    ids = sorted(set(job_ids))
    with db.read() as session:
        specs: dict[int, dict[str, Any]] = {
            job_id: spec for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(ids)))
        }
    by_set = {
        job_id for job_id, spec in specs.items() if spec.get("design") == "rotation" or shows_sets_again(spec)
    }
    trials = columns.record_batches(
        db,
        select(
            Trial.id.label("trial_id"),
            Trial.job_id,
            Trial.iteration,
            columns.filled(Trial.probe_position, 0).label("probe"),
            Trial.filler_tokens,
            cast(Trial.question_ids, Text).label("question_ids"),
            columns.filled(cast(Trial.choice_orders, Text), "").label("choice_orders"),
            columns.filled(cast(Trial.answer_order, Text), "").label("answer_order"),
        )
        .where(
            Trial.job_id.in_(ids),
            Trial.batch_size == batch_size,
            Trial.variant == variant,
            Trial.status == TrialStatus.done,
        )
        .order_by(Trial.job_id, Trial.id),
        batch_rows=TRIAL_BATCH_ROWS,
    )
    table = trial_columns.TrialColumns.read(trials, by_set=by_set)

    def options(question_ids: set[str]) -> dict[str, int]:
        with db.read() as session:
            return _option_counts(session, question_ids)

    codes = trial_columns.QuestionCodes(options)
    placed = (
        [
            columns.filled(Result.answer_slot, trial_columns.NO_INT).label("answer_slot"),
            columns.filled(Result.token_distance, trial_columns.NO_INT).label("token_distance"),
        ]
        if placement
        else []  # two columns fewer to read: a sixth of a million answers' read
    )
    results = columns.record_batches(
        db,
        select(
            Result.trial_id,
            Result.position,
            (Result.parse_status == ParseStatus.ok).label("parsed"),
            Result.correct,
            columns.filled(Result.gold_prob, trial_columns.NO_FLOAT).label("gold_prob"),
            *placed,
            Result.question_id,
        ).where(Result.job_id.in_(ids), Result.batch_size == batch_size, Result.variant == variant),
    )
    return trial_columns.build(
        table, (codes.batch(b) for b in results), batch_size=batch_size, placement=placement
    )


def _option_counts(session: Session, question_ids: set[str]) -> dict[str, int]:
    """Options per question (for the chance line), counted by the database (SQLite's and PostgreSQL's
    `json_array_length`): the options' texts are not read."""
    counts: dict[str, int] = {}
    ordered = sorted(question_ids)
    options = func.json_array_length(tables.Question.choices)
    for start in range(0, len(ordered), IN_CHUNK):
        chunk = ordered[start : start + IN_CHUNK]
        for qid, count in session.execute(
            select(tables.Question.id, options).where(tables.Question.id.in_(chunk))
        ):
            counts[qid] = int(count)
    return counts


def shows_sets_again(spec: Mapping[str, Any]) -> bool:
    """True when a job (its stored spec) shows each sampled set in several prompts: a rotation, a filler sweep
    (each set at several lengths) or a probe (each set asked at every position). Its answers are then
    clustered by set, not by trial."""
    fillers = (spec.get("filler") or {}).get("tokens") or ()
    return spec.get("design") in ("rotation", "probe") or len(fillers) > 1


def clusters_of(db: Database, *, job_ids: Collection[int]) -> dict[int, int]:
    """Each trial of `job_ids` mapped to its cluster's representative: itself, or, where the job shows each
    sampled set in several prompts (`shows_sets_again`), the first trial of its set."""
    ids = sorted(set(job_ids))
    with db.read() as session:
        rotation = {
            job_id
            for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(ids)))
            if shows_sets_again(spec)
        }
        # A trial of any other job is its own cluster: only its id is read (a plain column, not a row
        # object per trial: a million answers' job has 20,000 trials).
        alone = [i for i in ids if i not in rotation]
        own = select(Trial.id).where(Trial.job_id.in_(alone)).order_by(Trial.id)
        found = {trial_id: trial_id for trial_id in session.scalars(own)}
        rows = session.execute(
            select(Trial.id, Trial.job_id, Trial.variant, Trial.batch_size, Trial.iteration)
            .where(Trial.job_id.in_(sorted(rotation)))
            .order_by(Trial.id)
        ).all()
    first: dict[tuple[int, str, int, int], int] = {}
    for row in rows:
        found[row.id] = first.setdefault((row.job_id, row.variant, row.batch_size, row.iteration), row.id)
    return dict(sorted(found.items()))


def token_distance_rows(
    db: Database,
    *,
    job_ids: Collection[int],
    batch_size: int | None = None,
    variant: str = BASELINE,
    rope: bool = False,
) -> trial_columns.DistanceColumns:
    """Per result of `variant` of `job_ids` (at `batch_size` when given): its trial, token distance (with
    `rope`, its RoPE distance: the same plus the hf engine's position gap), whether it parsed and is
    correct, and the gold option's probability; for curves by distance instead of position. Read as
    columns."""
    from posbias.service.store import columns

    query = select(
        Result.trial_id,
        Result.batch_size,
        columns.filled(Result.rope_distance if rope else Result.token_distance, trial_columns.NO_INT).label(
            "token_distance"
        ),
        (Result.parse_status == ParseStatus.ok).label("parsed"),
        Result.correct,
        columns.filled(Result.gold_prob, trial_columns.NO_FLOAT).label("gold_prob"),
    ).where(Result.job_id.in_(sorted(set(job_ids))), Result.variant == variant)
    if batch_size is not None:
        query = query.where(Result.batch_size == batch_size)
    return trial_columns.DistanceColumns.concatenate(
        trial_columns.DistanceColumns.read(batch) for batch in columns.record_batches(db, query)
    )


def job_model(db: Database, job_id: int, *, variant: str = BASELINE) -> ModelInfo | None:
    """The architecture facts of the model `variant` of a job ran (its `models` row, as built); None before
    its first result."""
    with db.read() as session:
        found = session.scalar(
            select(Model)
            .join(JobVariant, JobVariant.model_id == Model.id)
            .where(JobVariant.job_id == job_id, JobVariant.variant == variant)
        )
        if found is None and variant == BASELINE:  # a job with no variants rows: its own model
            found = session.scalar(select(Model).join(Job, Job.model_id == Model.id).where(Job.id == job_id))
        return None if found is None else _model_info(found)


def list_models(db: Database) -> list[ModelInfo]:
    """Every model that has results, with its architecture facts as built, by name and revision; a model
    run with config changes (a variant) is a row of its own, after the model as published."""
    with db.read() as session:
        models = session.scalars(
            select(Model).order_by(Model.name, Model.revision, Model.overrides_key, Model.id)
        )
        return [_model_info(m) for m in models]


def _model_info(m: Model) -> ModelInfo:
    return ModelInfo(
        name=m.name,
        revision=m.revision or None,
        architecture=m.architecture,
        num_layers=m.num_layers,
        sliding_window=m.sliding_window,
        sliding_window_layers=None if m.sliding_window_layers is None else tuple(m.sliding_window_layers),
        rope_theta=m.rope_theta,
        context_length=m.context_length,
        num_parameters=m.num_parameters,
        hf_overrides=m.overrides or {},
        layers=None
        if m.layer_windows is None or m.layer_rope_theta is None
        else LayerConfig(windows=tuple(m.layer_windows), rope_theta=tuple(m.layer_rope_theta)),
    )
