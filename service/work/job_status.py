"""A job's status, which follows its shards: running once one is leased, done when every shard is done,
failed when nothing is left to run and some shard is dead.

Below the queue, the jobs and the store: the queue settles a job in the transaction that moved its shards,
and hands the job rows it locked here to the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from posbias.schemas import FINISHED_JOB_STATUSES, JobStatus, ShardStatus
from posbias.service.store import Job, Shard, not_found

ACTIVE = (ShardStatus.queued, ShardStatus.leased)
"""Shards that still have work to do."""


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
        raise not_found(job_id)
    return job


def mark_started(session: Session, job_ids: Iterable[int], *, now: datetime) -> None:
    """Queued jobs among `job_ids` become running (a shard of theirs was just leased)."""
    for job_id in sorted(set(job_ids)):
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.queued)
            .values(status=JobStatus.running, started_at=now)
            .execution_options(synchronize_session=False)
        )


def settle(session: Session, job_ids: Iterable[int], *, now: datetime) -> None:
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
