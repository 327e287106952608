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

This module holds the schedules (add, list, pause, remove), the job spec of a checkpoint, the tick and the
report; the tick calls on `service.checkpoints` to find checkpoints, `service.verdicts` to compare two
jobs, and `service.webhook` to post verdicts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from posbias.schemas import (
    ConflictError,
    Curve,
    EngineName,
    Interval,
    JobSpec,
    NotFoundError,
    PosbiasError,
    first_line,
)
from posbias.schemas.schedule import (
    FINAL_VERDICTS,
    PositionDrop,
    RegressionRule,
    Verdict,
    VerdictDetail,
)
from posbias.service import queue, report, store, submission
from posbias.service.checkpoints import (
    Discovery,
    FolderSource,
    Found,
    HubClient,
    HubSource,
    Source,
    Waiting,
    default_hub,
    order_key,
    scan_folder,
    scan_hub,
)
from posbias.service.database import Database
from posbias.service.datasets import check_pool, load_questions
from posbias.service.settings import Settings
from posbias.service.tables import (
    FINISHED_JOB_STATUSES,
    Announcement,
    BaselineKind,
    Checkpoint,
    HubRevisions,
    Job,
    JobStatus,
    Schedule,
    ScheduleSource,
)
from posbias.service.verdicts import compare_jobs
from posbias.service.webhook import announce

log = logging.getLogger(__name__)

SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HUB_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
FAKE_HOOK = "posbias-fake.json"
"""Test and demo hook of the fake engine: a checkpoint folder may carry this file, whose `fake` block and
`seed` replace the template's, so that one fake "checkpoint" can behave worse than another. Only read when
the template's engine is `fake`; a real engine never sees it."""
FAKE_HOOK_KEYS = frozenset({"fake", "seed"})
MAX_KEY_LENGTH = 200  # jobs.idempotency_key


def now_utc() -> datetime:
    """The scheduler's clock."""
    return datetime.now(UTC)


# --- records ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleRecord:
    """A schedule as `posbias schedule show` prints it."""

    id: int
    name: str
    source: Source
    template: dict[str, Any]
    """The job spec without `model` and `revision`."""
    baseline: BaselineKind
    baseline_job_id: int | None
    rule: RegressionRule
    paused: bool
    created_at: datetime
    last_tick_at: datetime | None
    last_error: str | None

    @property
    def source_text(self) -> str:
        """Where checkpoints come from, in words."""
        if isinstance(self.source, FolderSource):
            return f"folder {self.source.path}"
        return f"hub {self.source.repo} ({self.source.revisions.value} of {self.source.branch})"

    @property
    def baseline_text(self) -> str:
        """`first`, `previous` or `job N`."""
        return f"job {self.baseline_job_id}" if self.baseline is BaselineKind.job else self.baseline.value


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint of a schedule with its job's status and its verdict."""

    id: int
    name: str
    step: int | None
    model: str
    revision: str | None
    discovered_at: datetime
    job_id: int | None
    job_status: JobStatus | None
    job_error: str | None
    verdict: Verdict
    detail: VerdictDetail | None
    evaluated_at: datetime | None
    announcement: Announcement | None

    @property
    def reason(self) -> str:
        """Why the verdict is what it is (or what it waits for)."""
        if self.detail is not None:
            return self.detail.reason
        if self.job_id is None:
            return "waiting for its job to be submitted"
        return f"job {self.job_id} is {self.job_status.value if self.job_status else 'gone'}"


# --- managing schedules ---------------------------------------------------------------------------------


def load_template(text: str) -> dict[str, Any]:
    """A job spec template from inline JSON (`{...}`) or a YAML/JSON file. `model` and `revision` are
    dropped: each checkpoint fills them in."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise PosbiasError(
                f"the inline spec template is not valid JSON: {exc.msg} (column {exc.colno})"
            ) from None
        where = "the inline spec template"
    else:
        file = Path(stripped).expanduser()
        try:
            content = file.read_text()
        except OSError as exc:
            raise PosbiasError(
                f"cannot read spec template {file}: {exc.strerror}; give a YAML/JSON file or inline JSON"
            ) from None
        try:
            data = json.loads(content) if file.suffix.lower() == ".json" else yaml.safe_load(content)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            raise PosbiasError(f"spec template {file} is not valid YAML/JSON: {first_line(exc)}") from None
        where = f"spec template {file}"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PosbiasError(f'{where} must be a mapping of job spec fields, e.g. {{"iterations": 100}}')
    return {key: value for key, value in data.items() if key not in {"model", "revision"}}


def parse_baseline(text: str) -> tuple[BaselineKind, int | None]:
    """`first`, `previous`, or a job id."""
    value = text.strip().lower()
    if value in {BaselineKind.first.value, BaselineKind.previous.value}:
        return BaselineKind(value), None
    if value.isdigit():
        return BaselineKind.job, int(value)
    raise PosbiasError(f"the baseline must be `first`, `previous` or a job id (got {text!r})")


def add_schedule(
    db: Database,
    name: str,
    *,
    source: Source,
    template: dict[str, Any],
    baseline: str,
    rule: RegressionRule,
    settings: Settings,
) -> ScheduleRecord:
    """Check everything a tick will need (the name, the source, the template against the dataset, the
    baseline job) and store the schedule. Raises `PosbiasError` naming the fix; `ConflictError` when the
    name is taken."""
    if not SCHEDULE_NAME.match(name):
        raise PosbiasError(
            f"schedule name {name!r} must be 1-64 letters, digits, `.`, `_` or `-`, starting with a letter "
            "or digit"
        )
    if isinstance(source, FolderSource):
        folder = source.path.expanduser()
        if not folder.is_dir():
            raise PosbiasError(f"checkpoint folder {folder} does not exist; check the path (create it first)")
        source = FolderSource(path=folder.resolve())
    elif not HUB_REPO.match(source.repo):
        raise PosbiasError(f"{source.repo!r} is not a Hugging Face repository id (owner/name)")
    spec = template_spec(template, model="checkpoint")
    check_pool(spec, pool=load_questions(spec.dataset, mmlu_dir=settings.mmlu_dir))
    if rule.max_ratio_drop is not None and max(spec.batch_sizes) < 2:
        raise PosbiasError(
            "--max-ratio-drop compares last/first ratios: the template needs a batch size above 1"
        )
    kind, baseline_job = parse_baseline(baseline)
    if baseline_job is not None:
        job = queue.get_job(db, baseline_job)  # NotFoundError names the fix
        common = set(job.spec.batch_sizes) & set(spec.batch_sizes)
        if not common:
            raise PosbiasError(
                f"baseline job {baseline_job} has batch sizes {list(job.spec.batch_sizes)} and the template "
                f"{list(spec.batch_sizes)}: they need one in common"
            )
    row = Schedule(
        name=name,
        source_kind=ScheduleSource.folder if isinstance(source, FolderSource) else ScheduleSource.hub,
        source=str(source.path) if isinstance(source, FolderSource) else source.repo,
        hub_branch=None if isinstance(source, FolderSource) else source.branch,
        hub_revisions=None if isinstance(source, FolderSource) else source.revisions,
        template=template,
        baseline=kind,
        baseline_job_id=baseline_job,
        rule=rule.model_dump(mode="json"),
        paused=False,
        created_at=now_utc(),
    )
    try:
        with db.write() as session:
            if session.scalar(select(Schedule.id).where(Schedule.name == name)) is not None:
                raise _name_taken(name)
            session.add(row)
    except IntegrityError:  # a concurrent add of the same name
        raise _name_taken(name) from None
    return get_schedule(db, name)


def _name_taken(name: str) -> ConflictError:
    return ConflictError(
        f"there is already a schedule named {name}: pick another name, or `posbias schedule remove {name}`"
    )


def list_schedules(db: Database) -> list[ScheduleRecord]:
    """Every schedule, by name."""
    with db.read() as session:
        return [_schedule_record(s) for s in session.scalars(select(Schedule).order_by(Schedule.name))]


def get_schedule(db: Database, name: str) -> ScheduleRecord:
    """One schedule. `NotFoundError` when there is none."""
    with db.read() as session:
        return _schedule_record(_schedule_row(session, name))


def _schedule_row(session: Session, name: str) -> Schedule:
    row = session.scalar(select(Schedule).where(Schedule.name == name))
    if row is None:
        raise NotFoundError(f"there is no schedule {name!r}: list them with `posbias schedule list`")
    return row


def set_paused(db: Database, name: str, *, paused: bool) -> ScheduleRecord:
    """Pause (no new checkpoints are picked up, no jobs submitted; verdicts still come in) or resume."""
    with db.write() as session:
        _schedule_row(session, name).paused = paused
    return get_schedule(db, name)


def remove_schedule(db: Database, name: str) -> int:
    """Delete a schedule and its checkpoint records; their jobs and results stay. Returns how many
    checkpoints were forgotten."""
    with db.write() as session:
        row = _schedule_row(session, name)
        count = len(session.scalars(select(Checkpoint.id).where(Checkpoint.schedule_id == row.id)).all())
        session.delete(row)
    return count


def list_checkpoints(db: Database, name: str) -> list[CheckpointRecord]:
    """A schedule's checkpoints in order (step, then name). `NotFoundError` when there is no schedule."""
    with db.read() as session:
        schedule = _schedule_row(session, name)
        return _checkpoints(session, schedule.id)


def _checkpoints(session: Session, schedule_id: int) -> list[CheckpointRecord]:
    rows = session.execute(
        select(Checkpoint, Job.status, Job.error)
        .outerjoin(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.schedule_id == schedule_id)
    ).all()
    records = [
        CheckpointRecord(
            id=c.id,
            name=c.name,
            step=c.step,
            model=c.model,
            revision=c.revision,
            discovered_at=c.discovered_at,
            job_id=c.job_id,
            job_status=status,
            job_error=error,
            verdict=c.verdict,
            detail=None if c.detail is None else VerdictDetail.model_validate(c.detail),
            evaluated_at=c.evaluated_at,
            announcement=c.announcement,
        )
        for c, status, error in rows
    ]
    return sorted(records, key=lambda r: order_key(r.name, r.step))


def _schedule_record(row: Schedule) -> ScheduleRecord:
    source: Source
    if row.source_kind is ScheduleSource.folder:
        source = FolderSource(path=Path(row.source))
    else:
        source = HubSource(
            repo=row.source,
            branch=row.hub_branch or "main",
            revisions=row.hub_revisions or HubRevisions.commits,
        )
    return ScheduleRecord(
        id=row.id,
        name=row.name,
        source=source,
        template=dict(row.template),
        baseline=row.baseline,
        baseline_job_id=row.baseline_job_id,
        rule=RegressionRule.model_validate(row.rule),
        paused=row.paused,
        created_at=row.created_at,
        last_tick_at=row.last_tick_at,
        last_error=row.last_error,
    )


# --- job specs ------------------------------------------------------------------------------------------


def template_spec(
    template: dict[str, Any], *, model: str = "checkpoint", revision: str | None = None
) -> JobSpec:
    """The template as a job spec for `model`; raises `PosbiasError` naming the field to fix."""
    data = {**template, "model": model}
    if revision is not None:
        data["revision"] = revision
    return JobSpec.build(data, source="spec template")


def checkpoint_spec(schedule: ScheduleRecord, *, model: str, revision: str | None) -> JobSpec:
    """The job spec of one checkpoint: the template with `model` (and `revision`) filled in, and, for the
    fake engine only, the checkpoint folder's `posbias-fake.json` applied (see `FAKE_HOOK`)."""
    spec = template_spec(schedule.template, model=model, revision=revision)
    hook = Path(model) / FAKE_HOOK
    if spec.engine.name is not EngineName.fake or not isinstance(schedule.source, FolderSource):
        return spec
    if not hook.is_file():
        return spec
    try:
        overrides = json.loads(hook.read_text())
    except (OSError, ValueError) as exc:
        raise PosbiasError(f"cannot read {hook}: {exc}") from None
    if (
        not isinstance(overrides, dict)
        or not set(overrides) <= FAKE_HOOK_KEYS
        or not isinstance(overrides.get("fake", {}), dict)
    ):
        raise PosbiasError(
            f"{hook} must be a JSON object with a `fake` block and/or a `seed` (a fake-engine test hook)"
        )
    data = spec.model_dump(mode="json")
    data["fake"] = {**data["fake"], **overrides.get("fake", {})}
    if "seed" in overrides:
        data["seed"] = overrides["seed"]
    return JobSpec.build(data, source=str(hook))


def idempotency_key(schedule: str, checkpoint: str, spec: JobSpec) -> str:
    """`schedule/<name>/<checkpoint>/<spec hash>`; a checkpoint name too long for the column is hashed."""
    key = f"schedule/{schedule}/{checkpoint}/{spec.spec_hash()}"
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(checkpoint.encode()).hexdigest()[:16]
    return f"schedule/{schedule}/sha256:{digest}/{spec.spec_hash()}"


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
class Regressed:
    """A schedule whose newest compared checkpoint is a regression."""

    schedule: str
    checkpoint: str
    reason: str


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
        dialect_insert = postgresql.insert if db.dialect == "postgresql" else sqlite.insert
        for start in range(0, len(rows), 500):
            statement = (
                dialect_insert(Checkpoint)
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
            c for c in _checkpoints(session, schedule.id) if c.job_id is None and c.verdict is Verdict.pending
        ]
    for checkpoint in waiting:
        try:
            spec = checkpoint_spec(schedule, model=checkpoint.model, revision=checkpoint.revision)
            prepared = submission.prepare(spec, settings=settings)
            job = submission.submit(
                db, prepared, idempotency_key=idempotency_key(schedule.name, checkpoint.name, spec)
            )
        except PosbiasError as exc:
            detail = VerdictDetail(
                schedule=schedule.name,
                checkpoint=checkpoint.name,
                verdict=Verdict.error,
                reason=f"could not submit its job: {exc}",
            )
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


# --- judging checkpoints --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BaselineChoice:
    """Whom a checkpoint is compared with."""

    itself: bool = False
    """The checkpoint is the baseline."""
    job_id: int | None = None
    status: JobStatus | None = None
    error: str | None = None
    checkpoint: str | None = None


def _evaluate(db: Database, schedule: ScheduleRecord, *, settings: Settings) -> list[Settled]:
    """Judge, in checkpoint order, every checkpoint whose verdict is pending (so that an earlier one that
    failed is known to be no baseline before a later one looks for its baseline)."""
    with db.read() as session:
        states = _checkpoints(session, schedule.id)
    reopened = _reopen_retried(db, states)
    states = [replace(s, verdict=Verdict.pending, detail=None) if s.id in reopened else s for s in states]
    settled = []
    for index, checkpoint in enumerate(states):
        if checkpoint.verdict is not Verdict.pending or checkpoint.job_id is None:
            continue
        detail = _judge(db, schedule, checkpoint, states=states)
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
    """A checkpoint whose failed job was put back in the queue (`posbias retry`) is pending again.
    Returns the ids of those reopened."""
    reopen = [
        s.id
        for s in states
        if s.verdict is Verdict.error
        and s.job_status is not None
        and s.job_status not in FINISHED_JOB_STATUSES
    ]
    if reopen:
        with db.write() as session:
            session.execute(
                update(Checkpoint)
                .where(Checkpoint.id.in_(reopen), Checkpoint.verdict == Verdict.error)
                .values(verdict=Verdict.pending, detail=None, evaluated_at=None, announcement=None)
            )
    return set(reopen)


def _judge(
    db: Database,
    schedule: ScheduleRecord,
    checkpoint: CheckpointRecord,
    *,
    states: Sequence[CheckpointRecord],
) -> VerdictDetail:
    def detail(verdict: Verdict, reason: str, **fields: Any) -> VerdictDetail:
        return VerdictDetail(
            schedule=schedule.name,
            checkpoint=checkpoint.name,
            verdict=verdict,
            reason=reason,
            job_id=checkpoint.job_id,
            **fields,
        )

    status = checkpoint.job_status
    if status is None:
        return detail(Verdict.error, "its job was deleted")
    if status is JobStatus.failed:
        return detail(Verdict.error, checkpoint.job_error or f"job {checkpoint.job_id} failed")
    if status is JobStatus.cancelled:
        return detail(Verdict.error, f"job {checkpoint.job_id} was cancelled")
    if status is not JobStatus.done:
        return detail(Verdict.pending, f"job {checkpoint.job_id} is {status.value}")
    base = _baseline_for(db, schedule, checkpoint, states=states)
    if base.itself:
        which = (
            "first checkpoint" if schedule.baseline is BaselineKind.first else "first checkpoint, no previous"
        )
        return detail(Verdict.baseline, f"the schedule's baseline ({which})")
    where = f"baseline checkpoint {base.checkpoint}" if base.checkpoint else "baseline"
    if base.job_id is None:
        return detail(
            Verdict.pending, f"waiting for {where} to get a job", baseline_checkpoint=base.checkpoint
        )
    fields: dict[str, Any] = {"baseline_job_id": base.job_id, "baseline_checkpoint": base.checkpoint}
    if base.status is None:
        return detail(Verdict.inconclusive, f"{where} job {base.job_id} was deleted", **fields)
    if base.status in (JobStatus.failed, JobStatus.cancelled):
        return detail(
            Verdict.inconclusive, f"{where} job {base.job_id} {base.status.value}: {base.error}", **fields
        )
    if base.status is not JobStatus.done:
        return detail(
            Verdict.pending, f"waiting for {where} job {base.job_id} ({base.status.value})", **fields
        )
    assert checkpoint.job_id is not None
    outcome = compare_jobs(db, baseline_job=base.job_id, candidate_job=checkpoint.job_id, rule=schedule.rule)
    return detail(
        outcome.verdict,
        outcome.reason,
        rule=schedule.rule,
        comparisons=outcome.comparisons,
        batch_sizes=tuple(outcome.batch_sizes),
        **fields,
    )


def _baseline_for(
    db: Database,
    schedule: ScheduleRecord,
    checkpoint: CheckpointRecord,
    *,
    states: Sequence[CheckpointRecord],
) -> _BaselineChoice:
    if schedule.baseline is BaselineKind.job:
        assert schedule.baseline_job_id is not None
        try:
            job = queue.get_job(db, schedule.baseline_job_id)
        except NotFoundError:
            return _BaselineChoice(job_id=schedule.baseline_job_id)
        return _BaselineChoice(job_id=job.id, status=job.status, error=job.error)
    # Checkpoints that ended in error have no curve: they are never a baseline.
    usable = [
        s
        for s in states
        if s.verdict is not Verdict.error and s.job_status not in (JobStatus.failed, JobStatus.cancelled)
    ]
    position = next(i for i, s in enumerate(usable) if s.id == checkpoint.id)
    if schedule.baseline is BaselineKind.first:
        chosen = usable[0]
    elif position == 0:
        chosen = checkpoint
    else:
        chosen = usable[position - 1]
    if chosen.id == checkpoint.id:
        return _BaselineChoice(itself=True)
    return _BaselineChoice(
        job_id=chosen.job_id, status=chosen.job_status, error=chosen.job_error, checkpoint=chosen.name
    )


def standing_regressions(db: Database, names: Sequence[str]) -> list[Regressed]:
    """For each named schedule whose newest checkpoint with a pass or regression verdict is a regression,
    that checkpoint."""
    found = []
    for name in names:
        compared = [
            c for c in list_checkpoints(db, name) if c.verdict in (Verdict.passed, Verdict.regression)
        ]
        if compared and compared[-1].verdict is Verdict.regression:
            found.append(Regressed(schedule=name, checkpoint=compared[-1].name, reason=compared[-1].reason))
    return found


# --- report ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportRow:
    """One checkpoint in a schedule report, at the report's batch size."""

    checkpoint: CheckpointRecord
    first_accuracy: float | None
    last_accuracy: float | None
    ratio: Interval | None
    """Last/first accuracy of the checkpoint's own job (cluster bootstrap)."""
    worst_drop: PositionDrop | None
    """From its verdict, at this batch size."""
    curve: Curve | None
    """The checkpoint's curve, when its job is done."""


@dataclass(frozen=True)
class ScheduleReport:
    """Every checkpoint of a schedule in order, at one batch size."""

    schedule: ScheduleRecord
    batch_size: int
    rows: list[ReportRow]


def schedule_report(db: Database, name: str, *, batch_size: int | None = None) -> ScheduleReport:
    """Every checkpoint in order with its verdict and summary metrics at `batch_size` (default: the
    template's largest)."""
    schedule = get_schedule(db, name)
    sizes = template_spec(schedule.template, model="checkpoint").batch_sizes
    if batch_size is None:
        batch_size = max(sizes)
    elif batch_size not in sizes:
        raise PosbiasError(
            f"schedule {name} runs batch sizes {list(sizes)}: pick one of them (got {batch_size})"
        )
    rows = []
    for checkpoint in list_checkpoints(db, name):
        curve = None
        if checkpoint.job_status is JobStatus.done and store.matching_jobs(
            db, job_id=checkpoint.job_id, batch_size=batch_size
        ):
            query = report.CurveQuery(job_id=checkpoint.job_id, batch_size=batch_size)
            curve = report.curves(db, query)[0]
        points = {p.position: p for p in curve.points} if curve else {}
        worst = None
        if checkpoint.detail is not None:
            worst = next(
                (v.worst_drop for v in checkpoint.detail.batch_sizes if v.batch_size == batch_size), None
            )
        rows.append(
            ReportRow(
                checkpoint=checkpoint,
                first_accuracy=points[1].accuracy if 1 in points else None,
                last_accuracy=points[batch_size].accuracy if batch_size in points else None,
                ratio=curve.first_last_ratio if curve else None,
                worst_drop=worst,
                curve=curve,
            )
        )
    return ScheduleReport(schedule=schedule, batch_size=batch_size, rows=rows)
