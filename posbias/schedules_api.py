"""Regression schedules from Python: what `posbias schedule ...` does, as functions.

A schedule watches where checkpoints of a model appear (a folder's subfolders, or a hub repository's
revisions), gives each a job (its spec template with the checkpoint filled in) and judges it against a
baseline by a `RegressionRule`. `tick_schedules` does one round; `posbias worker` (or `dispatch`) runs the
jobs it submits.

    from pathlib import Path

    import posbias
    from posbias.schemas.schedule import RegressionRule

    posbias.add_schedule(
        "nightly",
        spec={"engine": {"name": "fake"}, "batch_sizes": [5], "iterations": 100},
        source=posbias.FolderSource(path=Path("runs/ckpts")),
        rule=RegressionRule(max_drop=5),
    )
    report = posbias.tick_schedules("nightly")
    print(report.regressions)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias import edge
from posbias.api import _settings, _store
from posbias.schemas.schedule import RegressionRule
from posbias.service.reports import ScheduleReport
from posbias.service.reports import schedule_report as reports
from posbias.service.schedules import (
    CheckpointRecord,
    FolderSource,
    HubSource,
    ScheduleRecord,
    Source,
    TickReport,
    schedule_rows,
    scheduler,
)
from posbias.service.settings import Settings


@dataclass(frozen=True)
class ScheduleState:
    """A schedule with its checkpoints in order (step, then name), each with its job and verdict."""

    schedule: ScheduleRecord
    checkpoints: list[CheckpointRecord]


@edge.public
def add_schedule(
    name: str,
    *,
    spec: str | Path | Mapping[str, Any],
    source: Source,
    rule: RegressionRule,
    baseline: str = "first",
    settings: Settings | None = None,
) -> ScheduleRecord:
    """Add a schedule: where its checkpoints appear (`FolderSource` or `HubSource`), its job spec template
    (a mapping, a YAML/JSON file, or inline JSON; each checkpoint fills in `model` and `revision`), its
    baseline (`first`, `previous` or a job id) and its rule.

    `ScheduleSpecError` when the template or the baseline cannot be used as given (checked before the store
    is opened); `PosbiasError` naming the fix when the name, the source, the dataset or the baseline job
    will not do; `ConflictError` when the name is taken."""
    name = edge.text(name, what="schedule name")
    edge.typed(spec, str | Path | Mapping, what="spec", kind="a mapping, a spec file's path or inline JSON")
    edge.typed(source, FolderSource | HubSource, what="source", kind="a FolderSource or a HubSource")
    edge.typed(rule, RegressionRule, what="rule", kind="a RegressionRule")
    baseline = edge.text(baseline, what="baseline")
    settings = _settings(settings)
    template = schedule_rows.checked_template(spec, baseline=baseline)
    with _store(settings) as db:
        return schedule_rows.add_schedule(
            db, name, source=source, template=template, baseline=baseline, rule=rule, settings=settings
        )


@edge.public
def list_schedules(*, settings: Settings | None = None) -> list[ScheduleState]:
    """Every schedule, by name, with its checkpoints."""
    with _store(_settings(settings)) as db:
        return [
            ScheduleState(schedule=record, checkpoints=schedule_rows.list_checkpoints(db, record.name))
            for record in schedule_rows.list_schedules(db)
        ]


@edge.public
def schedule(name: str, *, settings: Settings | None = None) -> ScheduleState:
    """One schedule with its checkpoints. `NotFoundError` when there is none."""
    name = edge.text(name, what="schedule name")
    with _store(_settings(settings)) as db:
        record = schedule_rows.get_schedule(db, name)
        return ScheduleState(schedule=record, checkpoints=schedule_rows.list_checkpoints(db, name))


@edge.public
def remove_schedule(name: str, *, settings: Settings | None = None) -> int:
    """Delete a schedule and its checkpoint records; the jobs it submitted and their results stay. Returns
    how many checkpoint records were deleted."""
    name = edge.text(name, what="schedule name")
    with _store(_settings(settings)) as db:
        return schedule_rows.remove_schedule(db, name)


@edge.public
def pause_schedule(name: str, *, settings: Settings | None = None) -> ScheduleRecord:
    """Stop picking up new checkpoints; jobs already submitted still get their verdicts."""
    name = edge.text(name, what="schedule name")
    with _store(_settings(settings)) as db:
        return schedule_rows.set_paused(db, name, paused=True)


@edge.public
def resume_schedule(name: str, *, settings: Settings | None = None) -> ScheduleRecord:
    """Pick up new checkpoints again; the next tick catches up on any that appeared meanwhile."""
    name = edge.text(name, what="schedule name")
    with _store(_settings(settings)) as db:
        return schedule_rows.set_paused(db, name, paused=False)


@edge.public
def tick_schedules(
    name: str | None = None,
    *,
    settings: Settings | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> TickReport:
    """One round for schedule `name` (default: every schedule): find new checkpoints, submit their jobs,
    judge finished ones against their baselines, post new verdicts to `settings.webhook_url`. Runs no job
    itself, and is safe to run from cron, even twice at once; a tick that fails or is stopped midway leaves
    no checkpoint recorded without its job. `report.regressions` names the schedules whose newest compared
    checkpoint is a regression (what a CI gate fails on). `on_progress(schedule, checkpoints taken, to
    take)` is called as their jobs are submitted."""
    name = None if name is None else edge.text(name, what="schedule name")
    settings = _settings(settings)
    with _store(settings) as db:
        return scheduler.tick(db, settings=settings, name=name, on_progress=on_progress)


@edge.public
def schedule_report(
    name: str, *, batch_size: int | None = None, settings: Settings | None = None
) -> ScheduleReport:
    """Every checkpoint in order with its verdict, first and last accuracy, last minus first and the worst
    drop of its verdict, at `batch_size` (default: the template's largest); `report.plot(path)` draws the
    finished checkpoints' curves."""
    name, batch_size = edge.text(name, what="schedule name"), edge.batch_size(batch_size)
    with _store(_settings(settings)) as db:
        return reports.schedule_report(db, name, batch_size=batch_size)
