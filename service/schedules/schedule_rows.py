"""Regression schedules as stored: adding, listing, pausing and removing them, their checkpoints as recorded,
and the job spec each checkpoint gets (the schedule's template with the checkpoint filled in).

`service.schedules.scheduler` runs the tick over these; `service.schedules.checkpoints` finds new checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from posbias.schemas import (
    ConflictError,
    JobSpec,
    JobStatus,
    NotFoundError,
    PosbiasError,
    UsageError,
    one_line,
)
from posbias.schemas.bounds import check_shape
from posbias.schemas.ids import looks_like_id, parse_id
from posbias.schemas.schedule import (
    Announcement,
    BaselineKind,
    HubRevisions,
    RegressionRule,
    ScheduleSource,
    Verdict,
    VerdictDetail,
)
from posbias.schemas.spec_file import read_spec_file
from posbias.service.schedules.checkpoints import (
    FolderSource,
    HubSource,
    Source,
    order_key,
)
from posbias.service.settings import Settings
from posbias.service.store import Checkpoint, Database, Job, Schedule, now_utc
from posbias.service.work import check_pool, jobs, load_questions
from posbias.workers.engines import declared

SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HUB_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
FAKE_HOOK = "posbias-fake.json"
"""Test and demo hook of the fake engine: a checkpoint folder may carry this file, whose `fake` block and
`seed` replace the template's, so that one fake "checkpoint" can behave worse than another. Only read when
the template's engine reads the `fake` block (its declaration's `reads_fake`); a real engine never sees it."""
FAKE_HOOK_KEYS = frozenset({"fake", "seed"})
MAX_KEY_LENGTH = 200  # jobs.idempotency_key


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


class ScheduleSpecError(UsageError):
    """A schedule's spec template, or its baseline, that cannot be used as given: the caller must change
    it (the command's usage error)."""


def checked_template(spec: str | Path | Mapping[str, Any], *, baseline: str) -> dict[str, Any]:
    """The template a schedule is added with, checked before any store is opened: `spec` read as
    `load_template` reads it (a mapping is taken as it is, less `model` and `revision`), made into a job
    spec, and `baseline` parsed. `ScheduleSpecError` naming the fix otherwise."""
    try:
        if isinstance(spec, Mapping):
            template = {key: value for key, value in spec.items() if key not in {"model", "revision"}}
        else:
            template = load_template(str(spec))
        template_spec(template)
        parse_baseline(baseline)
    except PosbiasError as exc:
        raise ScheduleSpecError(str(exc)) from exc
    return template


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
        except (ValueError, RecursionError) as exc:
            raise PosbiasError(
                f"the inline spec template cannot be read: {one_line(exc, typed=True)}"
            ) from None
        where = "the inline spec template"
        problem = check_shape(data)
        if problem:
            raise PosbiasError(f"{where}: {problem}")
    else:
        file = Path(stripped).expanduser()
        data = read_spec_file(file, what="spec template")
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
    if looks_like_id(value):
        return BaselineKind.job, parse_id(value, what="baseline job id")
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
    check_pool(
        spec,
        pool=load_questions(spec.dataset, mmlu_dir=settings.mmlu_dir, datasets_dir=settings.datasets_dir),
    )
    if rule.max_shift is not None and max(spec.batch_sizes) < 2:
        raise PosbiasError(
            "--max-shift compares last-minus-first contrasts: the template needs a batch size above 1"
        )
    kind, baseline_job = parse_baseline(baseline)
    if baseline_job is not None:
        job = jobs.get(db, baseline_job)  # NotFoundError names the fix
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
        return checkpoint_records(session, schedule.id)


def checkpoint_records(session: Session, schedule_id: int) -> list[CheckpointRecord]:
    """A schedule's checkpoints in order (step, then name), read in the caller's session."""
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
    if not declared(spec.engine.name).reads_fake or not isinstance(schedule.source, FolderSource):
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
