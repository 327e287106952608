"""A report's views share their reads and their bootstrap draws (issue 39), and show what each view's own
command shows: every curve, explain's fits, a comparison and each trial's page, on SQLite and PostgreSQL, for
jobs of every design (variants and batch size 1, a filler sweep in random order, rotations, probes)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from support.browser import run_fake_job

from posbias.schemas import CurveQuery
from posbias.service.reports import curves as curve_reports
from posbias.service.reports import report, report_data
from posbias.service.reports.curves import StoreReads
from posbias.service.reports.report_views import SharedReads
from posbias.service.reports.trial_view import trial_detail
from posbias.service.stats import TrialData, bootstrap, queries
from posbias.service.store.database import Database
from posbias.service.work import jobs

JOBS = {
    "variants": {
        "batch_sizes": [1, 3, 16],  # 16 questions: distances in several bins, so a band to draw
        "iterations": 20,
        "variants": ["baseline", {"name": "late-rise", "fake": {"last": 0.95}}],
    },
    "sweep": {"batch_sizes": [3], "answer_order": "random", "filler": {"tokens": [0, 120], "where": "end"}},
    "rotation": {"batch_sizes": [3], "iterations": 6, "design": "rotation"},
    "probe": {"batch_sizes": [3], "iterations": 6, "design": "probe"},
}


class Counted(StoreReads):
    """The store, as each command reads it alone, counting the bootstrap passes it makes."""

    def __init__(self) -> None:
        self.passes = 0

    def draws(self, data: TrialData, *, resamples: int, seed: int) -> bootstrap.Resampled:
        self.passes += 1
        return super().draws(data, resamples=resamples, seed=seed)


def assert_same(shown: Any, alone: Any, where: str = "") -> None:
    """The same figures (to 1e-9) and the same everything else."""
    if isinstance(alone, float) and isinstance(shown, float):
        assert math.isclose(shown, alone, rel_tol=0, abs_tol=1e-9), where
    elif isinstance(alone, dict):
        assert isinstance(shown, dict) and shown.keys() == alone.keys(), where
        for key in alone:
            assert_same(shown[key], alone[key], f"{where}/{key}")
    elif isinstance(alone, list):
        assert isinstance(shown, list) and len(shown) == len(alone), where
        for i, (a, b) in enumerate(zip(shown, alone, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert shown == alone, where


def _pairs(db: Database, job: int) -> list[tuple[str, int]]:
    return [
        (variant, n)
        for variant in queries.variants_of(db, job_ids=[job])
        for n in queries.batch_sizes(db, job_ids=[job], variant=variant)
    ]


@pytest.mark.parametrize("design", sorted(JOBS))
def test_a_reports_views_read_once_and_show_what_their_own_commands_show(db: Database, design: str) -> None:
    job = run_fake_job(db, JOBS[design])
    record = jobs.get(db, job)
    reads = SharedReads()
    part = report_data.job_report(db, job, reads=reads)

    alone = Counted()
    for axis in report_data.axes_of(record):
        expected = curve_reports.curves(
            db, CurveQuery(job_id=job), by=axis, bin_width=report_data.BIN_WIDTH, reads=alone
        )
        assert_same(part["curves"][axis.value], [c.model_dump(mode="json") for c in expected], axis.value)
    for variant in queries.variants_of(db, job_ids=[job]):
        expected_fits = curve_reports.explain(db, [job], variant=variant, reads=alone)
        assert_same(part["explain"][variant], [e.model_dump(mode="json") for e in expected_fits], variant)
    assert part["missing"] == {}

    # Each (variant, batch size) read from the store once, for every view.
    assert reads.store_reads == len(_pairs(db, job))
    if design == "variants":
        # Each distance curve with a band drew with its batch size's position curve: one pass, not two.
        banded = [c for c in part["curves"]["token-distance"] if c["points"][0]["band_low"] is not None]
        assert len(banded) == 2  # N = 16 of each variant
        assert reads.passes == alone.passes - len(banded)


def test_a_report_keeping_fewer_answers_reads_again_and_shows_the_same(db: Database) -> None:
    job = run_fake_job(db, JOBS["variants"])
    kept = SharedReads()
    few = SharedReads(kept=1)  # never more than the last batch size read
    assert_same(report_data.job_report(db, job, reads=few), report_data.job_report(db, job, reads=kept))
    assert few.store_reads > kept.store_reads == len(_pairs(db, job))


def test_a_reports_comparison_and_trials_are_those_of_compare_and_trial(db: Database) -> None:
    spec = {"batch_sizes": [3], "iterations": 8}
    a, b = run_fake_job(db, spec), run_fake_job(db, {**spec, "fake": {"last": 0.95}})
    data = report.report_data_for(db, [a, b], max_trials=6)
    ra, rb = jobs.get(db, a), jobs.get(db, b)
    assert_same(data["comparisons"], report_data.comparisons(db, ra, rb, reads=StoreReads()))
    assert len(data["trials"]) == 6
    for key, page in data["trials"].items():
        job, trial = map(int, key.split(":"))
        with db.read() as session:
            view = trial_detail(session, job, trial)  # `posbias trial JOB TRIAL`
        assert view.prompt_token_ids is not None and view.check.matches is True
        expected = view.model_dump(mode="json", exclude={"prompt_token_ids", "token_offsets"})
        assert page == {**expected, "prompt_tokens": len(view.prompt_token_ids)}
        assert any(s["window_start_char"] is not None for s in page["spans"]) or not view.sliding_window
