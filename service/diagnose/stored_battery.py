"""The battery submitted for a request, kept in the store (`batteries`, migration 0013), and how a fresh plan
of the same request differs from it: a diagnosis is read from the jobs it submitted, not from what the
planner of the day would submit."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from posbias.schemas import JobStatus, RotationCostWarning
from posbias.schemas.diagnosis import Battery, BatteryJob, BatteryRequest
from posbias.service.store import BatteryRow, Database, Job, now_utc


@dataclass(frozen=True)
class Kept:
    """A request's stored battery as read back. `battery` is None when it no longer validates in this
    posbias (`error` says why); its jobs' keys are read from the JSON all the same."""

    battery: Battery | None
    error: str | None
    keys: tuple[str, ...]
    posbias_version: str
    stored_at: datetime


@dataclass(frozen=True)
class KeyedJob:
    """A job already under one of a battery's keys."""

    job_id: int
    status: JobStatus
    spec_hash: str


def find(db: Database, request: BatteryRequest) -> Kept | None:
    """The battery stored for `request`, if any."""
    with db.read() as session:
        row = session.scalar(select(BatteryRow).where(BatteryRow.request_key == request.key))
        if row is None:
            return None
        data, stored_by, stored_at = row.battery, row.posbias_version, row.stored_at
    keys = tuple(str(job.get("key")) for job in data.get("jobs", ()) if isinstance(job, dict))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RotationCostWarning)  # shown at its first submit
            battery: Battery | None = Battery.model_validate(data)
        error = None
    except ValidationError as exc:
        battery, error = None, f"{exc.errors()[0]['msg']} at {'.'.join(map(str, exc.errors()[0]['loc']))}"
    return Kept(battery=battery, error=error, keys=keys, posbias_version=stored_by, stored_at=stored_at)


def store(db: Database, request: BatteryRequest, battery: Battery, *, replace: bool = False) -> Kept:
    """Store `battery` as the one submitted for `request` (`replace`: over the one stored before). Raises
    `IntegrityError` when another call stored one for it first (without `replace`): read that one."""
    now, by = now_utc(), _posbias_version()
    data = battery.model_dump(mode="json")
    with db.write() as session:
        row = (
            session.scalar(select(BatteryRow).where(BatteryRow.request_key == request.key))
            if replace
            else None
        )
        if row is None:
            session.add(
                BatteryRow(
                    request_key=request.key,
                    model=request.model,
                    engine=request.engine,
                    budget=request.budget,
                    seed=request.seed,
                    fake=request.fake,
                    battery=data,
                    posbias_version=by,
                    stored_at=now,
                )
            )
        else:
            row.battery, row.posbias_version, row.stored_at = data, by, now
    keys = tuple(job.key for job in battery.jobs)
    return Kept(battery=battery, error=None, keys=keys, posbias_version=by, stored_at=now)


def keyed_jobs(db: Database, keys: Iterable[str]) -> dict[str, KeyedJob]:
    """The jobs already under `keys`, by key."""
    with db.read() as session:
        rows = session.execute(
            select(Job.idempotency_key, Job.id, Job.status, Job.spec_hash).where(
                Job.idempotency_key.in_(list(keys))
            )
        )
        return {str(key): KeyedJob(job_id=i, status=status, spec_hash=h) for key, i, status, h in rows}


def rekeyed(battery: Battery, *, keep: Mapping[str, str]) -> Battery:
    """`battery` as `--replan` submits it: each job named in `keep` under the key given there, every other
    under a key that also names the plan's content (`diagnose/<digest>-<plan>/<job>`), so that no job an
    older plan of the same request submitted is taken for one of its, and planning the same afresh again
    finds the same jobs."""
    content = [[job_name(job), job.spec.spec_hash()] for job in battery.jobs]
    digest = f"{battery.digest}-{hashlib.sha256(json.dumps(content).encode()).hexdigest()[:6]}"
    jobs = tuple(
        job.model_copy(update={"key": keep.get(job_name(job)) or f"diagnose/{digest}/{job_name(job)}"})
        for job in battery.jobs
    )
    return battery.model_copy(update={"digest": digest, "jobs": jobs})


def job_name(job: BatteryJob) -> str:
    """The job's name in its battery: its key's last part (`behaviour`, `mechanism-gap`, ...)."""
    return job.key.rsplit("/", 1)[-1]


def plan_change(stored: Battery, fresh: Battery) -> str | None:
    """How `fresh` differs from `stored`, job by job, in words; None when every job's spec is the same."""
    old = {job_name(job): job for job in stored.jobs}
    new = {job_name(job): job for job in fresh.jobs}
    found: list[str] = []
    for name in [*old, *(n for n in new if n not in old)]:
        if name not in new:
            found.append(f"no {name} job")
        elif name not in old:
            found.append(f"a {name} job of {new[name].spec.total_trials:,} trials")
        elif old[name].spec.spec_hash() != new[name].spec.spec_hash():
            found.append(f"{name}: {_spec_change(old[name], new[name])}")
    return "; ".join(found) or None


def _spec_change(old: BatteryJob, new: BatteryJob) -> str:
    """The fields of a job's spec that differ: `iterations 20, not 16`, or the field's name alone."""
    a, b = old.spec.model_dump(mode="json"), new.spec.model_dump(mode="json")
    parts = [
        f"{field} {_short(b.get(field))}, not {_short(a.get(field))}"
        if _scalar(a.get(field)) and _scalar(b.get(field))
        else f"other {field}"
        for field in sorted(set(a) | set(b))
        if a.get(field) != b.get(field)
    ]
    return ", ".join(parts)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _short(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _posbias_version() -> str:
    try:
        return version("posbias")
    except PackageNotFoundError:
        return "unknown"
