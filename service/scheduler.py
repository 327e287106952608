"""Regression schedules: when a new checkpoint of a model appears, submit a job for it and, once the job is
done, compare its curve with a baseline's and record a verdict.

A schedule names where checkpoints appear (subfolders of a folder, or revisions of a Hugging Face
repository), a job spec template the checkpoint is filled into, a baseline (a fixed job, the first
checkpoint's job, or the previous checkpoint's job) and a `RegressionRule`. `tick` does one round for every
schedule: find new checkpoints, submit their jobs, judge the finished ones, post new verdicts to the webhook.
It never runs a job (`posbias worker` does) and is safe to run from cron, even twice at once: a checkpoint
row is unique per (schedule, name), its job is submitted under the idempotency key
`schedule/<name>/<checkpoint>/<spec hash>`, a verdict is written only over `pending`, and a verdict is
posted by the one tick that claims it.

This module holds the tick and writes what it finds; it calls on `service.schedules` for the schedules and
their checkpoints, `service.checkpoints` to find new checkpoints, `service.verdicts` for every verdict (it
decides, the tick records), and `service.webhook` to post verdicts. `service.schedule_report` reads the
results back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import update

from posbias.schemas import PosbiasError
from posbias.schemas.schedule import FINAL_VERDICTS, Announcement, Verdict, VerdictDetail
from posbias.service import jobs, submission
from posbias.service.checkpoints import (
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
from posbias.service.database import Database, dialect_insert, now_utc
from posbias.service.schedules import (
    CheckpointRecord,
    ScheduleRecord,
    checkpoint_records,
    checkpoint_spec,
    get_schedule,
    idempotency_key,
    list_checkpoints,
    list_schedules,
)
from posbias.service.settings import Settings
from posbias.service.tables import Checkpoint, Schedule
from posbias.service.verdicts import (
    Regressed,
    judge_checkpoint,
    not_submitted,
    reopened,
    standing_regressions,
)
from posbias.service.webhook import announce

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


def tick(
    db: Database, *, settings: Settings, name: str | None = None, hub: HubClient | None = None
) -> TickReport:
    """One round for schedule `name` (default: every schedule): find new checkpoints, submit their jobs,
    judge finished jobs against their baselines, and post new verdicts to `settings.webhook_url`.

    A paused schedule only gets its verdicts. A source that cannot be looked at (hub unreachable, folder
    gone) is recorded on its schedule and the tick carries on.
    """
    schedules = [get_schedule(db, name)] if name is not None else list_schedules(db)
    done = [_tick_one(db, schedule, settings=settings, hub=hub) for schedule in schedules]
    announced, failures = announce(db, settings=settings)
    return TickReport(
        schedules=done,
        announced=announced,
        announce_failures=failures,
        regressions=standing_regressions(db, [s.name for s in schedules]),
    )


def _tick_one(
    db: Database, schedule: ScheduleRecord, *, settings: Settings, hub: HubClient | None
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
        discovered = _record_checkpoints(db, schedule.id, discovery.found)
        submitted = _submit_waiting(db, schedule, settings=settings)
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


def _record_checkpoints(db: Database, schedule_id: int, found: Sequence[Found]) -> list[str]:
    """Insert the checkpoints not recorded yet; returns the names this call inserted. ON CONFLICT DO
    NOTHING on (schedule, name): a concurrent tick that inserted one first wins, and nothing fails."""
    if not found:
        return []
    now = now_utc()
    ordered = sorted(found, key=lambda f: order_key(f.name, f.step))
    rows = [
        {
            "schedule_id": schedule_id,
            "name": f.name,
            "step": f.step,
            "model": f.model,
            "revision": f.revision,
            "discovered_at": now,
            "verdict": Verdict.pending,
            "announce_attempts": 0,
        }
        for f in ordered
    ]
    inserted: list[str] = []
    with db.write() as session:
        for start in range(0, len(rows), 500):
            statement = (
                dialect_insert(db.dialect, Checkpoint)
                .values(rows[start : start + 500])
                .on_conflict_do_nothing(index_elements=["schedule_id", "name"])
                .returning(Checkpoint.name)
            )
            inserted += session.scalars(statement).all()
    new = set(inserted)
    return [f.name for f in ordered if f.name in new]


def _submit_waiting(db: Database, schedule: ScheduleRecord, *, settings: Settings) -> list[Submitted]:
    """Submit a job for every checkpoint that has none yet. A checkpoint whose job cannot be prepared
    (its spec, its model folder, the dataset) gets verdict `error` with the reason."""
    submitted = []
    with db.read() as session:
        waiting = [
            c
            for c in checkpoint_records(session, schedule.id)
            if c.job_id is None and c.verdict is Verdict.pending
        ]
    for checkpoint in waiting:
        try:
            spec = checkpoint_spec(schedule, model=checkpoint.model, revision=checkpoint.revision)
            prepared = submission.prepare(spec, settings=settings)
            job = jobs.submit(
                db,
                prepared.spec,
                prepared.plan,
                idempotency_key=idempotency_key(schedule.name, checkpoint.name, spec),
                endpoint=prepared.endpoint,
                context=prepared.engine_context,
            )
        except PosbiasError as exc:
            detail = not_submitted(schedule, checkpoint, problem=exc)
            _settle(db, checkpoint.id, detail, settings=settings, from_verdict=Verdict.pending, job_none=True)
            continue
        with db.write() as session:
            session.execute(
                update(Checkpoint)
                .where(Checkpoint.id == checkpoint.id, Checkpoint.job_id.is_(None))
                .values(job_id=job.job_id)
            )
        submitted.append(Submitted(checkpoint=checkpoint.name, job_id=job.job_id, created=job.created))
    return submitted


def _settle(
    db: Database,
    checkpoint_id: int,
    detail: VerdictDetail,
    *,
    settings: Settings,
    from_verdict: Verdict,
    job_none: bool = False,
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
    if job_none:
        statement = statement.where(Checkpoint.job_id.is_(None))
    with db.write() as session:
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
