"""A battery as a group of ordinary jobs: the model's facts it is planned from, what it costs, submitting it
(idempotently, each job under its key) and reading it back when every job is done."""

from __future__ import annotations

from statistics import median

from posbias.schemas import FakeSpec, JobStatus, ModelInfo, PosbiasError, QuestionPool
from posbias.schemas.diagnosis import Battery, BatteryCost, BatteryJobState, DiagnoseOutcome
from posbias.service.diagnose.battery import BATCH_SIZE, MIN_BATCH_SIZE, plan_battery
from posbias.service.diagnose.suspects import read_diagnosis
from posbias.service.settings import Settings
from posbias.service.stats import queries
from posbias.service.store import Database
from posbias.service.work import ContextError, jobs, submission
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


def fitted_battery(
    facts: ModelInfo,
    *,
    settings: Settings,
    engine: str,
    budget: int,
    fake: FakeSpec | None = None,
    seed: int = 0,
    pools: dict[str, QuestionPool] | None = None,
) -> Battery:
    """`plan_battery` at the largest batch size, from `BATCH_SIZE` down to `MIN_BATCH_SIZE`, whose longest
    prompt (with the plan's longest filler) and its answers fit the model's context, for an engine that
    sizes its context to the prompts; the same facts give the same batch size, so the same jobs' keys. A
    tiny model's 4,096 tokens hold 8 MMLU questions in its 855-token vocabulary, not 10. `pools` keeps the
    questions read for the caller's next steps (reading MMLU is half of a prepare)."""

    def planned(size: int) -> Battery:
        return plan_battery(facts, engine=engine, budget=budget, fake=fake, seed=seed, batch_size=size)

    if not engines.declared(str(engine)).chooses_context:
        return planned(BATCH_SIZE)
    for size in range(BATCH_SIZE, MIN_BATCH_SIZE, -1):
        battery = planned(size)
        if _fits(battery, settings=settings, pools=pools):
            return battery
    battery = planned(MIN_BATCH_SIZE)
    try:
        _fits(battery, settings=settings, pools=pools, last=True)
    except ContextError as exc:
        raise PosbiasError(
            f"{facts.name}'s context holds fewer than {MIN_BATCH_SIZE} questions of a diagnosis with its "
            f"filler ({exc}); diagnose a model with a longer context"
        ) from None
    return battery


def _fits(
    battery: Battery, *, settings: Settings, pools: dict[str, QuestionPool] | None, last: bool = False
) -> bool:
    """Whether the prompts of each job whose engine sizes its context fit the model's (`last`: raise
    `ContextError` where not). Each job has trials of its own seed, so each is measured."""
    for job in battery.jobs:
        if not engines.declared(str(job.spec.engine.name)).chooses_context:
            continue
        try:
            submission.prepare(job.spec, settings=settings, check_cost=False, pools=pools)
        except ContextError:
            if last:
                raise
            return False
    return True


def costs(
    battery: Battery,
    *,
    db: Database | None,
    settings: Settings,
    pools: dict[str, QuestionPool] | None = None,
) -> tuple[BatteryCost, ...]:
    """Each job's trials and prompt tokens (submit's dry run), and GPU time at the store's past rate of
    this model and engine (seconds per prompt token over its done jobs), when it has one."""
    found = []
    for job in battery.jobs:
        prepared = submission.prepare(job.spec, settings=settings, check_cost=False, pools=pools)
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


def submit(
    db: Database, battery: Battery, *, settings: Settings, pools: dict[str, QuestionPool] | None = None
) -> tuple[BatteryJobState, ...]:
    """Submit every job of `battery` under its key: a job already submitted is found, not doubled."""
    states = []
    for job in battery.jobs:
        prepared = submission.prepare(job.spec, settings=settings, pools=pools)
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


def diagnose(
    db: Database,
    battery: Battery,
    *,
    settings: Settings,
    dry_run: bool = False,
    pools: dict[str, QuestionPool] | None = None,
) -> DiagnoseOutcome:
    """Plan only (`dry_run`: with costs), or submit the battery and, when every job is done, read it."""
    if dry_run:
        return DiagnoseOutcome(battery=battery, costs=costs(battery, db=db, settings=settings, pools=pools))
    states = submit(db, battery, settings=settings, pools=pools)
    if any(s.status != JobStatus.done.value for s in states):
        return DiagnoseOutcome(battery=battery, jobs=states)
    diagnosis = read_diagnosis(db, battery, {s.key: s.job_id for s in states})
    return DiagnoseOutcome(battery=battery, jobs=states, diagnosis=diagnosis)
