"""A diagnosis is read from the battery it submitted, not from a fresh plan (issue 41): the Gemma 3 270M
diagnosis of 2026-12-05 was submitted with `--budget 224`, and the next day's planner refused 224, so the
same command could no longer read it. Here the planner changes under a submitted battery (its least budget,
a variant's name), and the same call still reads the stored battery and its jobs; `replan` plans afresh; a
store at schema 0012 upgrades, and a battery submitted before the table existed is found by planning it
again. The fake engine answers every shard in this process, at the least budget the plan takes (160)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import posbias
from posbias.schemas import ConflictError, PosbiasError, WorkerConfig
from posbias.schemas.diagnosis import DiagnoseOutcome
from posbias.service.diagnose import battery as planner
from posbias.service.settings import Settings
from posbias.service.store import database, migrate
from posbias.service.work import jobs, queue
from posbias.workers.engines import fake as fake_engine
from posbias.workers.shard import run_shard

FAKE = {"window": 1000, "mechanism": {"window_step": 0.3}}
BUDGET = 160
"""The least budget of this fake's plan: 16 sampled sets a filler length for the behaviour job and each of
the intervention's four variants."""


@pytest.fixture
def settings(database_url: str, tmp_path: Path, mmlu_dir: Path) -> Settings:
    return Settings(database_url=database_url, mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")


def _diagnose(settings: Settings, **options: bool) -> DiagnoseOutcome:
    """`posbias diagnose fake/window --engine fake --fake FAKE --budget 160 [options]`."""
    return posbias.diagnose(
        "fake/window", settings=settings, engine="fake", fake=FAKE, budget=BUDGET, **options
    )


def _work(settings: Settings) -> None:
    """Every queued shard answered by the fake engine in this process, as `posbias worker` would."""
    with database.connect(settings.database_url) as db:
        for lease in queue.lease(db, owner="test", limit=10_000, lease_seconds=600):
            engine = fake_engine.load(lease.shard, WorkerConfig(cache_dir=str(settings.cache_dir)))
            assert queue.complete(db, [run_shard(lease.shard, engine=engine)], owner="test")[0].written


def _ids(outcome: DiagnoseOutcome) -> list[int]:
    return [job.job_id for job in outcome.jobs]


def test_a_stored_battery_is_read_when_a_newer_planner_refuses_its_budget(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _diagnose(settings)
    assert all(job.created for job in first.jobs) and first.battery_stored_at is not None
    assert not first.battery_read
    # A newer planner: 20 sampled sets a job at least, so the least budget is 200 and 160 is refused.
    monkeypatch.setattr(planner, "MIN_CLUSTERS", 20)
    with pytest.raises(PosbiasError, match="give --budget 200 or more"):
        _diagnose(settings, replan=True)

    dry = _diagnose(settings, dry_run=True)
    assert dry.battery_read and dry.battery == first.battery and not dry.jobs
    assert [cost.key for cost in dry.costs] == [job.key for job in first.battery.jobs]
    assert dry.plan_change is not None and "refused" in dry.plan_change and "--budget 200" in dry.plan_change

    _work(settings)
    done = _diagnose(settings)
    assert done.battery_read and done.battery_stored_at == first.battery_stored_at
    assert _ids(done) == _ids(first) and not any(job.created for job in done.jobs)
    assert done.diagnosis is not None and done.diagnosis.job_ids == tuple(_ids(first))
    window = next(v for v in done.diagnosis.suspects if v.suspect.value == "sliding window")
    assert window.call.value == "implicated", window


def test_a_battery_killed_between_its_jobs_is_completed_from_the_stored_plan(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit = jobs.submit
    calls: list[str | None] = []

    def killed_after_one(*args: object, **kwargs: object) -> object:
        calls.append(str(kwargs.get("idempotency_key")))
        if len(calls) > 1:
            raise KeyboardInterrupt  # the process dies between the battery's jobs
        return submit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jobs, "submit", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        _diagnose(settings)
    monkeypatch.setattr(jobs, "submit", submit)
    monkeypatch.setattr(planner, "MIN_CLUSTERS", 20)  # and the planner changes before the next call

    again = _diagnose(settings)
    assert again.battery_read
    assert [job.key for job in again.jobs] == calls
    assert [job.created for job in again.jobs] == [False, True]


def test_replan_plans_afresh_under_keys_of_its_own(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _diagnose(settings)
    monkeypatch.setattr(planner, "ROPE_FACTOR", 2)  # a newer planner's RoPE variant: rope-base:x2
    again = _diagnose(settings)
    assert again.battery == first.battery and _ids(again) == _ids(first)
    assert again.plan_change is not None
    assert "intervention: other variants" in again.plan_change and "--replan" in again.plan_change

    dry = _diagnose(settings, replan=True, dry_run=True)
    behaviour, intervention = dry.battery.jobs
    assert behaviour.key == first.battery.jobs[0].key, "a job the plans share is the same job"
    assert intervention.key not in {job.key for job in first.battery.jobs}
    assert "rope-base:x2" in intervention.spec.names
    assert dry.replaced_job_ids == (first.jobs[1].job_id,)
    assert dry.replaced_stored_at == first.battery_stored_at
    assert _diagnose(settings, dry_run=True).battery == first.battery, "a dry run stores nothing"

    replanned = _diagnose(settings, replan=True)
    assert replanned.battery == dry.battery
    assert (replanned.jobs[0].job_id, replanned.jobs[0].created) == (first.jobs[0].job_id, False)
    assert replanned.jobs[1].created and replanned.jobs[1].job_id not in _ids(first)
    after = _diagnose(settings)
    assert after.battery_read and after.battery == replanned.battery and after.plan_change is None
    assert _ids(after) == _ids(replanned)
    with database.connect(settings.database_url) as db:  # the replaced job is an ordinary job still
        assert jobs.get(db, first.jobs[1].job_id).status.value == "queued"


def test_a_store_at_0012_upgrades_and_finds_a_battery_submitted_before_the_table(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = settings.database_url
    first = _diagnose(settings)  # submitted; then the store goes back to before batteries were kept
    migrate.downgrade(url, "0012")
    engine = database.create_db_engine(url, create=False)
    try:
        assert "batteries" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    migrate.upgrade(url)

    found = _diagnose(settings)  # nothing stored: planned again, as before, and its jobs found by key
    assert not found.battery_read and found.battery == first.battery
    assert _ids(found) == _ids(first) and not any(job.created for job in found.jobs)
    assert _diagnose(settings, dry_run=True).battery_read, "stored at that call"

    # A plan that differs from the jobs under its keys is refused, not read as theirs, with the way out.
    migrate.downgrade(url, "0012")
    migrate.upgrade(url)
    monkeypatch.setattr(planner, "ROPE_FACTOR", 2)
    with pytest.raises(ConflictError, match="--replan"):
        _diagnose(settings)
    replanned = _diagnose(settings, replan=True)
    assert replanned.jobs[0].job_id == first.jobs[0].job_id and replanned.jobs[1].created
