"""A schedule's report: every checkpoint in order with its verdict and summary metrics at one batch size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posbias.schemas import (
    Curve,
    CurveQuery,
    Interval,
    JobStatus,
    PosbiasError,
)
from posbias.schemas.schedule import (
    PositionDrop,
)
from posbias.service.reports import curves
from posbias.service.schedules import (
    CheckpointRecord,
    ScheduleRecord,
    get_schedule,
    list_checkpoints,
    template_spec,
)
from posbias.service.stats import queries
from posbias.service.store import Database


@dataclass(frozen=True)
class ReportRow:
    """One checkpoint in a schedule report, at the report's batch size."""

    checkpoint: CheckpointRecord
    first_accuracy: float | None
    last_accuracy: float | None
    contrast: Interval | None
    """Last-minus-first accuracy of the checkpoint's own job (cluster bootstrap)."""
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

    def plot(self, path: str | Path) -> Path:
        """Write the finished checkpoints' curves overlaid as a PNG at `path`, one line per checkpoint;
        `PosbiasError` when no checkpoint has a finished job yet. Returns the path."""
        from posbias.service.reports.plot import plot_curves

        drawn = [(row.checkpoint.name, row.curve) for row in self.rows if row.curve is not None]
        if not drawn:
            raise PosbiasError(
                f"nothing to plot: no checkpoint of {self.schedule.name} has a finished job yet"
            )
        return plot_curves(
            [curve for _, curve in drawn],
            path=path,
            labels=[name for name, _ in drawn],
            title=f"schedule {self.schedule.name}: accuracy by position, batch size {self.batch_size}",
        )


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
        if checkpoint.job_status is JobStatus.done and queries.matching_jobs(
            db, job_id=checkpoint.job_id, batch_size=batch_size
        ):
            query = CurveQuery(job_id=checkpoint.job_id, batch_size=batch_size)
            curve = curves.curves(db, query)[0]
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
                contrast=curve.contrast if curve else None,
                worst_drop=worst,
                curve=curve,
            )
        )
    return ScheduleReport(schedule=schedule, batch_size=batch_size, rows=rows)
