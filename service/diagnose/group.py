"""A battery as a group of ordinary jobs: the model's facts it is planned from, what it costs, submitting it
(idempotently, each job under its key) and reading it back when every job is done; a request's battery is
the one stored at its first submit (`stored_battery`), a fresh plan only when none is (or `--replan`)."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from sqlalchemy.exc import IntegrityError

from posbias.schemas import ConflictError, FakeSpec, JobStatus, ModelInfo, PosbiasError, QuestionPool
from posbias.schemas.diagnosis import (
    Battery,
    BatteryCost,
    BatteryJob,
    BatteryJobState,
    BatteryRequest,
    DiagnoseOutcome,
)
from posbias.service.diagnose import stored_battery
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
    """Submit each job of `battery` that is not yet under its key; a job that is, is found as it is: a
    stored battery's jobs are never prepared again, by this posbias or a newer one."""
    found = stored_battery.keyed_jobs(db, (job.key for job in battery.jobs))
    states = []
    for job in battery.jobs:
        there = found.get(job.key)
        if there is not None:
            job_id, created, status = there.job_id, False, there.status
        else:
            prepared = submission.prepare(job.spec, settings=settings, pools=pools)
            done = jobs.submit(
                db,
                prepared.spec,
                prepared.plan,
                idempotency_key=job.key,
                endpoint=prepared.endpoint,
                context=prepared.engine_context,
            )
            job_id, created, status = done.job_id, done.created, jobs.get(db, done.job_id).status
        states.append(
            BatteryJobState(line=job.line, key=job.key, job_id=job_id, created=created, status=status.value)
        )
    return tuple(states)


def plan(
    db: Database | None,
    request: BatteryRequest,
    *,
    settings: Settings,
    pools: dict[str, QuestionPool] | None = None,
) -> Battery:
    """A fresh plan of `request`, from the model's facts as they are now (`fitted_battery`)."""
    fake = None if request.fake is None else FakeSpec.model_validate(request.fake)
    facts = model_facts(db, request.model, engine=request.engine, fake=fake, settings=settings)
    return fitted_battery(
        facts,
        settings=settings,
        engine=request.engine,
        budget=request.budget,
        fake=fake,
        seed=request.seed,
        pools=pools,
    )


def diagnose(
    db: Database | None,
    request: BatteryRequest,
    *,
    settings: Settings,
    dry_run: bool = False,
    replan: bool = False,
) -> DiagnoseOutcome:
    """What `request` asks for. The battery stored for it when there is one (its jobs by their keys, their
    specs as submitted), saying how a fresh plan would differ; else, or with `replan`, a fresh plan, stored
    before its first job is submitted (`replan`: in place of the stored one, under keys of its own, when it
    differs from it). `dry_run`: the battery and its costs, nothing submitted or stored. When every job is
    done, the verdicts."""
    pools: dict[str, QuestionPool] = {}  # the questions, read once for every job's prepare
    kept = None if db is None else stored_battery.find(db, request)
    if db is None or kept is None or replan:
        fresh = plan(db, request, settings=settings, pools=pools)
        if kept is None or kept.battery is None or stored_battery.plan_change(kept.battery, fresh):
            return _fresh(
                db, request, fresh, kept=kept, replan=replan, settings=settings, dry_run=dry_run, pools=pools
            )
        change = None  # --replan, and a fresh plan is the stored battery: read it
    elif kept.battery is None:
        raise PosbiasError(
            f"the battery stored for this command at {kept.stored_at:%Y-%m-%d %H:%M} UTC by posbias "
            f"{kept.posbias_version} does not read in this posbias ({kept.error}): add --replan to plan it "
            "afresh"
        )
    else:
        change = _fresh_change(db, request, kept.battery, settings=settings, pools=pools)
    outcome = DiagnoseOutcome(
        battery=kept.battery,
        battery_read=True,
        battery_stored_at=kept.stored_at,
        battery_stored_by=kept.posbias_version,
        plan_change=change,
    )
    return _run(db, outcome, settings=settings, dry_run=dry_run, pools=pools)


def _fresh(
    db: Database | None,
    request: BatteryRequest,
    battery: Battery,
    *,
    kept: stored_battery.Kept | None,
    replan: bool,
    settings: Settings,
    dry_run: bool,
    pools: dict[str, QuestionPool],
) -> DiagnoseOutcome:
    """A fresh plan: costed (`dry_run`), or stored and submitted."""
    replaced: dict[str, object] = {}
    if replan:
        battery = _replanned(db, battery, kept=kept, settings=settings, pools=pools)
        if kept is not None and db is not None:
            left = [key for key in kept.keys if key not in {job.key for job in battery.jobs}]
            found = stored_battery.keyed_jobs(db, left)
            replaced = {
                "replaced_stored_at": kept.stored_at,
                "replaced_job_ids": tuple(found[key].job_id for key in left if key in found),
            }
    outcome = DiagnoseOutcome.model_validate({"battery": battery, **replaced})
    if dry_run or db is None:
        return _run(db, outcome, settings=settings, dry_run=True, pools=pools)
    clashes = [] if replan else _taken(db, battery.jobs, settings=settings, pools=pools)
    for job, there in clashes[:1]:  # --replan's keys are its own
        raise ConflictError(
            f"job {there.job_id} holds key {job.key} with another spec: an older posbias planned this "
            "command differently; add --replan to plan it afresh under keys of its own"
        )
    try:
        now = stored_battery.store(db, request, battery, replace=kept is not None)
    except IntegrityError:
        # Another call stored this request's battery first: read that one.
        other = stored_battery.find(db, request)
        if other is None or other.battery is None:
            raise
        now, outcome = other, DiagnoseOutcome(battery=other.battery, battery_read=True)
    stored = {"battery_stored_at": now.stored_at, "battery_stored_by": now.posbias_version}
    return _run(db, outcome.model_copy(update=stored), settings=settings, dry_run=False, pools=pools)


def _fresh_change(
    db: Database,
    request: BatteryRequest,
    stored: Battery,
    *,
    settings: Settings,
    pools: dict[str, QuestionPool],
) -> str | None:
    """How a fresh plan of `request` would differ from the `stored` battery, as a sentence; None if not."""
    try:
        fresh = plan(db, request, settings=settings, pools=pools)
    except PosbiasError as exc:
        return f"a fresh plan of this command is refused ({exc})"
    change = stored_battery.plan_change(stored, fresh)
    if change is None:
        return None
    return f"a fresh plan would differ ({change}): add --replan to submit it under keys of its own"


def _replanned(
    db: Database | None,
    battery: Battery,
    *,
    kept: stored_battery.Kept | None,
    settings: Settings,
    pools: dict[str, QuestionPool],
) -> Battery:
    """`--replan`'s keys: a job whose spec the stored battery's job of the same name has keeps that job's
    key (it is the same job, and is not run again); any other keeps its own key where no job of another
    spec holds it, and takes one that names the plan's content where one does (or it replaces a job)."""
    stored = () if kept is None or kept.battery is None else kept.battery.jobs
    old = {stored_battery.job_name(job): job for job in stored}
    keep: dict[str, str] = {}
    new: list[BatteryJob] = []
    for job in battery.jobs:
        before = old.get(stored_battery.job_name(job))
        if before is not None and before.spec.spec_hash() == job.spec.spec_hash():
            keep[stored_battery.job_name(job)] = before.key
        elif before is None:
            new.append(job)
    taken = set() if db is None else {job.key for job, _ in _taken(db, new, settings=settings, pools=pools)}
    keep.update((stored_battery.job_name(job), job.key) for job in new if job.key not in taken)
    return stored_battery.rekeyed(battery, keep=keep)


def _taken(
    db: Database, planned: Sequence[BatteryJob], *, settings: Settings, pools: dict[str, QuestionPool]
) -> list[tuple[BatteryJob, stored_battery.KeyedJob]]:
    """The `planned` jobs whose keys name a job of another spec: an older posbias planned the same command
    differently before batteries were stored (migration 0013)."""
    found = stored_battery.keyed_jobs(db, (job.key for job in planned))
    taken = []
    for job in planned:
        there = found.get(job.key)
        if there is None:
            continue
        prepared = submission.prepare(job.spec, settings=settings, check_cost=False, pools=pools)
        if prepared.spec.spec_hash() != there.spec_hash:
            taken.append((job, there))
    return taken


def _run(
    db: Database | None,
    outcome: DiagnoseOutcome,
    *,
    settings: Settings,
    dry_run: bool,
    pools: dict[str, QuestionPool],
) -> DiagnoseOutcome:
    """Cost the outcome's battery (`dry_run`), or submit what of it is not submitted and, when every job is
    done, read the verdicts."""
    battery = outcome.battery
    if dry_run or db is None:
        return outcome.model_copy(update={"costs": costs(battery, db=db, settings=settings, pools=pools)})
    states = submit(db, battery, settings=settings, pools=pools)
    if any(s.status != JobStatus.done.value for s in states):
        return outcome.model_copy(update={"jobs": states})
    diagnosis = read_diagnosis(db, battery, {s.key: s.job_id for s in states})
    return outcome.model_copy(update={"jobs": states, "diagnosis": diagnosis})
