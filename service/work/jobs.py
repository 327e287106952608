"""Jobs: submitting one (its rows and its shards in one transaction), cancelling, retrying or failing it,
and reading jobs back.

A job's status follows its shards (`service.work.job_status`); the shards themselves only move through
`service.work.queue`.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from posbias.schemas import (
    FINISHED_JOB_STATUSES,
    ConflictError,
    EndpointReport,
    EngineContext,
    EngineInfo,
    JobProgress,
    JobRecord,
    JobSpec,
    JobStatus,
    LayerConfig,
    Plan,
    PosbiasError,
    ShardRecord,
    ShardStatus,
    Submitted,
    TrialStatus,
    VariantRun,
)
from posbias.schemas.variant import merge_overrides
from posbias.service.store import IN_CHUNK, Database, Job, Shard, dialect_insert, not_found, now_utc, tables
from posbias.service.work import answer_sheets, queue
from posbias.service.work.job_status import ACTIVE, locked_job, settle_job
from posbias.service.work.stored_spec import load_spec

MAX_KEY = 200
"""Characters of an idempotency key at most (the column's width)."""


# --- submitting ---------------------------------------------------------------------------------------


def submit(
    db: Database,
    spec: JobSpec,
    plan: Plan,
    *,
    idempotency_key: str | None = None,
    endpoint: EndpointReport | None = None,
    context: EngineContext | None = None,
) -> Submitted:
    """Write a job with its shards, planned trials and (missing) questions in one transaction; `endpoint`
    is what submit found out about a served model's endpoint (engine `openai`), `context` the context a vLLM
    engine starts with and its source, both stored with the job.

    With an `idempotency_key` that already names a job, return that job instead (also when two submits
    race); a different spec under the same key is a `ConflictError`.
    """
    check_submission(db, spec, plan, idempotency_key=idempotency_key)
    try:
        with db.write() as session:
            return submit_in(
                session, spec, plan, idempotency_key=idempotency_key, endpoint=endpoint, context=context
            )
    except IntegrityError:
        # Two submits with one key: the unique constraint let one in; the other returns its job.
        if idempotency_key is None:
            raise
        with db.read() as session:
            existing = _job_by_key(session, idempotency_key)
        if existing is None:
            raise
        return _resubmitted(existing, key=idempotency_key, spec_hash=spec.spec_hash())


def check_submission(db: Database, spec: JobSpec, plan: Plan, *, idempotency_key: str | None) -> None:
    """What `submit` checks before it writes (the plan, an answer-sheet job, the key); the caller of
    `submit_in` runs it first, outside its transaction. `PosbiasError` naming the fix."""
    _check_plan(plan)
    answer_sheets.check(db, spec, plan)
    if idempotency_key is not None and (
        not idempotency_key.strip() or len(idempotency_key) > MAX_KEY or "\x00" in idempotency_key
    ):
        raise PosbiasError(
            f"an idempotency key is 1 to {MAX_KEY} characters of text (got {len(idempotency_key)} characters)"
        )


def submit_in(
    session: Session,
    spec: JobSpec,
    plan: Plan,
    *,
    idempotency_key: str | None = None,
    endpoint: EndpointReport | None = None,
    context: EngineContext | None = None,
) -> Submitted:
    """`submit` in the caller's write transaction (a session of `Database.write`, after `check_submission`):
    the job's rows are committed, or rolled back, with whatever else the caller writes there, so that a
    record that names the job (a schedule's checkpoint) is never stored without it. A key that already
    names a job returns that job. A concurrent insert of the same key raises `IntegrityError`, which ends
    the caller's transaction: the caller retries it, or holds a lock that keeps a second insert out."""
    spec_hash = spec.spec_hash()
    if idempotency_key is not None:
        existing = _job_by_key(session, idempotency_key)
        if existing is not None:
            return _resubmitted(existing, key=idempotency_key, spec_hash=spec_hash)
    job_id = _insert_job(
        session,
        spec,
        plan,
        idempotency_key=idempotency_key,
        spec_hash=spec_hash,
        endpoint=endpoint,
        context=context,
    )
    return Submitted(job_id=job_id, created=True, trials=len(plan.trials), shards=len(plan.shards))


def _check_plan(plan: Plan) -> None:
    if not plan.shards:
        raise ValueError("the plan has no shards")
    planned = sorted(index for shard in plan.shards for index in shard.trial_indices)
    if planned != [trial.index for trial in plan.trials] or planned != list(range(len(plan.trials))):
        raise ValueError("the plan's shards must hold each trial (indices 0..T-1, in order) exactly once")


def _job_by_key(session: Session, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.idempotency_key == key))


def _resubmitted(job: Job, *, key: str, spec_hash: str) -> Submitted:
    if job.spec_hash != spec_hash:
        raise ConflictError(
            f"idempotency key {key!r} already names job {job.id}, submitted with a different spec: use a "
            "new key, or resubmit that job's spec"
        )
    return Submitted(job_id=job.id, created=False, trials=job.trials_total, shards=job.shards_total)


def _insert_job(
    session: Session,
    spec: JobSpec,
    plan: Plan,
    *,
    idempotency_key: str | None,
    spec_hash: str,
    endpoint: EndpointReport | None = None,
    context: EngineContext | None = None,
) -> int:
    dialect = session.get_bind().dialect.name
    job = Job(
        spec=spec.model_dump(mode="json"),
        spec_hash=spec_hash,
        model=spec.model,
        revision=spec.revision,
        model_key=spec.model_key(),
        status=JobStatus.queued,
        priority=spec.priority,
        created_at=now_utc(),
        idempotency_key=idempotency_key,
        trials_total=len(plan.trials),
        shards_total=len(plan.shards),
        endpoint=None if endpoint is None else endpoint.model_dump(mode="json"),
        context=None if context is None else context.model_dump(mode="json"),
    )
    session.add(job)
    session.flush()  # raises IntegrityError here when another submit took the idempotency key

    # Sorted, so two submits inserting overlapping questions take their row locks in the same order.
    questions = [
        {
            "id": q.id,
            "subject": q.subject,
            "question": q.question,
            "choices": list(q.choices),
            "answer": q.answer,
        }
        for q in sorted(plan.questions.values(), key=lambda q: q.id)
    ]
    for start in range(0, len(questions), IN_CHUNK):
        session.execute(
            dialect_insert(dialect, tables.Question).on_conflict_do_nothing(index_elements=["id"]),
            questions[start : start + IN_CHUNK],
        )

    shard_ids = queue.enqueue(session, job_id=job.id, spec=spec, plan=plan)
    shard_of = {trial: shard_ids[shard.index] for shard in plan.shards for trial in shard.trial_indices}
    session.execute(
        insert(tables.JobVariant),
        [
            {
                "job_id": job.id,
                "variant": variant.name,
                "ordinal": ordinal,
                "model_key": spec.model_key(variant),
                "hf_overrides": merge_overrides(spec.engine.hf_overrides, variant.hf_overrides),
                "expected_layers": None if variant.expect is None else variant.expect.model_dump(mode="json"),
            }
            for ordinal, variant in enumerate(spec.runs)
        ],
    )
    session.execute(
        insert(tables.Trial),
        [
            {
                "job_id": job.id,
                "index": trial.index,
                "shard_id": shard_of[trial.index],
                "batch_size": trial.batch_size,
                "iteration": trial.iteration,
                "rotation": trial.rotation,
                "question_ids": list(trial.question_ids),
                "choice_orders": None
                if trial.choice_orders is None
                else [list(order) for order in trial.choice_orders],
                "answer_order": None if trial.answer_order is None else list(trial.answer_order),
                "probe_position": trial.probe,
                "filler_tokens": trial.filler_tokens,
                "status": TrialStatus.planned,
                "variant": trial.variant,
            }
            for trial in plan.trials
        ],
    )
    return job.id


# --- cancelling, retrying, failing --------------------------------------------------------------------


def cancel(db: Database, job_id: int) -> int:
    """Cancel a job: its queued and leased shards are cancelled (a late result for one is discarded).
    Returns how many shards were cancelled. `ConflictError` when the job already finished."""
    now = now_utc()
    with db.write() as session:
        ids = queue.lock_job_shards(session, job_id, ACTIVE)
        job = locked_job(session, job_id)
        if job.status in FINISHED_JOB_STATUSES:
            raise ConflictError(f"job {job_id} is already {job.status}: there is nothing to cancel")
        queue.cancel(session, ids, now=now)
        job.status = JobStatus.cancelled
        job.finished_at = now
    return len(ids)


def retry(db: Database, job_id: int) -> int:
    """Requeue a job's dead shards with fresh attempts (their last error is kept). Returns how many.
    `ConflictError` when the job was cancelled or has no dead shards."""
    with db.write() as session:
        ids = queue.lock_job_shards(session, job_id, (ShardStatus.dead,))
        job = locked_job(session, job_id)
        if job.status is JobStatus.cancelled:
            raise ConflictError(f"job {job_id} was cancelled: submit it again to rerun it")
        if not ids:
            raise ConflictError(f"job {job_id} has no dead shards to retry (it is {job.status})")
        queue.requeue(session, ids)
        job.status = JobStatus.running if job.started_at is not None else JobStatus.queued
        job.finished_at = None
        job.error = None
    return len(ids)


def fail(db: Database, job_id: int, *, error: str) -> int:
    """Fail a job that cannot run at all (e.g. its model does not load): its queued and leased shards are
    dead with `error`, so `posbias retry` can requeue them. Returns how many; a finished job is left as is."""
    now = now_utc()
    with db.write() as session:
        ids = queue.lock_job_shards(session, job_id, ACTIVE)
        job = locked_job(session, job_id)
        if job.status in FINISHED_JOB_STATUSES or not ids:
            return 0
        queue.kill(session, ids, error=error, now=now)
        settle_job(session, job, now=now)
    return len(ids)


# --- reading ------------------------------------------------------------------------------------------


def get(db: Database, job_id: int) -> JobRecord:
    """One job. `NotFoundError` when there is none."""
    with db.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise not_found(job_id)
        return _record(session, job)


def finished(db: Database, job_id: int) -> bool:
    """True once the job is done, failed or cancelled. `NotFoundError` when there is no such job."""
    with db.read() as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
    if status is None:
        raise not_found(job_id)
    return status in FINISHED_JOB_STATUSES


def find(
    db: Database, *, status: JobStatus | None = None, model: str | None = None, limit: int | None = None
) -> list[JobRecord]:
    """Jobs, newest first, optionally only those with `status` or of `model`."""
    query = select(Job).order_by(Job.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Job.status == status)
    if model is not None:
        query = query.where(Job.model == model)
    with db.read() as session:
        return [_record(session, job) for job in session.scalars(query)]


def _record(session: Session, job: Job) -> JobRecord:
    return JobRecord(
        id=job.id,
        spec=load_spec(job.spec),
        model=job.model,
        revision=job.revision,
        model_key=job.model_key,
        status=job.status,
        priority=job.priority,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=job.error,
        idempotency_key=job.idempotency_key,
        trials_total=job.trials_total,
        shards_total=job.shards_total,
        engine=None if job.engine is None else EngineInfo.model_validate(job.engine),
        progress=_progress(session, job),
        endpoint=None if job.endpoint is None else EndpointReport.model_validate(job.endpoint),
        context=None if job.context is None else EngineContext.model_validate(job.context),
        variants=tuple(
            VariantRun(
                name=v.variant,
                model_key=v.model_key,
                hf_overrides=v.hf_overrides,
                expected=None if v.expected_layers is None else LayerConfig.model_validate(v.expected_layers),
                built=None if v.built_layers is None else LayerConfig.model_validate(v.built_layers),
                engine=None if v.engine is None else EngineInfo.model_validate(v.engine),
            )
            for v in session.scalars(
                select(tables.JobVariant)
                .where(tables.JobVariant.job_id == job.id)
                .order_by(tables.JobVariant.ordinal)
            )
        ),
    )


def endpoints(db: Database, job_ids: Iterable[int]) -> dict[int, EndpointReport]:
    """The endpoint reports of those of `job_ids` that ran on a served model, by job id."""
    wanted = sorted(set(job_ids))
    found: dict[int, EndpointReport] = {}
    with db.read() as session:
        for start in range(0, len(wanted), IN_CHUNK):
            # Filtered here, not in SQL: a JSON column may hold JSON null rather than SQL NULL.
            query = select(Job.id, Job.endpoint).where(Job.id.in_(wanted[start : start + IN_CHUNK]))
            for job_id, endpoint in session.execute(query):
                if endpoint is not None:
                    found[job_id] = EndpointReport.model_validate(endpoint)
    return found


def shards(db: Database, job_id: int) -> list[ShardRecord]:
    """A job's shards in order. `NotFoundError` when there is no such job."""
    with db.read() as session:
        if session.get(Job, job_id) is None:
            raise not_found(job_id)
        return [
            ShardRecord(
                id=s.id,
                job_id=s.job_id,
                index=s.index,
                status=s.status,
                attempts=s.attempts,
                max_attempts=s.max_attempts,
                lapses=s.lapses,
                lease_owner=s.lease_owner,
                lease_expires_at=s.lease_expires_at,
                finished_at=s.finished_at,
                last_error=s.last_error,
                trial_count=s.trial_count,
                variant=s.variant,
            )
            for s in session.scalars(select(Shard).where(Shard.job_id == job_id).order_by(Shard.index))
        ]


def progress(db: Database, job_id: int) -> JobProgress:
    """Trials done and skipped, and shards by status. `NotFoundError` when there is no such job."""
    with db.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise not_found(job_id)
        return _progress(session, job)


def _progress(session: Session, job: Job) -> JobProgress:
    trials: dict[TrialStatus, int] = dict(
        session.execute(
            select(tables.Trial.status, func.count())
            .where(tables.Trial.job_id == job.id, tables.Trial.status != TrialStatus.planned)
            .group_by(tables.Trial.status)
        ).all()
    )
    counts: dict[ShardStatus, int] = dict(
        session.execute(
            select(Shard.status, func.count()).where(Shard.job_id == job.id).group_by(Shard.status)
        ).all()
    )
    return JobProgress(
        job_id=job.id,
        status=job.status,
        trials_total=job.trials_total,
        trials_done=trials.get(TrialStatus.done, 0),
        trials_skipped=trials.get(TrialStatus.skipped, 0),
        shards={status: counts.get(status, 0) for status in ShardStatus},
    )
