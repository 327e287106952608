"""The JSON that `posbias schedule ... --json` prints (posbias/cli/schedule.py): one shape per record."""

from __future__ import annotations

from typing import Any

import posbias


def tick_json(done: posbias.TickReport) -> dict[str, Any]:
    return {
        "schedules": [
            {
                "schedule": s.schedule,
                "paused": s.paused,
                "discovered": s.discovered,
                "waiting": [{"checkpoint": w.name, "reason": w.reason} for w in s.waiting],
                "submitted": [
                    {"checkpoint": x.checkpoint, "job_id": x.job_id, "created": x.created}
                    for x in s.submitted
                ],
                "settled": [
                    {"checkpoint": v.checkpoint, "verdict": v.verdict.value, "reason": v.reason}
                    for v in s.settled
                ],
                "problem": s.problem,
            }
            for s in done.schedules
        ],
        "announced": done.announced,
        "announce_failures": done.announce_failures,
        "regressions": [
            {"schedule": r.schedule, "checkpoint": r.checkpoint, "reason": r.reason} for r in done.regressions
        ],
    }


def report_json(found: posbias.ScheduleReport) -> dict[str, Any]:
    return {
        "schedule": found.schedule.name,
        "batch_size": found.batch_size,
        "baseline": found.schedule.baseline_text,
        "rule": found.schedule.rule.model_dump(mode="json"),
        "checkpoints": [
            {
                **checkpoint_json(row.checkpoint),
                "first_accuracy": row.first_accuracy,
                "last_accuracy": row.last_accuracy,
                "contrast": None if row.contrast is None else row.contrast.model_dump(mode="json"),
                "worst_drop": None if row.worst_drop is None else row.worst_drop.model_dump(mode="json"),
            }
            for row in found.rows
        ],
    }


def schedule_json(r: posbias.ScheduleRecord) -> dict[str, Any]:
    source: dict[str, Any]
    if isinstance(r.source, posbias.FolderSource):
        source = {"folder": str(r.source.path)}
    else:
        source = {"hub": r.source.repo, "branch": r.source.branch, "revisions": r.source.revisions.value}
    return {
        "name": r.name,
        "source": source,
        "template": r.template,
        "baseline": r.baseline.value,
        "baseline_job_id": r.baseline_job_id,
        "rule": r.rule.model_dump(mode="json"),
        "paused": r.paused,
        "created_at": r.created_at,
        "last_tick_at": r.last_tick_at,
        "last_error": r.last_error,
    }


def checkpoint_json(c: posbias.CheckpointRecord) -> dict[str, Any]:
    return {
        "checkpoint": c.name,
        "step": c.step,
        "model": c.model,
        "revision": c.revision,
        "discovered_at": c.discovered_at,
        "job_id": c.job_id,
        "job_status": c.job_status.value if c.job_status else None,
        "verdict": c.verdict.value,
        "reason": c.reason,
        "detail": None if c.detail is None else c.detail.model_dump(mode="json"),
        "evaluated_at": c.evaluated_at,
        "announcement": c.announcement.value if c.announcement else None,
    }
