"""A battery as a group of ordinary jobs: the model's facts it is planned from, what it costs, submitting it
(idempotently, each job under its key) and reading it back when every job is done."""

from __future__ import annotations

from statistics import median

from posbias.schemas import FakeSpec, JobStatus, ModelInfo, PosbiasError
from posbias.schemas.diagnosis import Battery, BatteryCost, BatteryJobState, DiagnoseOutcome
from posbias.service.diagnose.suspects import read_diagnosis
from posbias.service.settings import Settings
from posbias.service.stats import queries
from posbias.service.store import Database
from posbias.service.work import jobs, submission
from posbias.workers import engines


def model_facts(
    db: Database | None, model: str, *, engine: str, fake: FakeSpec | None, settings: Settings
) -> ModelInfo:
    """The config facts of `model`: the fake's own; else its `models` row as built (the store's newest run
    as published), else its config on this machine, read as submit's dry run reads it. `PosbiasError` when
    none is here."""
    if engines.declared(str(engine)).reads_fake:
        from posbias.workers.fake_engine import fake_model_info

        return fake_model_info(fake or FakeSpec(), model=model)
    if db is not None:
        rows = [m for m in queries.list_models(db) if m.name == model and not m.hf_overrides]
        if rows:
            return rows[0]
    from posbias.workers.models import local_model_info

    found = local_model_info(model, cache_dir=settings.cache_dir)
    if found is None:
        raise PosbiasError(
            f"{model}'s config is not on this machine and the store has no run of it: download it "
            f"(huggingface-cli download {model} config.json) or give a local folder"
        )
    return found


def costs(battery: Battery, *, db: Database | None, settings: Settings) -> tuple[BatteryCost, ...]:
    """Each job's trials and prompt tokens (submit's dry run), and GPU time at the store's past rate of
    this model and engine (seconds per prompt token over its done jobs), when it has one."""
    found = []
    for job in battery.jobs:
        prepared = submission.prepare(job.spec, settings=settings, check_cost=False)
        dry = submission.dry_run(prepared, settings=settings)
        tokens = dry.total_prompt_tokens
        rate, source = _past_rate(db, job.spec.model, engine=str(job.spec.engine.name))
        found.append(
            BatteryCost(
                key=job.key,
                trials=job.spec.total_trials,
                prompt_tokens=tokens,
                gpu_seconds=None if rate is None else rate * job.spec.total_trials,
                rate_source=source,
            )
        )
    return tuple(found)


def _past_rate(db: Database | None, model: str, *, engine: str) -> tuple[float | None, str]:
    """Median seconds per trial over the store's done jobs of `model` on `engine` (wall time from first
    lease to done: an upper bound on the GPU's time)."""
    if db is None:
        return None, "none: no store to read past rates from"
    rates = [
        (r.finished_at - r.started_at).total_seconds() / r.trials_total
        for r in jobs.find(db, status=JobStatus.done, model=model)
        if r.started_at is not None
        and r.finished_at is not None
        and r.trials_total
        and str(r.spec.engine.name) == engine
    ]
    if not rates:
        return None, f"none: the store has no done job of {model} on {engine}"
    return median(rates), f"the median of {len(rates)} done job{'s' if len(rates) > 1 else ''} here"


def submit(db: Database, battery: Battery, *, settings: Settings) -> tuple[BatteryJobState, ...]:
    """Submit every job of `battery` under its key: a job already submitted is found, not doubled."""
    states = []
    for job in battery.jobs:
        prepared = submission.prepare(job.spec, settings=settings)
        done = jobs.submit(
            db,
            prepared.spec,
            prepared.plan,
            idempotency_key=job.key,
            endpoint=prepared.endpoint,
            context=prepared.engine_context,
        )
        record = jobs.get(db, done.job_id)
        states.append(
            BatteryJobState(
                line=job.line,
                key=job.key,
                job_id=done.job_id,
                created=done.created,
                status=record.status.value,
            )
        )
    return tuple(states)


def diagnose(db: Database, battery: Battery, *, settings: Settings, dry_run: bool = False) -> DiagnoseOutcome:
    """Plan only (`dry_run`: with costs), or submit the battery and, when every job is done, read it."""
    if dry_run:
        return DiagnoseOutcome(battery=battery, costs=costs(battery, db=db, settings=settings))
    states = submit(db, battery, settings=settings)
    if any(s.status != JobStatus.done.value for s in states):
        return DiagnoseOutcome(battery=battery, jobs=states)
    diagnosis = read_diagnosis(db, battery, {s.key: s.job_id for s in states})
    return DiagnoseOutcome(battery=battery, jobs=states, diagnosis=diagnosis)
