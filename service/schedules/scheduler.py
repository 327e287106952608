"""Regression schedules: when a new checkpoint of a model appears, submit a job for it and, once the job is
done, compare its curve with a baseline's and record a verdict.

A schedule names where checkpoints appear (subfolders of a folder, or revisions of a Hugging Face
repository), a job spec template the checkpoint is filled into, a baseline (a fixed job, the first
checkpoint's job, or the previous checkpoint's job) and a `RegressionRule`. `tick` does one round for every
schedule: find new checkpoints, submit their jobs, judge the finished ones, post new verdicts to the webhook.
It never runs a job (`posbias worker` does) and is safe to run from cron, even twice at once: a checkpoint
row is unique per (schedule, name), its job is submitted under the idempotency key
`schedule/<name>/<checkpoint>/<spec hash>`, a verdict is written only over `pending`, and a verdict is
posted by the one tick that claims it. A checkpoint's record, its job and the link between them are written
in one transaction, so a tick that fails or is killed midway leaves no checkpoint without its job.

This module holds the tick and writes what it finds; it calls on `service.schedules.schedule_rows` for the
schedules and their checkpoints, `service.schedules.checkpoints` to find new checkpoints,
`service.schedules.verdicts` for every verdict (it decides, the tick records), and `service.schedules.webhook`
to post verdicts. `service.reports.schedule_report` reads the results back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from posbias.schemas import PosbiasError, QuestionPool
from posbias.schemas.schedule import FINAL_VERDICTS, Announcement, Verdict, VerdictDetail
from posbias.service.schedules.checkpoints import (
    Discovery,
    FolderSource,
    Found,
    HubClient,
    Waiting,
    default_hub,
    order_key,
    scan_folder,
    scan_hub,
)
from posbias.service.schedules.schedule_rows import (
    CheckpointRecord,
    ScheduleRecord,
    checkpoint_records,
    checkpoint_spec,
    get_schedule,
    idempotency_key,
    list_checkpoints,
    list_schedules,
)
from posbias.service.schedules.verdicts import (
    Regressed,
    judge_checkpoint,
    not_submitted,
    reopened,
    standing_regressions,
)
from posbias.service.schedules.webhook import announce
from posbias.service.settings import Settings
from posbias.service.store import Checkpoint, Database, Schedule, dialect_insert, now_utc
from posbias.service.work import jobs, submission

log = logging.getLogger(__name__)


# --- tick -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """A checkpoint's job as a tick submitted it (or found it submitted by a concurrent tick)."""

    checkpoint: str
    job_id: int
    created: bool


@dataclass(frozen=True)
class Settled:
    """A verdict this tick reached and wrote."""

    checkpoint: str
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class ScheduleTick:
    """What a tick did for one schedule."""

    schedule: str
    paused: bool
    discovered: list[str]
    """Checkpoints this tick recorded for the first time."""
    waiting: list[Waiting]
    submitted: list[Submitted]
    settled: list[Settled]
    problem: str | None


@dataclass(frozen=True)
class TickReport:
    """What one tick did, and where the schedules stand."""

    schedules: list[ScheduleTick]
    announced: list[str]
    """`schedule/checkpoint` of verdicts posted to the webhook."""
    announce_failures: list[str]
    regressions: list[Regressed]
    """Schedules whose newest checkpoint with a pass/regression verdict is a regression: what
    `tick --fail-on-regression` fails on (the same state gives the same answer, however often it runs)."""


Progress = Callable[[str, int, int], None]
"""`on_progress(schedule, checkpoints taken, checkpoints to take)`, called as a tick submits their jobs."""


def tick(
    db: Database,
    *,
    settings: Settings,
    name: str | None = None,
    hub: HubClient | None = None,
    on_progress: Progress | None = None,
) -> TickReport:
    """One round for schedule `name` (default: every schedule): find new checkpoints, submit their jobs,
    judge finished jobs against their baselines, and post new verdicts to `settings.webhook_url`.

    A paused schedule only gets its verdicts. A source that cannot be looked at (hub unreachable, folder
    gone) is recorded on its schedule and the tick carries on. Each checkpoint is one transaction: its
    record, its job and the link between them are stored together or not at all (`_take`).
    """
    schedules = [get_schedule(db, name)] if name is not None else list_schedules(db)
    done = [
        _tick_one(db, schedule, settings=settings, hub=hub, on_progress=on_progress) for schedule in schedules
    ]
    announced, failures = announce(db, settings=settings)
    return TickReport(
        schedules=done,
        announced=announced,
        announce_failures=failures,
        regressions=standing_regressions(db, [s.name for s in schedules]),
    )


def _tick_one(
    db: Database,
    schedule: ScheduleRecord,
    *,
    settings: Settings,
    hub: HubClient | None,
    on_progress: Progress | None,
) -> ScheduleTick:
    discovery = Discovery()
    discovered: list[str] = []
    submitted: list[Submitted] = []
    if not schedule.paused:
        if isinstance(schedule.source, FolderSource):
            if schedule.source.path.is_dir():
                discovery = scan_folder(schedule.source.path)
            else:
                discovery = Discovery(problem=f"checkpoint folder {schedule.source.path} is gone (moved?)")
        else:
            known = {c.name for c in list_checkpoints(db, schedule.name)}
            discovery = scan_hub(hub or default_hub(), schedule.source, known=known)
        discovered, submitted = _take_checkpoints(
            db, schedule, discovery.found, settings=settings, on_progress=on_progress
        )
    with db.write() as session:
        session.execute(
            update(Schedule)
            .where(Schedule.id == schedule.id)
            .values(last_tick_at=now_utc(), **({} if schedule.paused else {"last_error": discovery.problem}))
        )
    if discovery.problem:
        log.warning("schedule %s: %s", schedule.name, discovery.problem)
    return ScheduleTick(
        schedule=schedule.name,
        paused=schedule.paused,
        discovered=discovered,
        waiting=discovery.waiting,
        submitted=submitted,
        settled=_evaluate(db, schedule, settings=settings),
        problem=discovery.problem,
    )


def _take_checkpoints(
    db: Database,
    schedule: ScheduleRecord,
    found: Sequence[Found],
    *,
    settings: Settings,
    on_progress: Progress | None,
) -> tuple[list[str], list[Submitted]]:
    """Record each checkpoint in `found` not recorded yet and submit its job, and submit one for each
    recorded checkpoint still waiting for its job, in checkpoint order; returns the names this call
    recorded and the jobs it submitted. A checkpoint whose job cannot be prepared (its spec, its model
    folder, the dataset) gets verdict `error` with the reason."""
    with db.read() as session:
        recorded = {c.name: c for c in checkpoint_records(session, schedule.id)}
    now = now_utc()
    todo = [
        *(c for c in recorded.values() if c.job_id is None and c.verdict is Verdict.pending),
        *(_new_record(f, discovered_at=now) for f in found if f.name not in recorded),
    ]
    todo.sort(key=lambda c: order_key(c.name, c.step))
    pools: dict[str, QuestionPool] = {}  # one template: its dataset is read once for every checkpoint
    discovered: list[str] = []
    submitted: list[Submitted] = []
    for done, checkpoint in enumerate(todo):
        if on_progress is not None:
            on_progress(schedule.name, done, len(todo))
        inserted, job = _take(db, schedule, checkpoint, settings=settings, pools=pools)
        if inserted:
            discovered.append(checkpoint.name)
        if job is not None:
            submitted.append(job)
    if on_progress is not None and todo:
        on_progress(schedule.name, len(todo), len(todo))
    return discovered, submitted


def _new_record(found: Found, *, discovered_at: datetime) -> CheckpointRecord:
    """A checkpoint found but not recorded yet (id 0 until `_take` inserts it)."""
    return CheckpointRecord(
        id=0,
        name=found.name,
        step=found.step,
        model=found.model,
        revision=found.revision,
        discovered_at=discovered_at,
        job_id=None,
        job_status=None,
        job_error=None,
        verdict=Verdict.pending,
        detail=None,
        evaluated_at=None,
        announcement=None,
    )


def _take(
    db: Database,
    schedule: ScheduleRecord,
    checkpoint: CheckpointRecord,
    *,
    settings: Settings,
    pools: dict[str, QuestionPool],
) -> tuple[bool, Submitted | None]:
    """One checkpoint in one transaction: its record (when new), and its job with the link to it, or its
    verdict `error`; a failure anywhere rolls all of it back, so no checkpoint is stored without its job.
    The job is prepared first, outside the transaction (planning may take seconds, and on SQLite the write
    lock is held from the first statement on). Returns whether this call recorded the checkpoint, and its
    job (`created` False when a concurrent tick submitted it first)."""
    prepared: tuple[str, submission.Prepared] | PosbiasError
    try:
        spec = checkpoint_spec(schedule, model=checkpoint.model, revision=checkpoint.revision)
        key = idempotency_key(schedule.name, checkpoint.name, spec)
        ready = submission.prepare(spec, settings=settings, pools=pools)
        jobs.check_submission(db, ready.spec, ready.plan, idempotency_key=key)
        prepared = (key, ready)
    except PosbiasError as exc:
        prepared = exc
    try:
        return _write_take(db, schedule, checkpoint, prepared, settings=settings)
    except IntegrityError:
        # Another writer inserted this job's key between the look for it and the insert (PostgreSQL only:
        # SQLite has one writer at a time). Everything was rolled back; now the look finds that job.
        return _write_take(db, schedule, checkpoint, prepared, settings=settings)


def _write_take(
    db: Database,
    schedule: ScheduleRecord,
    checkpoint: CheckpointRecord,
    prepared: tuple[str, submission.Prepared] | PosbiasError,
    *,
    settings: Settings,
) -> tuple[bool, Submitted | None]:
    with db.write() as session:
        inserted, row = _checkpoint_row(session, schedule.id, checkpoint)
        if row is None:  # its schedule was removed meanwhile
            return False, None
        if row.job_id is not None:
            return inserted, Submitted(checkpoint=checkpoint.name, job_id=row.job_id, created=False)
        if row.verdict is not Verdict.pending:
            return inserted, None  # a concurrent tick judged it
        if isinstance(prepared, PosbiasError):
            detail = not_submitted(schedule, checkpoint, problem=prepared)
            _settle_in(session, row.id, detail, settings=settings, from_verdict=Verdict.pending)
            return inserted, None
        key, ready = prepared
        job = jobs.submit_in(
            session,
            ready.spec,
            ready.plan,
            idempotency_key=key,
            endpoint=ready.endpoint,
            context=ready.engine_context,
        )
        _link(session, row.id, job.job_id)
    return inserted, Submitted(checkpoint=checkpoint.name, job_id=job.job_id, created=job.created)


def _checkpoint_row(
    session: Session, schedule_id: int, checkpoint: CheckpointRecord
) -> tuple[bool, Checkpoint | None]:
    """The checkpoint's row, inserted when new (ON CONFLICT DO NOTHING on (schedule, name): a concurrent
    tick that inserted it first wins) and locked for this transaction; whether this call inserted it."""
    statement = (
        dialect_insert(session.get_bind().dialect.name, Checkpoint)
        .values(
            schedule_id=schedule_id,
            name=checkpoint.name,
            step=checkpoint.step,
            model=checkpoint.model,
            revision=checkpoint.revision,
            discovered_at=checkpoint.discovered_at,
            verdict=Verdict.pending,
            announce_attempts=0,
        )
        .on_conflict_do_nothing(index_elements=["schedule_id", "name"])
        .returning(Checkpoint.id)
    )
    inserted = session.scalar(statement) is not None
    row = session.scalar(
        select(Checkpoint)
        .where(Checkpoint.schedule_id == schedule_id, Checkpoint.name == checkpoint.name)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return inserted, row


def _link(session: Session, checkpoint_id: int, job_id: int) -> None:
    """Name the checkpoint's job on its record (in the transaction that wrote the job)."""
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == checkpoint_id, Checkpoint.job_id.is_(None))
        .values(job_id=job_id)
    )


def _settle(
    db: Database,
    checkpoint_id: int,
    detail: VerdictDetail,
    *,
    settings: Settings,
    from_verdict: Verdict,
) -> bool:
    """Write a verdict over `from_verdict` in a transaction of its own (see `_settle_in`)."""
    with db.write() as session:
        return _settle_in(session, checkpoint_id, detail, settings=settings, from_verdict=from_verdict)


def _settle_in(
    session: Session,
    checkpoint_id: int,
    detail: VerdictDetail,
    *,
    settings: Settings,
    from_verdict: Verdict,
) -> bool:
    """Write a verdict over `from_verdict` (only there: a concurrent tick that wrote first wins). A final
    verdict is queued for the webhook when one is configured. Returns True when this call wrote it."""
    final = detail.verdict in FINAL_VERDICTS
    values: dict[str, Any] = {
        "verdict": detail.verdict,
        "detail": detail.model_dump(mode="json"),
        "evaluated_at": now_utc(),
        "baseline_job_id": detail.baseline_job_id,
    }
    if final:
        values["announcement"] = Announcement.due if settings.webhook_url else None
        values["announce_attempts"] = 0
        values["announce_error"] = None
        values["announced_at"] = None
    statement = update(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.verdict == from_verdict)
    written = session.scalars(statement.values(**values).returning(Checkpoint.id)).all()
    return bool(written)


# --- recording verdicts --------------------------------------------------------------------------------


def _evaluate(db: Database, schedule: ScheduleRecord, *, settings: Settings) -> list[Settled]:
    """Judge, in checkpoint order, every checkpoint whose verdict is pending (so that an earlier one that
    failed is known to be no baseline before a later one looks for its baseline)."""
    with db.read() as session:
        states = checkpoint_records(session, schedule.id)
    again = _reopen_retried(db, states)
    states = [replace(s, verdict=Verdict.pending, detail=None) if s.id in again else s for s in states]
    settled = []
    for index, checkpoint in enumerate(states):
        if checkpoint.verdict is not Verdict.pending or checkpoint.job_id is None:
            continue
        detail = judge_checkpoint(db, schedule, checkpoint, states=states)
        if detail.verdict is Verdict.pending:
            if checkpoint.detail is None or checkpoint.detail.reason != detail.reason:
                _settle(db, checkpoint.id, detail, settings=settings, from_verdict=Verdict.pending)
            continue
        # Later checkpoints pick their baseline from this verdict, whichever tick writes it.
        states[index] = replace(checkpoint, verdict=detail.verdict, detail=detail)
        if _settle(db, checkpoint.id, detail, settings=settings, from_verdict=Verdict.pending):
            settled.append(Settled(checkpoint=checkpoint.name, verdict=detail.verdict, reason=detail.reason))
    return settled


def _reopen_retried(db: Database, states: Sequence[CheckpointRecord]) -> set[int]:
    """Write back `verdicts.reopened`: those checkpoints are pending again. Returns their ids."""
    reopen = reopened(states)
    if reopen:
        with db.write() as session:
            session.execute(
                update(Checkpoint)
                .where(Checkpoint.id.in_(reopen), Checkpoint.verdict == Verdict.error)
                .values(verdict=Verdict.pending, detail=None, evaluated_at=None, announcement=None)
            )
    return set(reopen)
