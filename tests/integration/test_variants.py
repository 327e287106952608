"""Variants through the real queue, a real local Ray and the fake engine, on SQLite and PostgreSQL: every
variant answers the same trials on an engine of its own, and comparisons between them are paired."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import text

from posbias.schemas import ConflictError, CurveQuery, NotFoundError, Submitted
from posbias.service import curves, jobs
from posbias.service.database import Database
from posbias.service.dispatcher import Dispatcher
from posbias.service.settings import Settings
from posbias.service.tables import JobStatus

pytestmark = pytest.mark.usefixtures("ray_session")

FLAT = {"first": 0.8, "last": 0.8, "question_effect": 0.0, "prompt_effect": 0.0}
VARIANTS = [
    "baseline",
    # Accuracy falls to 0.1 at the last position: the difference the comparison must find.
    {"name": "late-drop", "fake": {"last": 0.1}},
    # Changes a field to the value it already has: the same engine, so the same answers.
    {"name": "twin", "fake": {"first": 0.8}},
]


def test_variants_answer_the_same_trials_and_compare_paired(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    job = make_job(db, batch_sizes=(5,), iterations=40, shard_size=20, fake=FLAT, variants=VARIANTS).job_id
    dispatcher = Dispatcher(db, settings=fast_settings(db.url))
    try:
        dispatcher.run(until_empty=True)
        loads = dict(dispatcher.pools.loads)
    finally:
        dispatcher.close()

    record = jobs.get(db, job)
    assert record.status is JobStatus.done
    assert [v.name for v in record.variants] == ["baseline", "late-drop", "twin"]
    assert all(v.engine is not None for v in record.variants)
    # late-drop's engine is its own; twin asks for the same fake model as the baseline, so it shares its key.
    keys = {v.name: v.model_key for v in record.variants}
    assert keys["late-drop"] != keys["baseline"] == keys["twin"]
    assert sorted(loads) == sorted({keys["baseline"], keys["late-drop"]}) and set(loads.values()) == {1}
    with db.read() as session:
        shown = session.execute(
            text("SELECT variant, question_ids FROM trials WHERE job_id = :j ORDER BY variant, iteration"),
            {"j": job},
        ).all()
        view = session.execute(
            text("SELECT DISTINCT variant FROM position_curve WHERE job_id = :j ORDER BY variant"), {"j": job}
        ).all()
    prompts: dict[str, list[list[str]]] = {}
    for variant, question_ids in shown:
        prompts.setdefault(variant, []).append(question_ids)
    assert list(prompts) == ["baseline", "late-drop", "twin"]
    assert len(prompts["baseline"]) == 40 and prompts["baseline"] == prompts["late-drop"] == prompts["twin"]
    assert [row[0] for row in view] == ["baseline", "late-drop", "twin"]

    by_variant = {c.variant: c for c in curves.curves(db, CurveQuery(job_id=job))}
    assert list(by_variant) == ["baseline", "late-drop", "twin"]

    base = CurveQuery(job_id=job, variant="baseline")
    dropped = curves.compare(db, base, CurveQuery(job_id=job, variant="late-drop"), batch_size=5)
    assert dropped.method == "paired" and dropped.matched_trials == 40
    assert (dropped.a, dropped.b) == (f"job {job}:baseline", f"job {job}:late-drop")
    last = dropped.points[-1]
    assert last.diff is not None and last.diff < -0.4 and last.different
    assert not dropped.points[0].different

    same = curves.compare(db, base, CurveQuery(job_id=job, variant="twin"), batch_size=5)
    assert same.method == "paired" and same.matched_trials == 40
    assert all(p.diff == 0.0 and p.ci_low == p.ci_high == 0.0 and not p.different for p in same.points)

    with pytest.raises(
        ConflictError, match=rf"has variants baseline, late-drop, twin: name one, e.g. {job}:"
    ):
        curves.compare(db, CurveQuery(job_id=job), base, batch_size=5)
    with pytest.raises(NotFoundError, match=r"variant global-only.*\(it has baseline, late-drop, twin\)"):
        curves.curves(db, CurveQuery(job_id=job, variant="global-only"))
