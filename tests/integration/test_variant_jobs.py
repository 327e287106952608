"""Variants through the real queue, a real local Ray and the fake engine, on SQLite and PostgreSQL: every
variant answers the same trials on an engine of its own, and comparisons between them are paired."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from support.job_runs import answer_every_shard

from posbias.schemas import ConflictError, CurveAxis, CurveQuery, NotFoundError, ShardResult, Submitted
from posbias.schemas.schedule import RegressionRule, Verdict
from posbias.service.dispatch.dispatcher import Dispatcher
from posbias.service.reports import curves
from posbias.service.reports.plot import plot_curves
from posbias.service.schedules import verdicts
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.store.tables import JobStatus
from posbias.service.work import jobs

Answer = Callable[..., ShardResult]

FLAT = {"first": 0.8, "last": 0.8, "question_effect": 0.0, "prompt_effect": 0.0}
VARIANTS = [
    "baseline",
    # Accuracy falls to 0.1 at the last position: the difference the comparison must find.
    {"name": "late-drop", "fake": {"last": 0.1}},
    # Changes a field to the value it already has: the same engine, so the same answers.
    {"name": "twin", "fake": {"first": 0.8}},
]


@pytest.mark.usefixtures("ray_session")
def test_variants_answer_the_same_trials_and_compare_paired(
    db: Database,
    make_job: Callable[..., Submitted],
    fast_settings: Callable[..., Settings],
    tmp_path: Path,
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
    assert by_variant["late-drop"].points[-1].accuracy < by_variant["baseline"].points[-1].accuracy - 0.4
    overlay = plot_curves(list(by_variant.values()), path=tmp_path / "variants.png")
    assert overlay.read_bytes().startswith(b"\x89PNG")
    by_distance = curves.curves(
        db, CurveQuery(job_id=job, variant="late-drop"), by=CurveAxis.token_distance, bin_width=64
    )
    assert [(c.variant, c.by) for c in by_distance] == [("late-drop", "token-distance")]
    assert sum(p.n for p in by_distance[0].points) == 40 * 5

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


def test_a_schedule_verdict_judges_each_variant_against_the_same_variant(
    db: Database, make_job: Callable[..., Submitted], answer: Answer
) -> None:
    variants = ["baseline", {"name": "late-drop", "fake": {"last": 0.1}}]
    base = make_job(db, batch_sizes=(4,), iterations=30, shard_size=30, variants=variants).job_id
    cand = make_job(db, batch_sizes=(4,), iterations=30, shard_size=30, variants=variants).job_id

    def usual(trial: int, position: int) -> bool:
        return (trial + position) % 3 != 0

    answer_every_shard(db, base, answer, correct=usual)
    # The candidate's late-drop variant (trials 30-59) answers the last position wrong; its baseline does not.
    answer_every_shard(db, cand, answer, correct=lambda t, p: usual(t, p) and not (t >= 30 and p == 4))

    outcome = verdicts.compare_jobs(
        db, baseline_job=base, candidate_job=cand, rule=RegressionRule(max_drop=10)
    )
    by_variant = {v.variant: v for v in outcome.batch_sizes}
    assert list(by_variant) == ["baseline", "late-drop"]
    assert all(v.method == "paired" and v.matched_trials == 30 for v in by_variant.values())
    assert not by_variant["baseline"].drop_flagged and by_variant["late-drop"].drop_flagged
    assert outcome.verdict is Verdict.regression
    assert outcome.reason.startswith("N=4 late-drop position 4: accuracy -66.7 pts")
