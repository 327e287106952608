"""The SQL job queue: submit jobs, lease their shards, and track both until they finish.

A shard moves `queued -> leased -> done`; a failed or expired lease sends it back to `queued`, or to `dead`
once it has used `max_attempts`; cancelling its job makes it `cancelled`. A job's status follows its shards.

Claims are row locks: PostgreSQL leases with `SELECT ... FOR UPDATE SKIP LOCKED`, so several dispatchers share
one queue without waiting on each other; SQLite serialises writers with `BEGIN IMMEDIATE` (one host). Every
transaction that touches both locks shards before their job, in id order, so two of them cannot deadlock.
Lease expiry uses the dispatchers' clocks (UTC), which must agree to well within `lease_seconds`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from posbias.schemas import (
    ConflictError,
    EngineInfo,
    JobSpec,
    NotFoundError,
    Plan,
    Question,
    RotationCostWarning,
    ShardSpec,
    Trial,
)
from posbias.service import planner, tables
from posbias.service.database import Database
from posbias.service.tables import FINISHED_JOB_STATUSES, Job, JobStatus, Shard, ShardStatus, TrialState

# Keeps IN lists well under SQLite's and PostgreSQL's bound-parameter limits.
IN_CHUNK = 1000
ACTIVE = (ShardStatus.queued, ShardStatus.leased)


def now_utc() -> datetime:
    """The queue's clock."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class Submitted:
    """What `submit` did."""

    job_id: int
    created: bool
    """False when the idempotency key already named a job: that job is returned, nothing is written."""


@dataclass(frozen=True)
class Lease:
    """A leased shard: the self-contained work, and which attempt this is."""

    shard: ShardSpec
    attempt: int
    """1 on the first lease; a shard is dead after `max_attempts` failed attempts."""
    expires_at: datetime
    """When the lease lapses without a heartbeat."""

    @property
    def shard_id(self) -> int:
        """The leased shard's id."""
        return self.shard.shard_id


@dataclass(frozen=True)
class JobRecord:
    """A job as `posbias status` shows it."""

    id: int
    spec: JobSpec
    model: str
    revision: str | None
    model_key: str
    status: JobStatus
    priority: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    idempotency_key: str | None
    trials_total: int
    shards_total: int
    engine: EngineInfo | None
    """What produced the answers; None until the first result is written."""


@dataclass(frozen=True)
class ShardRecord:
    """One shard of a job and where it stands."""

    id: int
    job_id: int
    index: int
    status: ShardStatus
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    trial_count: int


@dataclass(frozen=True)
class JobProgress:
    """How far a job has got (for a progress bar)."""

    job_id: int
    status: JobStatus
    trials_total: int
    trials_done: int
    trials_skipped: int
    shards: dict[ShardStatus, int]
    """Shard count by status (every status present, 0 when none)."""

    @property
    def trials_finished(self) -> int:
        """Trials answered or skipped."""
        return self.trials_done + self.trials_skipped

    @property
    def finished(self) -> bool:
        """True once the job is done, failed or cancelled."""
        return self.status in FINISHED_JOB_STATUSES


def load_spec(data: dict[str, Any]) -> JobSpec:
    """A stored spec back as a `JobSpec`. Its rotation-cost warning was shown at submit; not again here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RotationCostWarning)
        return JobSpec.model_validate(data)


# --- submitting ---------------------------------------------------------------------------------------


def submit(db: Database, spec: JobSpec, plan: Plan, *, idempotency_key: str | None = None) -> Submitted:
    """Write a job with its shards, planned trials and (missing) questions in one transaction.

    With an `idempotency_key` that already names a job, return that job instead (also when two submits
    race); a different spec under the same key is a `ConflictError`.
    """
    _check_plan(plan)
    spec_hash = spec.spec_hash()
    try:
        with db.write() as session:
            if idempotency_key is not None:
                existing = _job_by_key(session, idempotency_key)
                if existing is not None:
                    return _resubmitted(existing, key=idempotency_key, spec_hash=spec_hash)
            job_id = _insert_job(session, spec, plan, idempotency_key=idempotency_key, spec_hash=spec_hash)
    except IntegrityError:
        # Two submits with one key: the unique constraint let one in; the other returns its job.
        if idempotency_key is None:
            raise
        with db.read() as session:
            existing = _job_by_key(session, idempotency_key)
        if existing is None:
            raise
        return _resubmitted(existing, key=idempotency_key, spec_hash=spec_hash)
    return Submitted(job_id=job_id, created=True)


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
    return Submitted(job_id=job.id, created=False)


def _insert_job(
    session: Session, spec: JobSpec, plan: Plan, *, idempotency_key: str | None, spec_hash: str
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

    session.execute(
        insert(Shard),
        [
            {
                "job_id": job.id,
                "index": shard.index,
                "status": ShardStatus.queued,
                "attempts": 0,
                "max_attempts": spec.max_attempts,
                "trial_count": len(shard.trial_indices),
                "model_key": job.model_key,
                "priority": spec.priority,
            }
            for shard in plan.shards
        ],
    )
    shard_ids = dict(session.execute(select(Shard.index, Shard.id).where(Shard.job_id == job.id)).all())
    shard_of = {trial: shard_ids[shard.index] for shard in plan.shards for trial in shard.trial_indices}
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
                "status": TrialState.planned,
            }
            for trial in plan.trials
        ],
    )
    return job.id


def dialect_insert(dialect: str, table: Any) -> Any:
    """`INSERT` with `on_conflict_do_nothing` / `on_conflict_do_update` for the session's dialect."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


# --- leasing ------------------------------------------------------------------------------------------


def lease(
    db: Database,
    *,
    owner: str,
    limit: int,
    lease_seconds: float,
    prefer_model_keys: Collection[str] = (),
    job_ids: Collection[int] | None = None,
    model_keys: Collection[str] | None = None,
    exclude_model_keys: Collection[str] = (),
) -> list[Lease]:
    """Lease up to `limit` queued shards for `owner`, for `lease_seconds`.

    Order: shards of `prefer_model_keys` (models the caller has loaded) first, then higher priority, then
    older jobs, then shard order. `job_ids` restricts leasing to those jobs, `model_keys` to those models,
    and `exclude_model_keys` leaves those models out. Each lease counts an attempt and marks its job running.
    """
    if limit <= 0 or (model_keys is not None and not model_keys):
        return []
    now = now_utc()
    expires = now + timedelta(seconds=lease_seconds)
    prefer = sorted(set(prefer_model_keys))
    with db.write() as session:
        base = [Shard.status == ShardStatus.queued]
        if job_ids is not None:
            base.append(Shard.job_id.in_(sorted(set(job_ids))))
        if model_keys is not None:
            base.append(Shard.model_key.in_(sorted(set(model_keys))))
        if exclude_model_keys:
            base.append(Shard.model_key.not_in(sorted(set(exclude_model_keys))))
        chosen: list[int] = []
        if prefer:
            chosen += _claimable(session, [*base, Shard.model_key.in_(prefer)], limit=limit)
        if len(chosen) < limit:
            others = [*base, Shard.model_key.not_in(prefer)] if prefer else base
            chosen += _claimable(session, others, limit=limit - len(chosen))
        if not chosen:
            return []
        leased = session.execute(
            update(Shard)
            .where(Shard.id.in_(chosen), Shard.status == ShardStatus.queued)
            .values(
                status=ShardStatus.leased,
                attempts=Shard.attempts + 1,
                lease_owner=owner,
                leased_at=now,
                lease_expires_at=expires,
            )
            .returning(Shard.id, Shard.job_id, Shard.attempts)
            .execution_options(synchronize_session=False)
        ).all()
        for job_id in sorted({row.job_id for row in leased}):
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.queued)
                .values(status=JobStatus.running, started_at=now)
                .execution_options(synchronize_session=False)
            )
    attempts = {row.id: row.attempts for row in leased}
    order = [shard_id for shard_id in chosen if shard_id in attempts]
    # The shards are ours now; their trials and questions never change, so they are read after the commit
    # (on SQLite, outside the write lock).
    specs = _shard_specs(db, order)
    return [Lease(shard=specs[i], attempt=attempts[i], expires_at=expires) for i in order]


def _claimable(session: Session, where: list[Any], *, limit: int) -> list[int]:
    query = (
        select(Shard.id)
        .where(*where)
        .order_by(Shard.priority.desc(), Shard.job_id, Shard.index)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.scalars(query))


# Questions already read, per open store. A question row is written once under an id derived from its
# content and never changes, so a dispatcher that leases shard after shard of a job (whose trials reuse the
# same questions) reads each one once; reading them was most of a lease (benchmarks/dispatch.py).
_QUESTIONS: weakref.WeakKeyDictionary[Database, dict[str, Question]] = weakref.WeakKeyDictionary()
QUESTION_CACHE_SIZE = 200_000
"""Questions kept per store (MMLU has 14,042); the cache starts afresh beyond this."""


def _question_cache(db: Database) -> dict[str, Question]:
    cache = _QUESTIONS.setdefault(db, {})
    if len(cache) > QUESTION_CACHE_SIZE:
        cache.clear()
    return cache


def _shard_specs(db: Database, shard_ids: Sequence[int]) -> dict[int, ShardSpec]:
    # Rows are read as plain tuples and turned into records with `model_construct`: they were validated when
    # the job was submitted and never change, and ORM objects plus a second validation of every trial and
    # question cost several times the queries (benchmarks/dispatch.py).
    if not shard_ids:
        return {}
    trial = tables.Trial.__table__.c
    question = tables.Question.__table__.c
    with db.read() as session:
        job_of = dict(session.execute(select(Shard.id, Shard.job_id).where(Shard.id.in_(shard_ids))).all())
        specs = {
            job_id: load_spec(spec)
            for job_id, spec in session.execute(
                select(Job.id, Job.spec).where(Job.id.in_(sorted(set(job_of.values()))))
            )
        }
        trials: dict[int, list[Trial]] = {shard_id: [] for shard_id in shard_ids}
        for shard_id, index, batch_size, iteration, question_ids, choice_orders, rotation in session.execute(
            select(
                trial.shard_id,
                trial.index,
                trial.batch_size,
                trial.iteration,
                trial.question_ids,
                trial.choice_orders,
                trial.rotation,
            )
            .where(trial.shard_id.in_(shard_ids))
            .order_by(trial.shard_id, trial.index)
        ):
            trials[shard_id].append(
                Trial.model_construct(
                    index=index,
                    batch_size=batch_size,
                    iteration=iteration,
                    question_ids=tuple(question_ids),
                    choice_orders=None
                    if choice_orders is None
                    else tuple(tuple(order) for order in choice_orders),
                    rotation=rotation,
                )
            )
        questions = _question_cache(db)
        wanted = sorted(
            {
                qid
                for shard_trials in trials.values()
                for t in shard_trials
                for qid in t.question_ids
                if qid not in questions
            }
        )
        for start in range(0, len(wanted), IN_CHUNK):
            for qid, subject, text, choices, answer in session.execute(
                select(
                    question.id, question.subject, question.question, question.choices, question.answer
                ).where(question.id.in_(wanted[start : start + IN_CHUNK]))
            ):
                questions[qid] = Question.model_construct(
                    id=qid, subject=subject, question=text, choices=tuple(choices), answer=answer
                )
    return {
        shard_id: planner.shard_spec(
            specs[job_of[shard_id]],
            job_id=job_of[shard_id],
            shard_id=shard_id,
            trials=trials[shard_id],
            questions=questions,
        )
        for shard_id in shard_ids
    }


def heartbeat(db: Database, shard_ids: Iterable[int], *, owner: str, lease_seconds: float) -> set[int]:
    """Extend `owner`'s leases on `shard_ids` by `lease_seconds` from now; return the ids still held (a
    shard missing from the answer was recovered, cancelled or finished: stop working on it)."""
    ids = sorted(set(shard_ids))
    if not ids:
        return set()
    expires = now_utc() + timedelta(seconds=lease_seconds)
    with db.write() as session:
        held = _lock_held(session, ids, owner=owner)
        if held:
            session.execute(
                update(Shard)
                .where(Shard.id.in_(held))
                .values(lease_expires_at=expires)
                .execution_options(synchronize_session=False)
            )
    return set(held)


def _lock_held(session: Session, ids: Sequence[int], *, owner: str) -> list[int]:
    """Lock, in id order, those of `ids` that `owner` holds."""
    return list(
        session.scalars(
            select(Shard.id)
            .where(Shard.id.in_(ids), Shard.status == ShardStatus.leased, Shard.lease_owner == owner)
            .order_by(Shard.id)
            .with_for_update()
        )
    )


def fail(db: Database, shard_id: int, *, owner: str, error: str) -> ShardStatus | None:
    """Record a failed attempt by the lease holder: the shard goes back to the queue, or is dead once it
    has used `max_attempts` (its job then fails when nothing else is left). Returns the shard's new status,
    or None when `owner` does not hold it (nothing changes)."""
    now = now_utc()
    with db.write() as session:
        shard = _locked_shard(session, shard_id)
        if shard is None or shard.status != ShardStatus.leased or shard.lease_owner != owner:
            return None
        _end_attempt(shard, error=error, now=now)
        settle_jobs(session, [shard.job_id], now=now)
        return shard.status


def _locked_shard(session: Session, shard_id: int) -> Shard | None:
    return session.scalar(
        select(Shard).where(Shard.id == shard_id).with_for_update().execution_options(populate_existing=True)
    )


def _end_attempt(shard: Shard, *, error: str, now: datetime) -> None:
    shard.last_error = error
    shard.lease_owner = None
    shard.lease_expires_at = None
    if shard.attempts >= shard.max_attempts:
        shard.status = ShardStatus.dead
        shard.finished_at = now
    else:
        shard.status = ShardStatus.queued


def release(db: Database, shard_ids: Iterable[int], *, owner: str) -> int:
    """Give `owner`'s leases on `shard_ids` back to the queue without counting the attempt (a graceful
    shutdown, or a shard the caller cannot run now). Returns how many were released."""
    ids = sorted(set(shard_ids))
    if not ids:
        return 0
    with db.write() as session:
        held = _lock_held(session, ids, owner=owner)
        if held:
            session.execute(
                update(Shard)
                .where(Shard.id.in_(held))
                .values(
                    status=ShardStatus.queued,
                    attempts=Shard.attempts - 1,
                    lease_owner=None,
                    lease_expires_at=None,
                )
                .execution_options(synchronize_session=False)
            )
    return len(held)


def recover_expired(db: Database, *, now: datetime | None = None) -> int:
    """Send shards whose lease has lapsed (`now` defaults to the clock) back to the queue, or to dead when
    they have used their attempts; the error says whose lease expired. Returns how many were recovered."""
    now = now or now_utc()
    with db.write() as session:
        expired = list(
            session.scalars(
                select(Shard)
                .where(Shard.status == ShardStatus.leased, Shard.lease_expires_at < now)
                .order_by(Shard.id)
                .with_for_update(skip_locked=True)
                .execution_options(populate_existing=True)
            )
        )
        for shard in expired:
            assert shard.lease_expires_at is not None
            error = (
                f"lease expired at {shard.lease_expires_at.isoformat(timespec='seconds')} (owner "
                f"{shard.lease_owner}, attempt {shard.attempts} of {shard.max_attempts})"
            )
            _end_attempt(shard, error=error, now=now)
        settle_jobs(session, [shard.job_id for shard in expired], now=now)
    return len(expired)


# --- jobs ---------------------------------------------------------------------------------------------


def cancel_job(db: Database, job_id: int) -> int:
    """Cancel a job: its queued and leased shards are cancelled (a late result for one is discarded).
    Returns how many shards were cancelled. `ConflictError` when the job already finished."""
    now = now_utc()
    with db.write() as session:
        ids = _lock_shards(session, job_id, ACTIVE)
        job = locked_job(session, job_id)
        if job.status in FINISHED_JOB_STATUSES:
            raise ConflictError(f"job {job_id} is already {job.status}: there is nothing to cancel")
        if ids:
            session.execute(
                update(Shard)
                .where(Shard.id.in_(ids))
                .values(status=ShardStatus.cancelled, finished_at=now, lease_expires_at=None)
                .execution_options(synchronize_session=False)
            )
        job.status = JobStatus.cancelled
        job.finished_at = now
    return len(ids)


def retry_job(db: Database, job_id: int) -> int:
    """Requeue a job's dead shards with fresh attempts (their last error is kept). Returns how many.
    `ConflictError` when the job was cancelled or has no dead shards."""
    with db.write() as session:
        ids = _lock_shards(session, job_id, (ShardStatus.dead,))
        job = locked_job(session, job_id)
        if job.status is JobStatus.cancelled:
            raise ConflictError(f"job {job_id} was cancelled: submit it again to rerun it")
        if not ids:
            raise ConflictError(f"job {job_id} has no dead shards to retry (it is {job.status})")
        session.execute(
            update(Shard)
            .where(Shard.id.in_(ids))
            .values(status=ShardStatus.queued, attempts=0, finished_at=None)
            .execution_options(synchronize_session=False)
        )
        job.status = JobStatus.running if job.started_at is not None else JobStatus.queued
        job.finished_at = None
        job.error = None
    return len(ids)


def fail_job(db: Database, job_id: int, *, error: str) -> int:
    """Fail a job that cannot run at all (e.g. its model does not load): its queued and leased shards are
    dead with `error`, so `posbias retry` can requeue them. Returns how many; a finished job is left as is."""
    now = now_utc()
    with db.write() as session:
        ids = _lock_shards(session, job_id, ACTIVE)
        job = locked_job(session, job_id)
        if job.status in FINISHED_JOB_STATUSES or not ids:
            return 0
        session.execute(
            update(Shard)
            .where(Shard.id.in_(ids))
            .values(
                status=ShardStatus.dead,
                last_error=error,
                finished_at=now,
                lease_owner=None,
                lease_expires_at=None,
            )
            .execution_options(synchronize_session=False)
        )
        settle_jobs(session, [job_id], now=now)
    return len(ids)


def _lock_shards(session: Session, job_id: int, statuses: Sequence[ShardStatus]) -> list[int]:
    return list(
        session.scalars(
            select(Shard.id)
            .where(Shard.job_id == job_id, Shard.status.in_(statuses))
            .order_by(Shard.id)
            .with_for_update()
        )
    )


def locked_job(session: Session, job_id: int) -> Job:
    """The job, locked for update until the transaction ends. `NotFoundError` when there is none."""
    # FOR NO KEY UPDATE: inserting rows that reference the job (results, curve points) is not blocked.
    job = session.scalar(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    )
    if job is None:
        raise NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
    return job


def settle_jobs(session: Session, job_ids: Iterable[int], *, now: datetime) -> None:
    """Bring the status of `job_ids` in line with their shards (see `settle_job`), locking each job."""
    for job_id in sorted(set(job_ids)):
        settle_job(session, locked_job(session, job_id), now=now)


def settle_job(session: Session, job: Job, *, now: datetime) -> None:
    """Bring a locked job's status in line with its shards: done when every shard is done, failed when
    nothing is left to run and some shard is dead. Call after changing shards, in the same transaction."""
    if job.status is JobStatus.cancelled:
        return
    active = session.scalar(select(Shard.id).where(Shard.job_id == job.id, Shard.status.in_(ACTIVE)).limit(1))
    if active is not None:
        status = JobStatus.running if job.started_at is not None else JobStatus.queued
    else:
        dead = session.scalar(
            select(func.count()).where(Shard.job_id == job.id, Shard.status == ShardStatus.dead)
        )
        status = JobStatus.failed if dead else JobStatus.done
    if status == job.status:
        return
    job.status = status
    job.finished_at = now if status in FINISHED_JOB_STATUSES else None
    job.error = _job_error(session, job) if status is JobStatus.failed else None


def _job_error(session: Session, job: Job) -> str:
    dead = session.execute(
        select(Shard.last_error)
        .where(Shard.job_id == job.id, Shard.status == ShardStatus.dead)
        .order_by(Shard.finished_at.desc(), Shard.id)
    ).all()
    return f"{len(dead)} of {job.shards_total} shards failed after their last attempt: {dead[0][0]}"


# --- reading ------------------------------------------------------------------------------------------


def pending_model_keys(db: Database, *, job_ids: Collection[int] | None = None) -> set[str]:
    """Model keys with queued or leased shards (of `job_ids`, when given): what the dispatcher must keep
    or load."""
    query = select(Shard.model_key).where(Shard.status.in_(ACTIVE)).distinct()
    if job_ids is not None:
        query = query.where(Shard.job_id.in_(sorted(set(job_ids))))
    with db.read() as session:
        return set(session.scalars(query))


def get_job(db: Database, job_id: int) -> JobRecord:
    """One job. `NotFoundError` when there is none."""
    with db.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
        return _job_record(job)


def job_finished(db: Database, job_id: int) -> bool:
    """True once the job is done, failed or cancelled. `NotFoundError` when there is no such job."""
    with db.read() as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
    if status is None:
        raise NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
    return status in FINISHED_JOB_STATUSES


def list_jobs(
    db: Database, *, status: JobStatus | None = None, model: str | None = None, limit: int | None = None
) -> list[JobRecord]:
    """Jobs, newest first, optionally only those with `status` or of `model`."""
    query = select(Job).order_by(Job.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Job.status == status)
    if model is not None:
        query = query.where(Job.model == model)
    with db.read() as session:
        return [_job_record(job) for job in session.scalars(query)]


def _job_record(job: Job) -> JobRecord:
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
    )


def job_shards(db: Database, job_id: int) -> list[ShardRecord]:
    """A job's shards in order. `NotFoundError` when there is no such job."""
    with db.read() as session:
        if session.get(Job, job_id) is None:
            raise NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
        return [
            ShardRecord(
                id=s.id,
                job_id=s.job_id,
                index=s.index,
                status=s.status,
                attempts=s.attempts,
                max_attempts=s.max_attempts,
                lease_owner=s.lease_owner,
                lease_expires_at=s.lease_expires_at,
                finished_at=s.finished_at,
                last_error=s.last_error,
                trial_count=s.trial_count,
            )
            for s in session.scalars(select(Shard).where(Shard.job_id == job_id).order_by(Shard.index))
        ]


def job_progress(db: Database, job_id: int) -> JobProgress:
    """Trials done and skipped, and shards by status. `NotFoundError` when there is no such job."""
    with db.read() as session:
        job = session.execute(select(Job.status, Job.trials_total).where(Job.id == job_id)).one_or_none()
        if job is None:
            raise NotFoundError(f"there is no job {job_id}: list jobs with `posbias status`")
        trials: dict[TrialState, int] = dict(
            session.execute(
                select(tables.Trial.status, func.count())
                .where(tables.Trial.job_id == job_id, tables.Trial.status != TrialState.planned)
                .group_by(tables.Trial.status)
            ).all()
        )
        shards: dict[ShardStatus, int] = dict(
            session.execute(
                select(Shard.status, func.count()).where(Shard.job_id == job_id).group_by(Shard.status)
            ).all()
        )
    return JobProgress(
        job_id=job_id,
        status=job.status,
        trials_total=job.trials_total,
        trials_done=trials.get(TrialState.done, 0),
        trials_skipped=trials.get(TrialState.skipped, 0),
        shards={status: shards.get(status, 0) for status in ShardStatus},
    )
