"""Results in and out of the store: the rows a finished shard writes, and the queries behind curves,
bootstraps, token-distance analyses and exports.

A shard's results are written in the transaction `queue.complete` opens, only while its lease is held, so a
re-delivered or late result changes nothing; this module moves the rows and never changes a shard's
status. Results go in with `COPY` on PostgreSQL and `executemany` on SQLite; the per-(job, batch size,
position) totals in `curve_points` are incremented in the same transaction, so a curve is read from a few
hundred rows however many results there are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from posbias.schemas import (
    BASELINE,
    LayerConfig,
    ModelInfo,
    NotFoundError,
    ParseStatus,
    QuestionResult,
    ShardResult,
    TrialStatus,
)
from posbias.service import jobs, tables
from posbias.service.analysis import DistanceRow, ResultRow, TrialData, TrialRow
from posbias.service.database import IN_CHUNK, Database, dialect_insert
from posbias.service.tables import CurvePoint, Job, JobVariant, Model, Result, Trial

# Columns of `results` in the order both bulk paths write them, with the PostgreSQL types binary COPY sends
# (JSON goes as text: its binary form is its text).
RESULT_COLUMNS = {
    "trial_id": "int8",
    "job_id": "int8",
    "batch_size": "int4",
    "variant": "text",
    # From here to visible_layers: QuestionResult's fields of the same names, read in one go by
    # _RESULT_FIELDS.
    "position": "int4",
    "question_id": "text",
    "subject": "text",
    "gold": "int4",
    "predicted": "int4",
    "correct": "bool",
    "question_token_start": "int4",
    "question_token_end": "int4",
    "answer_token_index": "int4",
    "token_distance": "int4",
    "gold_prob": "float8",
    "answer_slot": "int4",
    "in_window": "bool",
    "visible_layers": "int4",
    "parse_status": "text",
    "option_probs": "text",
}
_RESULT_FIELDS = attrgetter(*list(RESULT_COLUMNS)[4:-2])
# JSON arrays of n probabilities to 8 significant digits: three times faster than json.dumps, whose float
# formatting was the largest cost of ingest per row.
_PROBS_JSON = {n: "[" + ",".join(["%.8g"] * n) + "]" for n in range(1, 33)}


def write_results(session: Session, results: Mapping[int, ShardResult], *, now: datetime) -> None:
    """Move the results of shards (by shard id) into the store, in the caller's transaction: trial
    outcomes, result rows, the curve totals, and each job's (and each of its variants') model and engine
    (first write wins).

    The queue calls this from `queue.complete` once it has locked the shards and checked their leases;
    marking them done is the queue's. Raises `ValueError` when a result does not match its shard's trials.
    """
    trials = _trials_of(session, sorted(results))
    for shard_id, result in results.items():
        _check_matches(result, trials[shard_id])
    if session.get_bind().dialect.name == "postgresql":
        # Not waiting for the WAL flush is safe here: a crash loses the whole transaction, results and
        # `done` together, so the shard stays leased, its lease expires and it runs again.
        session.execute(sa.text("SET LOCAL synchronous_commit = off"))
    _update_trials(session, [(result, trials[shard_id]) for shard_id, result in results.items()])
    rows = [
        _result_row(r, trials[shard_id][r.trial_index], job_id=result.job_id)
        for shard_id, result in results.items()
        for r in result.results
    ]
    _insert_results(session, rows)

    # The jobs' row locks serialise the curve increments of concurrent writers of one job.
    locked = {
        job_id: jobs.locked_job(session, job_id) for job_id in sorted({r.job_id for r in results.values()})
    }
    unrecorded: set[tuple[int, str]] = {
        (job_id, variant)
        for job_id, variant in session.execute(
            select(JobVariant.job_id, JobVariant.variant).where(
                JobVariant.job_id.in_(sorted(locked)), JobVariant.model_id.is_(None)
            )
        )
    }
    for shard_id, result in results.items():
        job = locked[result.job_id]
        variant = next(iter(trials[shard_id].values())).variant if trials[shard_id] else BASELINE
        if job.model_id is None or (job.id, variant) in unrecorded:
            model_id = _model_id(session, result.model, now=now)
            if job.model_id is None:
                job.model_id = model_id
                job.engine = result.engine.model_dump(mode="json")
            if (job.id, variant) in unrecorded:
                _record_variant(session, job_id=job.id, variant=variant, result=result, model_id=model_id)
                unrecorded.discard((job.id, variant))
    trial_ids = sorted(trial.id for shard_id in results for trial in trials[shard_id].values())
    session.execute(CURVE_UPSERT, {"trial_ids": trial_ids})


class _TrialRow(NamedTuple):
    id: int
    batch_size: int
    variant: str


def _trials_of(session: Session, shard_ids: Sequence[int]) -> dict[int, dict[int, _TrialRow]]:
    """The trials of each shard, by trial index."""
    found: dict[int, dict[int, _TrialRow]] = {shard_id: {} for shard_id in shard_ids}
    rows = session.execute(
        select(Trial.shard_id, Trial.index, Trial.id, Trial.batch_size, Trial.variant).where(
            Trial.shard_id.in_(shard_ids)
        )
    )
    for shard_id, index, trial_id, batch_size, variant in rows:
        found[shard_id][index] = _TrialRow(trial_id, batch_size, variant)
    return found


def _record_variant(
    session: Session, *, job_id: int, variant: str, result: ShardResult, model_id: int
) -> None:
    """The first result of a job's variant records what its engine built."""
    layers = result.model.layers
    session.execute(
        sa.update(JobVariant)
        .where(JobVariant.job_id == job_id, JobVariant.variant == variant)
        .values(
            model_id=model_id,
            engine=result.engine.model_dump(mode="json"),
            built_layers=None if layers is None else layers.model_dump(mode="json"),
        )
        .execution_options(synchronize_session=False)
    )


def overrides_key(overrides: Mapping[str, Any]) -> str:
    """A short digest of a model's config changes; '' for none (the model as published)."""
    if not overrides:
        return ""
    canonical = json.dumps(overrides, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _check_matches(result: ShardResult, trials: dict[int, _TrialRow]) -> None:
    reported = [t.trial_index for t in result.trials]
    if sorted(reported) != sorted(trials):
        raise ValueError(
            f"shard {result.shard_id}'s result reports trials {sorted(reported)}; "
            f"the shard holds {sorted(trials)}"
        )
    done = {t.trial_index for t in result.trials if t.status is TrialStatus.done}
    for r in result.results:
        if r.trial_index not in done or not 1 <= r.position <= trials[r.trial_index].batch_size:
            raise ValueError(
                f"shard {result.shard_id}: a result for trial {r.trial_index} position {r.position}, "
                "which is not a position of a done trial of the shard"
            )


def _model_id(session: Session, info: ModelInfo, *, now: datetime) -> int:
    """The id of the model row for `info` (its name, revision and config changes), inserting it on first
    sight (first write wins)."""
    revision = info.revision or ""
    key = overrides_key(info.hf_overrides)
    query = select(Model.id).where(
        Model.name == info.name, Model.revision == revision, Model.overrides_key == key
    )
    found = session.scalar(query)
    if found is not None:
        return found
    values = info.model_dump(exclude={"sliding_window_layers", "hf_overrides", "layers"})
    layers = info.layers
    values.update(
        revision=revision,
        created_at=now,
        sliding_window_layers=None
        if info.sliding_window_layers is None
        else list(info.sliding_window_layers),
        overrides=info.hf_overrides,
        overrides_key=key,
        layer_windows=None if layers is None else list(layers.windows),
        layer_rope_theta=None if layers is None else list(layers.rope_theta),
    )
    dialect = session.get_bind().dialect.name
    session.execute(
        dialect_insert(dialect, Model)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["name", "revision", "overrides_key"])
    )
    model_id = session.scalar(query)
    assert model_id is not None
    return model_id


# One statement compiled once, run as executemany (the ORM's bulk update by primary key costs more than the
# database's work for a shard's few trials).
TRIAL_UPDATE = sa.text(
    """
    UPDATE trials SET status = :status, skip_reason = :skip_reason, prompt_tokens = :prompt_tokens,
        output_tokens = :output_tokens, output_text = :output_text,
        filler_token_start = :filler_token_start, filler_token_end = :filler_token_end
    WHERE id = :id
    """
)


def _update_trials(session: Session, written: Sequence[tuple[ShardResult, dict[int, _TrialRow]]]) -> None:
    session.execute(
        TRIAL_UPDATE,
        [
            {
                "id": trials[t.trial_index].id,
                "status": t.status.value,
                "skip_reason": _storable(t.skip_reason),
                "prompt_tokens": t.prompt_tokens,
                "output_tokens": t.output_tokens,
                "output_text": _storable(t.output_text),
                "filler_token_start": t.filler_token_start,
                "filler_token_end": t.filler_token_end,
            }
            for result, trials in written
            for t in result.trials
        ],
    )


def _storable(text: str | None) -> str | None:
    """A model's text as both stores keep it: PostgreSQL refuses NUL in text, and a model may write one.
    It becomes U+FFFD, the replacement character, rather than failing the shard's write forever."""
    return text.replace("\x00", "\ufffd") if text is not None and "\x00" in text else text


def _result_row(r: QuestionResult, trial: _TrialRow, *, job_id: int) -> tuple[Any, ...]:
    probs = r.option_probs
    probs_json = None
    if probs is not None:
        template = _PROBS_JSON.get(len(probs))
        probs_json = template % probs if template else json.dumps(probs)
    return (
        trial.id,
        job_id,
        trial.batch_size,
        trial.variant,
        *_RESULT_FIELDS(r),
        r.parse_status.value,
        probs_json,
    )


def _insert_results(session: Session, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    # The driver's own bulk path on the session's connection (so inside its transaction): SQLAlchemy's
    # per-row parameter processing would cost more than the database's work.
    driver = session.connection().connection.driver_connection
    assert driver is not None
    columns = ", ".join(RESULT_COLUMNS)
    if session.get_bind().dialect.name == "postgresql":
        statement = f"COPY results ({columns}) FROM STDIN (FORMAT BINARY)"
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types(list(RESULT_COLUMNS.values()))
            for row in rows:
                copy.write_row(row)
    else:
        marks = ", ".join("?" * len(RESULT_COLUMNS))
        driver.executemany(f"INSERT INTO results ({columns}) VALUES ({marks})", rows)


# The shard's just-written results, totalled per (variant, batch size, position) by the database and added to
# the job's running totals. Portable: PostgreSQL and SQLite (3.24+) share this upsert syntax (SQLite needs the
# WHERE to tell the SELECT from the ON CONFLICT). Ordered, so concurrent writers lock the rows in one order.
CURVE_UPSERT = sa.text(
    """
    INSERT INTO curve_points
        (job_id, variant, batch_size, position, n, n_correct, n_parsed, gold_prob_sum, n_gold_prob)
    SELECT job_id, variant, batch_size, position, count(*),
        sum(CASE WHEN correct THEN 1 ELSE 0 END),
        sum(CASE WHEN parse_status = 'ok' THEN 1 ELSE 0 END),
        coalesce(sum(gold_prob), 0.0),
        count(gold_prob)
    FROM results
    WHERE trial_id IN :trial_ids
    GROUP BY job_id, variant, batch_size, position
    ORDER BY job_id, variant, batch_size, position
    ON CONFLICT (job_id, variant, batch_size, position) DO UPDATE SET
        n = curve_points.n + excluded.n,
        n_correct = curve_points.n_correct + excluded.n_correct,
        n_parsed = curve_points.n_parsed + excluded.n_parsed,
        gold_prob_sum = curve_points.gold_prob_sum + excluded.gold_prob_sum,
        n_gold_prob = curve_points.n_gold_prob + excluded.n_gold_prob
    """
).bindparams(sa.bindparam("trial_ids", expanding=True))


# --- queries ------------------------------------------------------------------------------------------


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


def trial_data(
    db: Database, *, job_ids: Collection[int], batch_size: int, variant: str = BASELINE
) -> TrialData:
    """Every answered trial of `variant` of `job_ids` at `batch_size`, with its answers, as the analyses
    read them: pooled so that a trial two jobs share is counted once (see `TrialData.pool`), clustered by
    sampled set for jobs of the rotation design and for filler sweeps (each set shown at several lengths).
    Variants are never pooled: each is its own curve."""
    ids = sorted(set(job_ids))
    with db.read() as session:
        specs: dict[int, dict[str, Any]] = {
            job_id: spec for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(ids)))
        }
        rotation = {job_id: spec.get("design") == "rotation" for job_id, spec in specs.items()}
        sweep = {
            job_id: len((spec.get("filler") or {}).get("tokens") or ()) > 1 for job_id, spec in specs.items()
        }
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
            set_cluster=sweep.get(row.job_id, False),
        )
        for row in trial_rows
    ]
    return TrialData.from_rows(trials, results, batch_size=batch_size)


def _option_counts(session: Session, question_ids: set[str]) -> dict[str, int]:
    """Options per question (for the chance line)."""
    counts: dict[str, int] = {}
    ordered = sorted(question_ids)
    for start in range(0, len(ordered), IN_CHUNK):
        chunk = ordered[start : start + IN_CHUNK]
        for qid, choices in session.execute(
            select(tables.Question.id, tables.Question.choices).where(tables.Question.id.in_(chunk))
        ):
            counts[qid] = len(choices)
    return counts


def clusters_of(db: Database, *, job_ids: Collection[int]) -> dict[int, int]:
    """Each trial of `job_ids` mapped to its cluster's representative: itself, or under rotation (and in a
    filler sweep) the first trial of its sampled set."""
    ids = sorted(set(job_ids))
    with db.read() as session:
        rotation = {
            job_id
            for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(ids)))
            if spec.get("design") == "rotation" or len((spec.get("filler") or {}).get("tokens") or ()) > 1
        }
        rows = session.execute(
            select(Trial.id, Trial.job_id, Trial.variant, Trial.batch_size, Trial.iteration)
            .where(Trial.job_id.in_(ids))
            .order_by(Trial.id)
        ).all()
    first: dict[tuple[int, str, int, int], int] = {}
    return {
        row.id: first.setdefault((row.job_id, row.variant, row.batch_size, row.iteration), row.id)
        if row.job_id in rotation
        else row.id
        for row in rows
    }


def token_distance_rows(
    db: Database, *, job_ids: Collection[int], batch_size: int | None = None, variant: str = BASELINE
) -> list[DistanceRow]:
    """Per result of `variant` of `job_ids` (at `batch_size` when given): its trial, token distance,
    whether it parsed and is correct, and the gold option's probability; for curves by token distance
    instead of position."""
    query = select(
        Result.trial_id,
        Result.batch_size,
        Result.token_distance,
        Result.parse_status == ParseStatus.ok,
        Result.correct,
        Result.gold_prob,
    ).where(Result.job_id.in_(sorted(set(job_ids))), Result.variant == variant)
    if batch_size is not None:
        query = query.where(Result.batch_size == batch_size)
    with db.read() as session:
        return [DistanceRow(*row) for row in session.execute(query)]


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


class ExportRow(NamedTuple):
    """One result as exported (CSV, Parquet): the result with its trial's coordinates."""

    job_id: int
    variant: str
    trial_index: int
    batch_size: int
    iteration: int
    rotation: int
    answer_order: list[int] | None
    probe_position: int | None
    filler_tokens: int
    filler_token_start: int | None
    filler_token_end: int | None
    position: int
    answer_slot: int | None
    question_id: str
    subject: str
    gold: int
    predicted: int | None
    correct: bool
    parse_status: str
    prompt_tokens: int | None
    question_token_start: int | None
    question_token_end: int | None
    answer_token_index: int | None
    token_distance: int | None
    in_window: bool | None
    visible_layers: int | None
    gold_prob: float | None
    option_probs: list[float] | None


EXPORT_COLUMNS: tuple[str, ...] = ExportRow._fields
_EXPORT_STATUS = EXPORT_COLUMNS.index("parse_status")


def export_results(db: Database, job_id: int) -> Iterator[ExportRow]:
    """Every result of a job, by trial and position, streamed. `NotFoundError` (raised here, before
    iterating) when there is no such job."""
    with db.read() as session:
        if session.get(Job, job_id) is None:
            raise NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
    return _stream_results(db, job_id)


def _stream_results(db: Database, job_id: int) -> Iterator[ExportRow]:
    query = (
        select(
            Result.job_id,
            Result.variant,
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
            Result.in_window,
            Result.visible_layers,
            Result.gold_prob,
            Result.option_probs,
        )
        .join(Trial, Trial.id == Result.trial_id)
        .where(Result.job_id == job_id)
        .order_by(Trial.index, Result.position)
        .execution_options(yield_per=5000)
    )
    with db.read() as session:
        result = session.execute(query)
        try:
            status = _EXPORT_STATUS
            for row in result:
                yield ExportRow._make(
                    (*row[:status], ParseStatus(str(row[status])).value, *row[status + 1 :])
                )
        finally:
            result.close()  # an export cut short closes its server-side cursor here, not at collection
