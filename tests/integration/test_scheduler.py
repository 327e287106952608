"""Regression schedules on a real store (SQLite and PostgreSQL): checkpoints written into a folder over time
are picked up once and only when complete, get one job each (also when ticks race), and are judged against
their baseline by the rule; verdicts reach a real local webhook once.

Jobs run either on the real dispatcher with a local Ray (the headline test and the load failure) or, where
only the order in which jobs finish matters, in this process through the worker's own `run_shard` with the
fake engine (no Ray).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select
from support.job_runs import answer_every_shard, dispatch

from posbias.schemas import ConflictError, NotFoundError, PosbiasError
from posbias.schemas.schedule import RegressionRule, Verdict
from posbias.service.reports import schedule_report
from posbias.service.schedules import schedule_rows, scheduler
from posbias.service.schedules.checkpoints import FolderSource, HubSource, incomplete_reason, scan_folder
from posbias.service.schedules.verdicts import MIN_ANSWERS
from posbias.service.schedules.webhook import MAX_ANNOUNCE_ATTEMPTS
from posbias.service.settings import Settings
from posbias.service.store import database
from posbias.service.store.database import Database
from posbias.service.store.tables import Announcement, Checkpoint, HubRevisions, Job, JobStatus, Shard, Trial
from posbias.service.work import jobs
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard

# The fake engine's accuracy rises linearly from `first` (position 1) to `last` (position N).
BASE = {"first": 0.3, "last": 0.8}
TEMPLATE: dict[str, Any] = {"engine": {"name": "fake"}, "fake": BASE, "batch_sizes": [10], "iterations": 300}
SMALL = {"engine": {"name": "fake"}, "fake": BASE, "batch_sizes": [2], "iterations": 30}
RULE = RegressionRule(max_drop=5, max_shift=10)


@pytest.fixture
def settings(db: Database, fast_settings: Callable[..., Settings], mmlu_dir: Path) -> Settings:
    """Settings on the test's store, with the MMLU copy and no webhook."""
    return fast_settings(db.url, mmlu_dir=mmlu_dir)


def write_checkpoint(
    folder: Path, name: str, *, config: bool = True, weights: bool = True, hook: dict[str, Any] | None = None
) -> Path:
    """A tiny checkpoint as a trainer leaves it: config.json and a weights file (nothing loads them with the
    fake engine), and optionally the fake engine's per-checkpoint `posbias-fake.json`."""
    path = folder / name
    path.mkdir(parents=True, exist_ok=True)
    if hook is not None:
        (path / schedule_rows.FAKE_HOOK).write_text(json.dumps(hook))
    if config:
        (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    if weights:
        (path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return path


def add(
    db: Database,
    settings: Settings,
    folder: Path,
    *,
    name: str = "nightly",
    template: dict[str, Any] | None = None,
    baseline: str = "first",
    rule: RegressionRule = RULE,
) -> schedule_rows.ScheduleRecord:
    return schedule_rows.add_schedule(
        db,
        name,
        source=FolderSource(path=folder),
        template=template or TEMPLATE,
        baseline=baseline,
        rule=rule,
        settings=settings,
    )


def by_name(db: Database, name: str = "nightly") -> dict[str, schedule_rows.CheckpointRecord]:
    return {c.name: c for c in schedule_rows.list_checkpoints(db, name)}


def run_inline(db: Database, job_id: int) -> None:
    """Run a job in this process as a worker would (lease, `run_shard` on the fake engine, write)."""
    spec = jobs.get(db, job_id).spec
    engine = FakeEngine(spec.fake, seed=spec.seed, model=spec.model)
    answer_every_shard(db, job_id, run_shard, engine=engine)
    assert jobs.get(db, job_id).status is JobStatus.done


def count_jobs(db: Database) -> int:
    with db.read() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


# --- the headline: a folder over time, the dispatcher, verdicts by the rule ----------------------------


@pytest.mark.usefixtures("ray_session")
def test_checkpoints_are_picked_up_once_complete_run_and_judged_by_the_rule(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    """Why the numbers make the verdicts more than luck: 300 trials at N = 10 give n = 300 answers per
    position; the drop check looks at the 10 positions and 16 blocks of them (widths 2, 5 and 10 at every
    start) with one-sided bounds simultaneous at 1 - 0.05/3 (three checks: drop, shift, parse), a critical
    value of about 3.

    - `checkpoint-300` (same seed: matched trials, compared paired) answers position 1 right 10% of the time
      instead of 30%, the drop tapering to none at position 10: at position 1 alone a 20-point drop with a
      standard error under 3.7 points, so it is flagged unless the observed drop falls short of its mean by
      more than 2.4 standard errors (probability under 1%); the blocks from position 1 fit it better. Its
      last-minus-first contrast grows from 50 to 70 points, beyond the 10-point shift limit.
    - `checkpoint-200` behaves exactly like the baseline with another seed (other questions, other draws,
      compared unpaired): it is flagged with probability at most 5% in all. Both engines are
      deterministic, so the outcome for these seeds is fixed, not flaky.
    """
    folder = tmp_path / "run"
    write_checkpoint(folder, "checkpoint-100")
    write_checkpoint(
        folder, "checkpoint-200", weights=False, hook={"seed": 7}
    )  # config written, weights not yet
    write_checkpoint(folder, "checkpoint-300", hook={"fake": {"first": 0.1}})
    (folder / "checkpoint-300" / "model.safetensors.incomplete").touch()  # still being copied
    write_checkpoint(folder, "checkpoint-400.tmp")  # a trainer's temporary name, renamed when done
    add(db, settings, folder)

    first = scheduler.tick(db, settings=settings).schedules[0]
    assert first.discovered == ["checkpoint-100"]
    waiting = {w.name: w.reason for w in first.waiting}
    assert set(waiting) == {"checkpoint-200", "checkpoint-300", "checkpoint-400.tmp"}
    assert "no weights" in waiting["checkpoint-200"] and "still being written" in waiting["checkpoint-300"]
    assert [s.checkpoint for s in first.submitted] == ["checkpoint-100"]

    write_checkpoint(folder, "checkpoint-200", hook={"seed": 7})
    (folder / "checkpoint-300" / "model.safetensors.incomplete").unlink()
    second = scheduler.tick(db, settings=settings).schedules[0]
    assert second.discovered == ["checkpoint-200", "checkpoint-300"]
    assert [s.checkpoint for s in second.submitted] == ["checkpoint-200", "checkpoint-300"]

    again = scheduler.tick(db, settings=settings).schedules[0]
    assert again.discovered == [] and again.submitted == [] and again.settled == []
    assert count_jobs(db) == 3

    checkpoints = by_name(db)
    got = {name: jobs.get(db, c.job_id) for name, c in checkpoints.items() if c.job_id is not None}
    assert got["checkpoint-200"].spec.seed == 7 and got["checkpoint-200"].spec.fake.first == 0.3
    assert got["checkpoint-300"].spec.fake.first == 0.1 and got["checkpoint-300"].spec.seed == 0
    assert got["checkpoint-100"].model == str((folder / "checkpoint-100").resolve())
    assert {c.verdict for c in checkpoints.values()} == {Verdict.pending}

    dispatch(db, settings)
    judged = scheduler.tick(db, settings=settings)
    settled = {s.checkpoint: s.verdict for s in judged.schedules[0].settled}
    assert settled == {
        "checkpoint-100": Verdict.baseline,
        "checkpoint-200": Verdict.passed,
        "checkpoint-300": Verdict.regression,
    }
    checkpoints = by_name(db)
    worse = checkpoints["checkpoint-300"].detail
    assert worse is not None and worse.baseline_checkpoint == "checkpoint-100"
    assert worse.baseline_job_id == checkpoints["checkpoint-100"].job_id
    (n10,) = worse.batch_sizes
    assert (n10.method, n10.matched_trials) == ("paired", 300)
    # The drop tapers from 20 points at position 1 to none at 10: the reason cites the block from position 1
    # that best fits it, not the one position that dropped most.
    assert n10.drop_flagged and n10.worst_drop is not None and n10.worst_drop.first_position == 1
    assert n10.worst_drop.last_position < 10
    assert n10.worst_drop.diff < -0.05 and n10.worst_drop.upper < 0
    assert n10.shift is not None and n10.shift.flagged and n10.shift.change.low is not None
    assert n10.shift.change.low > 0
    assert f"N=10 {n10.worst_drop.where}: accuracy" in worse.reason
    same = checkpoints["checkpoint-200"].detail
    assert same is not None and same.comparisons == 3
    (n10,) = same.batch_sizes
    assert n10.method == "unpaired"
    assert not n10.drop_flagged and n10.shift is not None and not n10.shift.flagged and not n10.parse_flagged
    assert "the data allow a drop of at most" in same.reason
    assert [r.checkpoint for r in judged.regressions] == ["checkpoint-300"]

    # Verdicts are final: later ticks change nothing and report the same standing regression.
    later = scheduler.tick(db, settings=settings)
    assert later.schedules[0].settled == []
    assert [r.checkpoint for r in later.regressions] == ["checkpoint-300"]

    report = schedule_report.schedule_report(db, "nightly")
    assert [row.checkpoint.name for row in report.rows] == [
        "checkpoint-100",
        "checkpoint-200",
        "checkpoint-300",
    ]
    assert report.batch_size == 10 and all(row.curve is not None for row in report.rows)
    worse_row = report.rows[2]
    assert worse_row.first_accuracy is not None and worse_row.first_accuracy < 0.2
    assert worse_row.contrast is not None and worse_row.contrast.estimate is not None
    assert worse_row.contrast.estimate > 0.6


@pytest.mark.usefixtures("ray_session")
def test_a_checkpoint_that_cannot_be_loaded_gets_verdict_error_and_the_schedule_carries_on(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    folder = tmp_path / "run"
    broken = write_checkpoint(folder, "step-1")
    add(db, settings, folder, template={"batch_sizes": [2], "iterations": 2}, baseline="previous")  # vLLM
    job = scheduler.tick(db, settings=settings).schedules[0].submitted[0].job_id
    (broken / "config.json").unlink()  # gone after discovery: the worker's loader refuses the folder

    dispatch(db, settings)
    assert jobs.get(db, job).status is JobStatus.failed
    write_checkpoint(folder, "step-2")
    done = scheduler.tick(db, settings=settings).schedules[0]

    assert [(s.checkpoint, s.verdict) for s in done.settled] == [("step-1", Verdict.error)]
    step1 = by_name(db)["step-1"]
    assert "config.json" in step1.reason and "failed to load" in step1.reason
    assert [s.checkpoint for s in done.submitted] == ["step-2"]  # the schedule carries on
    assert by_name(db)["step-2"].verdict is Verdict.pending

    # Once the checkpoint is fixed and its job retried, it is judged again.
    write_checkpoint(folder, "step-1")
    jobs.retry(db, job)
    scheduler.tick(db, settings=settings)
    assert by_name(db)["step-1"].verdict is Verdict.pending


# --- concurrency ---------------------------------------------------------------------------------------


TICKS = 4


def concurrent_ticks(url: str, settings: Settings) -> list[scheduler.TickReport]:
    """`TICKS` ticks at once, each with its own connections, as separate cron runs would be."""
    barrier = threading.Barrier(TICKS)

    def one(_: int) -> scheduler.TickReport:
        with database.connect(url) as db:
            barrier.wait()
            return scheduler.tick(db, settings=settings)

    with ThreadPoolExecutor(TICKS) as pool:
        return list(pool.map(one, range(TICKS)))


def test_concurrent_ticks_record_one_checkpoint_one_job_and_one_verdict_each(
    db: Database, settings: Settings, tmp_path: Path, webhook: SimpleNamespace
) -> None:
    folder = tmp_path / "run"
    names = ["ckpt-1", "ckpt-2", "ckpt-3"]
    for name in names:
        write_checkpoint(folder, name)
    add(db, settings, folder, template=SMALL)
    settings = settings.model_copy(update={"webhook_url": webhook.url})

    reports = concurrent_ticks(db.url, settings)
    discovered = [n for r in reports for n in r.schedules[0].discovered]
    assert sorted(discovered) == names  # each recorded by exactly one tick
    submitted = [s for r in reports for s in r.schedules[0].submitted]
    jobs_of = {(s.checkpoint, s.job_id) for s in submitted}
    assert len(jobs_of) == 3 and {c for c, _ in jobs_of} == set(names)  # one job id per checkpoint
    assert sorted(s.checkpoint for s in submitted if s.created) == names  # each created once
    assert count_jobs(db) == 3
    with db.read() as session:
        assert session.scalar(select(func.count()).select_from(Checkpoint)) == 3

    for checkpoint in by_name(db).values():
        assert checkpoint.job_id is not None
        run_inline(db, checkpoint.job_id)
    reports = concurrent_ticks(db.url, settings)
    settled = Counter(s.checkpoint for r in reports for s in r.schedules[0].settled)
    assert settled == Counter(names)  # each verdict written by exactly one tick
    assert sorted(p["checkpoint"] for p in webhook.received) == names  # and posted once
    assert {c.announcement for c in by_name(db).values()} == {Announcement.sent}


# --- baselines, insufficient data, the webhook ---------------------------------------------------------


def test_previous_skips_a_checkpoint_in_error_and_waits_for_an_unfinished_baseline(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    folder = tmp_path / "run"
    write_checkpoint(folder, "ckpt-1")
    write_checkpoint(
        folder, "ckpt-2", hook={"fake": {"first": 2.0}}
    )  # an invalid hook: its job can't be made
    write_checkpoint(folder, "ckpt-3", hook={"seed": 3})
    add(db, settings, folder, template=SMALL, baseline="previous")
    scheduler.tick(db, settings=settings)
    checkpoints = by_name(db)
    assert checkpoints["ckpt-2"].verdict is Verdict.error and checkpoints["ckpt-2"].job_id is None
    assert (
        "could not submit its job" in checkpoints["ckpt-2"].reason
        and "fake.first" in checkpoints["ckpt-2"].reason
    )

    run_inline(db, _job(checkpoints["ckpt-3"]))
    scheduler.tick(db, settings=settings)
    waiting = by_name(db)["ckpt-3"]
    assert waiting.verdict is Verdict.pending
    assert f"waiting for baseline checkpoint ckpt-1 job {checkpoints['ckpt-1'].job_id}" in waiting.reason

    run_inline(db, _job(checkpoints["ckpt-1"]))
    settled = {s.checkpoint: s.verdict for s in scheduler.tick(db, settings=settings).schedules[0].settled}
    assert settled == {"ckpt-1": Verdict.baseline, "ckpt-3": Verdict.passed}
    detail = by_name(db)["ckpt-3"].detail
    assert detail is not None and detail.baseline_checkpoint == "ckpt-1"


def _job(checkpoint: schedule_rows.CheckpointRecord) -> int:
    assert checkpoint.job_id is not None
    return checkpoint.job_id


def test_a_fixed_baseline_job_and_too_few_answers(db: Database, settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_checkpoint(folder, "a-1")
    add(db, settings, folder, name="first", template=SMALL)
    scheduler.tick(db, settings=settings)
    reference = _job(by_name(db, "first")["a-1"])
    run_inline(db, reference)

    with pytest.raises(PosbiasError, match="one in common"):
        add(
            db,
            settings,
            folder,
            name="mismatch",
            template={**SMALL, "batch_sizes": [3]},
            baseline=str(reference),
        )
    with pytest.raises(NotFoundError, match="no job 999"):
        add(db, settings, folder, name="missing", baseline="999")
    with pytest.raises(ConflictError, match="already a schedule named first"):
        add(db, settings, folder, name="first")

    add(db, settings, folder, name="fixed", template={**SMALL, "seed": 5}, baseline=str(reference))
    add(db, settings, folder, name="thin", template={**SMALL, "iterations": 10}, baseline="previous")
    write_checkpoint(folder, "a-2")
    scheduler.tick(db, settings=settings)
    for name in ("fixed", "thin"):
        for checkpoint in by_name(db, name).values():
            run_inline(db, _job(checkpoint))
    scheduler.tick(db, settings=settings)

    fixed = by_name(db, "fixed")
    assert {c.verdict for c in fixed.values()} == {Verdict.passed}  # both compared with the fixed job
    assert {c.detail.baseline_job_id for c in fixed.values() if c.detail} == {reference}
    thin = by_name(db, "thin")
    assert thin["a-1"].verdict is Verdict.baseline
    assert thin["a-2"].verdict is Verdict.inconclusive
    assert f"fewer than {MIN_ANSWERS} answers at every position" in thin["a-2"].reason


def test_verdicts_are_posted_once_and_a_failing_webhook_is_retried_but_never_fatal(
    db: Database, settings: Settings, tmp_path: Path, webhook: SimpleNamespace
) -> None:
    folder = tmp_path / "run"
    write_checkpoint(folder, "c-1")
    write_checkpoint(folder, "c-2", hook={"fake": {"first": 0.0, "last": 0.0}})
    add(db, settings, folder, template={**SMALL, "iterations": 100})
    scheduler.tick(db, settings=settings)
    for checkpoint in by_name(db).values():
        run_inline(db, _job(checkpoint))
    webhook.statuses[:] = [500, 500]  # the first two posts fail: c-1 once, then c-1 again or c-2
    hooked = settings.model_copy(update={"webhook_url": webhook.url})

    first = scheduler.tick(db, settings=hooked)
    assert len(first.announce_failures) == 2 and all("HTTP 500" in f for f in first.announce_failures)
    assert all("secret-token" not in f for f in first.announce_failures)  # the URL's token never shows
    assert webhook.received == []
    second = scheduler.tick(db, settings=hooked)
    assert second.announce_failures == [] and sorted(second.announced) == ["nightly/c-1", "nightly/c-2"]
    assert scheduler.tick(db, settings=hooked).announced == []  # announced once

    posted = {p["checkpoint"]: p for p in webhook.received}
    assert posted["c-1"]["verdict"] == "baseline" and posted["c-2"]["verdict"] == "regression"
    assert posted["c-2"]["batch_sizes"][0]["worst_drop"]["flagged"] is True
    assert posted["c-2"]["text"].startswith("posbias: nightly checkpoint c-2: REGRESSION")

    # A webhook that never answers: the tick still succeeds, and gives up after a few ticks.
    write_checkpoint(folder, "c-3")
    dead = settings.model_copy(update={"webhook_url": "http://127.0.0.1:9/hook"})
    scheduler.tick(db, settings=dead)
    run_inline(db, _job(by_name(db)["c-3"]))
    failures = [scheduler.tick(db, settings=dead).announce_failures for _ in range(MAX_ANNOUNCE_ATTEMPTS + 1)]
    assert [len(f) for f in failures] == [1] * MAX_ANNOUNCE_ATTEMPTS + [0]
    assert "gave up" in failures[-2][0]
    assert by_name(db)["c-3"].announcement is Announcement.failed


# --- the hub --------------------------------------------------------------------------------------------


class StubHub:
    """Stands in for `huggingface_hub.HfApi` (no hub is reachable here): commits newest first, refs."""

    def __init__(self) -> None:
        self.commits: list[str] = []
        self.branches: list[tuple[str, str]] = []
        self.error: Exception | None = None

    def list_repo_commits(self, repo_id: str, *, revision: str | None = None) -> list[Any]:
        if self.error:
            raise self.error
        return [SimpleNamespace(commit_id=c) for c in self.commits]

    def list_repo_refs(self, repo_id: str) -> Any:
        if self.error:
            raise self.error
        return SimpleNamespace(
            branches=[SimpleNamespace(name=n, target_commit=c) for n, c in self.branches], tags=[]
        )


def sha(i: int) -> str:
    """A commit id."""
    return hashlib.sha1(str(i).encode()).hexdigest()


def test_hub_commits_from_the_head_on_and_an_unreachable_hub(
    db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hub = StubHub()
    hub.commits = [sha(3), sha(2), sha(1)]
    schedule_rows.add_schedule(
        db,
        "hub",
        source=HubSource(repo="org/model"),
        template=SMALL,
        baseline="first",
        rule=RULE,
        settings=settings,
    )
    first = scheduler.tick(db, settings=settings, hub=hub).schedules[0]
    assert first.discovered == [sha(3)[:12]]  # the head only: the schedule is for revisions from now on
    job = jobs.get(db, first.submitted[0].job_id)
    assert (job.model, job.revision) == ("org/model", sha(3))

    hub.commits = [sha(5), sha(4), *hub.commits]
    assert scheduler.tick(db, settings=settings, hub=hub).schedules[0].discovered == [
        sha(4)[:12],
        sha(5)[:12],
    ]

    hub.error = ConnectionError("connection refused")
    unreachable = scheduler.tick(db, settings=settings, hub=hub).schedules[0]
    assert unreachable.problem is not None and unreachable.problem.startswith("hub unreachable")
    assert schedule_rows.get_schedule(db, "hub").last_error == unreachable.problem
    assert len(schedule_rows.list_checkpoints(db, "hub")) == 3  # nothing lost

    # The real client, offline: the same record, and a folder schedule in the same tick carries on.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    write_checkpoint(tmp_path / "run", "local-1")
    add(db, settings, tmp_path / "run", name="local", template=SMALL)
    both = {s.schedule: s for s in scheduler.tick(db, settings=settings).schedules}
    assert both["hub"].problem is not None and "hub unreachable" in both["hub"].problem
    assert "OfflineModeIsEnabled" in both["hub"].problem
    assert both["local"].discovered == ["local-1"] and both["local"].problem is None


def test_hub_branches_are_checkpoints_in_step_order(db: Database, settings: Settings) -> None:
    hub = StubHub()
    hub.branches = [("main", sha(9)), ("step10", sha(2)), ("step2", sha(1))]
    schedule_rows.add_schedule(
        db,
        "pythia",
        source=HubSource(repo="org/pythia", revisions=HubRevisions.branches),
        template=SMALL,
        baseline="previous",
        rule=RULE,
        settings=settings,
    )
    done = scheduler.tick(db, settings=settings, hub=hub).schedules[0]
    assert done.discovered == ["step2", "step10"]
    assert [(c.name, c.revision) for c in schedule_rows.list_checkpoints(db, "pythia")] == [
        ("step2", sha(1)),
        ("step10", sha(2)),
    ]


# --- what counts as a complete checkpoint ---------------------------------------------------------------


def test_a_checkpoint_is_complete_only_with_its_config_and_all_its_weights(tmp_path: Path) -> None:
    sharded = write_checkpoint(tmp_path, "sharded", weights=False)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    (sharded / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert "model-00002-of-00002.safetensors, which is not there yet" in str(incomplete_reason(sharded))
    (sharded / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert incomplete_reason(sharded) is None

    torch = write_checkpoint(tmp_path, "torch", weights=False)
    (torch / "pytorch_model.bin").write_bytes(b"")
    assert "is empty" in str(incomplete_reason(torch))
    (torch / "pytorch_model.bin").write_bytes(b"x")
    assert incomplete_reason(torch) is None

    truncated = write_checkpoint(tmp_path, "truncated")
    (truncated / "config.json").write_text('{"architectures": [')
    assert "config.json" in str(incomplete_reason(truncated))
    no_config = write_checkpoint(tmp_path, "no-config", config=False)
    assert "config.json" in str(incomplete_reason(no_config))
    half_index = write_checkpoint(tmp_path, "half-index", weights=False)
    (half_index / "model.safetensors.index.json").write_text('{"weight_map": {')
    assert "not complete" in str(incomplete_reason(half_index))

    found = scan_folder(tmp_path)
    assert [f.name for f in found.found] == ["sharded", "torch"]


def test_checkpoints_sort_by_trailing_step_then_name(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    for name in ("checkpoint-final", "checkpoint-10", "checkpoint-2", "b-2", ".hidden-3"):
        write_checkpoint(tmp_path / "run", name)
    add(db, settings, tmp_path / "run", template=SMALL)
    assert scheduler.tick(db, settings=settings).schedules[0].discovered == [
        "b-2",
        "checkpoint-2",
        "checkpoint-10",
        "checkpoint-final",
    ]
    assert [c.step for c in schedule_rows.list_checkpoints(db, "nightly")] == [2, 2, 10, None]


def test_pause_stops_discovery_and_remove_forgets_the_schedule_but_not_its_jobs(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    folder = tmp_path / "run"
    write_checkpoint(folder, "p-1")
    add(db, settings, folder, template=SMALL)
    scheduler.tick(db, settings=settings)
    assert schedule_rows.set_paused(db, "nightly", paused=True).paused
    write_checkpoint(folder, "p-2")
    run_inline(db, _job(by_name(db)["p-1"]))
    paused = scheduler.tick(db, settings=settings).schedules[0]
    assert paused.paused and paused.discovered == [] and [s.checkpoint for s in paused.settled] == ["p-1"]

    schedule_rows.set_paused(db, "nightly", paused=False)
    assert scheduler.tick(db, settings=settings).schedules[0].discovered == ["p-2"]
    assert schedule_rows.remove_schedule(db, "nightly") == 2
    assert schedule_rows.list_schedules(db) == [] and count_jobs(db) == 2
    with pytest.raises(NotFoundError, match="no schedule 'nightly'"):
        scheduler.tick(db, settings=settings, name="nightly")


# --- one transaction per checkpoint, and progress ------------------------------------------------------


class Injected(RuntimeError):
    """A fault a test raises inside a tick, between two of its writes."""


def stored(db: Database) -> dict[str, tuple[int | None, Verdict]]:
    """Every checkpoint row as (its job, its verdict); every job, shard and trial must belong to one."""
    with db.read() as session:
        rows = {c.name: (c.job_id, c.verdict) for c in session.scalars(select(Checkpoint))}
        job_ids = set(session.scalars(select(Job.id)))
        owners = {
            table.__name__: set(session.scalars(select(table.job_id).distinct())) for table in (Shard, Trial)
        }
    assert job_ids == {job for job, _ in rows.values() if job is not None}  # no job without its checkpoint
    assert all(found <= job_ids for found in owners.values()), owners  # no rows of a job rolled back
    return rows


# (what fails, on which of its calls, the checkpoints the failed tick leaves stored)
FAULTS = [
    pytest.param(scheduler, "_checkpoint_row", 2, ["ckpt-1"], id="after-the-record"),
    pytest.param(jobs, "submit_in", 2, ["ckpt-1"], id="after-the-job"),
    pytest.param(scheduler, "_link", 2, ["ckpt-1"], id="after-the-link"),
    pytest.param(scheduler, "_settle_in", 1, ["ckpt-1", "ckpt-2"], id="after-the-error-verdict"),
]


@pytest.mark.parametrize(("module", "step", "call", "left"), FAULTS)
def test_a_tick_failing_midway_leaves_no_checkpoint_half_written_and_the_next_tick_takes_it(
    db: Database,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    step: str,
    call: int,
    left: list[str],
) -> None:
    """ckpt-3's job cannot be prepared (a bad test hook: verdict `error`). The fault is raised right after
    the step's `call`-th write, inside the checkpoint's transaction: that checkpoint must be stored not at
    all, the ones before it whole."""
    folder = tmp_path / "run"
    write_checkpoint(folder, "ckpt-1")
    write_checkpoint(folder, "ckpt-2")
    write_checkpoint(folder, "ckpt-3", hook={"not a hook key": 1})
    add(db, settings, folder, template=SMALL)
    real = getattr(module, step)
    calls = Counter[str]()

    def failing(*args: Any, **kwargs: Any) -> Any:
        done = real(*args, **kwargs)
        calls[step] += 1
        if calls[step] == call:
            raise Injected(f"after {step}")
        return done

    monkeypatch.setattr(module, step, failing)
    with pytest.raises(Injected):
        scheduler.tick(db, settings=settings)
    rows = stored(db)
    assert sorted(rows) == left
    assert all(job is not None for job, _ in rows.values())
    monkeypatch.undo()

    done = scheduler.tick(db, settings=settings).schedules[0]
    assert done.discovered == [name for name in ("ckpt-1", "ckpt-2", "ckpt-3") if name not in left]
    rows = stored(db)
    assert sorted(rows) == ["ckpt-1", "ckpt-2", "ckpt-3"]
    assert rows["ckpt-3"] == (None, Verdict.error)
    assert all(
        job is not None and verdict is Verdict.pending for job, verdict in (rows["ckpt-1"], rows["ckpt-2"])
    )
    assert "could not submit its job" in by_name(db)["ckpt-3"].reason
    assert count_jobs(db) == 2


def test_a_checkpoint_recorded_without_its_job_by_an_older_tick_gets_one(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    """A store written before ticks were one transaction per checkpoint may hold a pending checkpoint with
    no job: the next tick submits it, and records it only once."""
    folder = tmp_path / "run"
    write_checkpoint(folder, "old-1")
    record = add(db, settings, folder, template=SMALL)
    with db.write() as session:
        session.add(
            Checkpoint(
                schedule_id=record.id,
                name="old-1",
                model=str(folder / "old-1"),
                discovered_at=record.created_at,
                verdict=Verdict.pending,
                announce_attempts=0,
            )
        )
    done = scheduler.tick(db, settings=settings).schedules[0]
    assert done.discovered == [] and [s.checkpoint for s in done.submitted] == ["old-1"]
    assert stored(db)["old-1"][0] == done.submitted[0].job_id


def test_a_tick_over_many_checkpoints_shows_its_progress_and_keeps_json_clean(
    sqlite_url: str, fast_settings: Callable[..., Settings], mmlu_dir: Path, tmp_path: Path
) -> None:
    """Asked for (`--verbose`; a terminal's stderr gets a bar), the progress is lines on stderr; stdout is
    the JSON alone."""
    from support.in_process import run_cli

    folder = tmp_path / "run"
    names = [f"ckpt-{i}" for i in range(12)]
    for name in names:
        write_checkpoint(folder, name)
    settings = fast_settings(sqlite_url, mmlu_dir=mmlu_dir)
    with database.connect(sqlite_url) as db:
        add(db, settings, folder, template=SMALL)
    env = {
        "POSBIAS_DATABASE_URL": sqlite_url,
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_CACHE_DIR": str(tmp_path / "cache"),
    }
    ran = run_cli(
        ["--verbose", "schedule", "tick", "--json"], env=env, folder=tmp_path, drop_prefix="POSBIAS_"
    )
    assert ran.code == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert sorted(s["checkpoint"] for s in report["schedules"][0]["submitted"]) == sorted(names)
    lines = ran.stderr.splitlines()
    assert "schedule nightly: 0/12 checkpoints" in lines
    assert lines[-1] == "schedule nightly: 12/12 checkpoints"

    again = run_cli(["schedule", "tick", "--json"], env=env, folder=tmp_path, drop_prefix="POSBIAS_")
    assert again.code == 0 and again.stderr == ""  # not asked for, not a terminal: nothing
    json.loads(again.stdout)
