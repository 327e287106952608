"""What a report shows, read from the store: per job its record, its curves on every axis its design
varies, explain's fits, the schedule it belongs to; a comparison of two jobs; the job list the viewer opens
on. The answers behind the points are listed apart (`service/reports/answer_lists.py`).

Everything here only reads, through the same functions the API's `curves`, `compare` and `explain` call, and
returns plain JSON-ready data: `service/reports/report_page.py` turns it into a page, whose inlined script
draws it (`service/reports/report_assets/`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from posbias.schemas import (
    BASELINE,
    AnswerOrder,
    CurveAxis,
    CurveQuery,
    Design,
    JobRecord,
    NotFoundError,
    PosbiasError,
)
from posbias.service.reports import curves as curve_reports
from posbias.service.reports.report_views import SharedReads
from posbias.service.schedules import checkpoint_records
from posbias.service.stats import attention_curve, attention_explain
from posbias.service.store import (
    AttentionLayer,
    AttentionPoint,
    Checkpoint,
    Database,
    Schedule,
)
from posbias.service.work import jobs as job_store

BIN_WIDTH = 256
"""Token-distance bin width of a report's distance view (the `posbias curve` default)."""


def job_list(db: Database, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Every job, newest first, with its progress: the viewer's first page."""
    return [_job_summary(record) for record in job_store.find(db, limit=limit)]


def _job_summary(record: JobRecord) -> dict[str, Any]:
    progress = record.progress
    return {
        "id": record.id,
        "model": record.model,
        "revision": record.revision,
        "status": record.status.value,
        "created_at": record.created_at.isoformat(),
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "batch_sizes": list(record.spec.batch_sizes),
        "variants": [v.name for v in record.spec.runs],
        "design": record.spec.describe_design(),
        "trials_total": progress.trials_total,
        "trials_done": progress.trials_done,
        "trials_skipped": progress.trials_skipped,
        "shards": {status.value: count for status, count in progress.shards.items()},
        "error": record.error,
    }


def axes_of(record: JobRecord) -> list[CurveAxis]:
    """The axes a job's design varies apart from position: the answer slot when answers are not asked in
    prompt order, the filler length in a sweep of several; the token distance always (it moves with
    position in every design)."""
    spec = record.spec
    axes = [CurveAxis.position]
    if spec.answer_order is not AnswerOrder.forward or spec.design is Design.probe:
        axes.append(CurveAxis.answer_slot)
    axes.append(CurveAxis.token_distance)
    if spec.filler is not None and len(spec.filler.tokens) > 1:
        axes.append(CurveAxis.filler_length)
    return axes


def job_report(db: Database, job_id: int, *, reads: SharedReads | None = None) -> dict[str, Any]:
    """One job's part of a report: its record, curves by every axis it varies (each variant its own
    curves), explain per variant, its schedule. A part that cannot be shown yet (a job without
    results) says why in `missing` instead. Each is what its own command gives; the views share their
    reads of the store and their bootstrap draws through `reads` (`service/reports/report_views.py`)."""
    record = job_store.get(db, job_id)  # NotFoundError names the fix
    reads = reads or SharedReads()
    axes = axes_of(record)
    found: dict[CurveAxis, list[dict[str, Any]] | str] = {}
    # The token distance first: its answers come from the batch sizes' reads, and its draws are made with
    # the position curve's, which then finds them made.
    for axis in sorted(axes, key=lambda a: a is not CurveAxis.token_distance):
        try:
            built = curve_reports.curves(
                db, CurveQuery(job_id=job_id), by=axis, bin_width=BIN_WIDTH, reads=reads
            )
        except PosbiasError as exc:  # no results yet, or no token offsets
            found[axis] = str(exc)
            continue
        found[axis] = [c.model_dump(mode="json") for c in built]
    missing = {axis.value: said for axis in axes if isinstance(said := found[axis], str)}
    curves = {axis.value: shown for axis in axes if not isinstance(shown := found[axis], str)}
    explained: dict[str, list[dict[str, Any]]] = {}
    if CurveAxis.position.value in curves:
        for variant in _variants(curves[CurveAxis.position.value]):
            try:
                fits = curve_reports.explain(db, [job_id], variant=variant, reads=reads)
            except (PosbiasError, Warning) as exc:
                # A warning raised as an error (a fit on a rank-deficient design, where warnings are
                # errors) costs this section, not the page.
                missing[f"explain {variant}"] = str(exc)
                continue
            explained[variant] = [e.model_dump(mode="json") for e in fits]
    return {
        "job": record.model_dump(mode="json"),
        "summary": _job_summary(record),
        "design": record.spec.describe_design(),
        "curves": curves,
        "bin_width": BIN_WIDTH,
        "explain": explained,
        "schedule": schedule_of(db, job_id),
        "attention": attention_of(db, job_id),
        "missing": missing,
    }


def attention_bin_width(window: int | None) -> int:
    """The token-distance bin width of a report's attention view: an eighth of the sliding window, so the
    window falls on a bin edge and the decay within it shows in eight bins; `BIN_WIDTH` without a window."""
    return max(1, window // 8) if window else BIN_WIDTH


def attention_of(db: Database, job_id: int) -> dict[str, Any] | None:
    """The attention section of an `hf` job: own-question attention by position and by token distance per
    layer kind (the curves `posbias curve --metric attention` reads), each variant's layers as the canary
    built them (the window to mark), and explain's attention section. None for a job without attention
    rows (every engine but `hf`)."""
    with db.read() as session:
        found = session.scalar(select(AttentionPoint.job_id).where(AttentionPoint.job_id == job_id).limit(1))
        if found is None:
            return None
        layers = session.execute(
            select(AttentionLayer.variant, AttentionLayer.layer, AttentionLayer.kind, AttentionLayer.window)
            .add_columns(AttentionLayer.passed)
            .where(AttentionLayer.job_id == job_id)
            .order_by(AttentionLayer.variant, AttentionLayer.layer)
        ).all()
    canary: dict[str, dict[str, Any]] = {}
    for variant, layer, kind, window, passed in layers:
        built = canary.setdefault(variant, {"window": None, "sliding": [], "global": [], "passed": True})
        built[kind].append(layer)
        built["passed"] = built["passed"] and bool(passed)
        if kind == "sliding" and window is not None:
            built["window"] = max(int(window), built["window"] or 0)
    windows = [c["window"] for c in canary.values() if c["window"]]
    bin_width = attention_bin_width(max(windows) if windows else None)
    curves = {
        by: [
            c.model_dump(mode="json")
            for c in attention_curve.attention_curves(db, job_id=job_id, by=by, bin_width=bin_width)
        ]
        for by in attention_curve.AXES
    }
    explained: list[dict[str, Any]] = []
    for variant in dict.fromkeys(c["variant"] for c in curves["position"]):
        try:
            sections = attention_explain.explain_attention(db, [job_id], variant=variant)
        except PosbiasError:
            continue
        explained.extend(e.model_dump(mode="json") for e in sections if e.job_id == job_id)
    return {"bin_width": bin_width, "canary": canary, "curves": curves, "explain": explained}


def _variants(curves: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(c["variant"]) for c in curves))


def schedule_of(db: Database, job_id: int) -> dict[str, Any] | None:
    """The schedule whose checkpoint (or baseline) `job_id` is, with every checkpoint in order: the
    report's strip. None for a job no schedule ran."""
    with db.read() as session:
        row = session.execute(
            select(Schedule.id, Schedule.name)
            .join(Checkpoint, Checkpoint.schedule_id == Schedule.id)
            .where(Checkpoint.job_id == job_id)
            .limit(1)
        ).first()
        if row is None:
            return None
        checkpoints = checkpoint_records(session, row.id)
    return {
        "name": row.name,
        "checkpoints": [
            {
                "name": c.name,
                "step": c.step,
                "job_id": c.job_id,
                "job_status": c.job_status.value if c.job_status else None,
                "verdict": c.verdict.value,
                "reason": c.reason,
            }
            for c in checkpoints
        ],
    }


def comparisons(
    db: Database, a: JobRecord, b: JobRecord, *, reads: SharedReads | None = None
) -> list[dict[str, Any]]:
    """B minus A at each batch size both jobs have results for (each side's baseline, or its first
    variant), as `posbias compare A B --batch-size N` computes it (`reads`: the report's, shared with
    its other views)."""
    reads = reads or SharedReads()
    found = []
    sides = []
    for record in (a, b):
        names = [v.name for v in record.spec.runs]
        sides.append(CurveQuery(job_id=record.id, variant=BASELINE if BASELINE in names else names[0]))
    try:
        shared = sorted(
            set(curve_reports.batch_sizes(db, sides[0])) & set(curve_reports.batch_sizes(db, sides[1]))
        )
    except NotFoundError:
        return []
    for n in shared:
        comparison = curve_reports.compare(db, sides[0], sides[1], batch_size=n, reads=reads)
        found.append(comparison.model_dump(mode="json"))
    return found
