"""What a user reads off `curve`, `compare` and `explain` at the demo's size (4 iterations) on both stores:
no interval outside what its statistic can be, a one-line warning that the intervals are rough, rounded
figures, no library warning on the console; a parse collapse at the end of the answer sheet failing a
verdict and showing in `compare`; and `explain` naming a fake's collapse onto one option."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from support.in_process import run_cli
from support.job_runs import answer_every_shard

from posbias.schemas import JobStatus
from posbias.schemas.schedule import RegressionRule, Verdict
from posbias.service.schedules import verdicts
from posbias.service.stats.explain import MIN_CLUSTERS
from posbias.service.store.database import Database
from posbias.service.work import jobs
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard

DIFFERENCES = {
    "diff",
    "contrast",
    "contrast_a",
    "contrast_b",
    "worst_drop",
    "change",
    "slope",
    "position_effect",
}
"""Fields whose intervals are differences of proportions (within +-1)."""


def _run(db: Database, job_id: int) -> None:
    spec = jobs.get(db, job_id).spec
    answer_every_shard(db, job_id, run_shard, engine=FakeEngine(spec.fake, seed=spec.seed, model=spec.model))
    assert jobs.get(db, job_id).status is JobStatus.done


def _intervals(data: Any, path: str = "") -> list[tuple[str, float | None, float | None]]:
    """Every (where, low, high) in a command's JSON: `Interval` records, and points' `ci_*` and `band_*`."""
    found = []
    if isinstance(data, dict):
        if {"low", "high"} <= data.keys():
            found.append((path, data["low"], data["high"]))
        for prefix in ("ci", "band"):
            if f"{prefix}_low" in data:
                found.append((f"{path}.{prefix}", data[f"{prefix}_low"], data[f"{prefix}_high"]))
        for key, value in data.items():
            found += _intervals(value, f"{path}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += _intervals(value, f"{path}[{i}]")
    return found


def _possible(where: str, low: float | None, high: float | None) -> bool:
    """Inside what the statistic can be: a ratio at least 0, a change of a contrast within +-2, any other
    difference within +-1, an accuracy or share within [0, 1]."""
    if low is None or high is None:
        return True
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return False
    if "ratio" in where:
        return low >= 0
    if "contrast_diff" in where:
        return low >= -2 and high <= 2
    names = set(re.findall(r"[a-z_]+", where))
    if names & DIFFERENCES or "comparison" in where or where.startswith("$compare"):
        return low >= -1 and high <= 1
    return low >= 0 and high <= 1


def _demo_jobs(db: Database, make_job: Any) -> tuple[str, str]:
    """Two fake jobs of the demo's shape (batch sizes 1, 5, 10; 4 iterations), run to the end."""
    first = make_job(db, batch_sizes=(1, 5, 10), iterations=4, shard_size=4)
    worse = make_job(db, batch_sizes=(1, 5, 10), iterations=4, shard_size=4, fake={"first": 0.1, "last": 0.3})
    for job in (first, worse):
        _run(db, job.job_id)
    return str(first.job_id), str(worse.job_id)


def _impossible(args: list[str], *, env: dict[str, str], folder: Path, tag: str) -> list[Any]:
    as_json = run_cli(args, env=env, folder=folder)
    assert as_json.code == 0, as_json.stderr
    return [
        (w, lo, hi) for w, lo, hi in _intervals(json.loads(as_json.stdout), tag) if not _possible(w, lo, hi)
    ]


def test_demo_sized_curves_and_comparisons_have_possible_rounded_intervals_and_say_they_are_rough(
    db: Database, database_url: str, make_job: Any, tmp_path: Path
) -> None:
    a, b = _demo_jobs(db, make_job)
    env = {"POSBIAS_DATABASE_URL": database_url, "COLUMNS": "250"}
    curve = ["curve", "--job", a, "--band"]
    assert _impossible([*curve, "--format", "json"], env=env, folder=tmp_path, tag="$curve") == []
    shown = run_cli(curve, env=env, folder=tmp_path)
    assert shown.code == 0, shown.stderr
    assert "Warning" not in shown.stdout + shown.stderr  # a library's (SingularMatrixWarning at N = 1)
    assert "too few for the cluster bootstrap" in shown.stdout, shown.stdout[-1500:]
    for n in ("1", "5", "10"):
        compare = ["compare", a, b, "--batch-size", n]
        assert _impossible([*compare, "--json"], env=env, folder=tmp_path, tag="$compare") == []
        shown = run_cli(compare, env=env, folder=tmp_path)
        assert shown.code == 0, shown.stderr
        assert "Warning" not in shown.stdout + shown.stderr
        assert not re.search(r"\d\.\d{4,}", shown.stdout), shown.stdout[-2000:]  # rounded
        assert "warning: only 4 trials: too few for the cluster bootstrap" in shown.stderr, shown.stderr


def _explained_intervals(data: Any) -> list[tuple[str, float | None, float | None, float]]:
    """Every interval `explain --json` prints, with the most its statistic can be: 1 (100 points) for a
    first-to-last change, a bend or the step; for distance's per-1,000-token change, 1 (2 with a step in
    the fit) over its span."""
    found = []
    for shown in data:
        stepped = shown["window"] is not None and shown["window"].get("jump") is not None
        for effect in shown["effects"]:
            span = effect.get("span")
            most = 1.0 if span is None else (2.0 if stepped else 1.0) * 1000 / (span[1] - span[0])
            for part in ("effect", "bend"):
                interval = effect.get(part)
                if interval is not None:
                    found.append((f"{effect['name']} {part}", interval["low"], interval["high"], most))
        if shown["window"] is not None and shown["window"].get("jump") is not None:
            jump = shown["window"]["jump"]
            found.append(("step", jump["low"], jump["high"], 1.0))
    return found


@pytest.mark.parametrize("iterations", [4, MIN_CLUSTERS])
def test_explanations_have_possible_intervals_at_the_demos_size_and_at_the_smallest_explain_fits(
    db: Database, database_url: str, make_job: Any, tmp_path: Path, iterations: int
) -> None:
    """At 4 iterations explain fits nothing and says how many it needs; from `MIN_CLUSTERS` on it fits, and
    every interval it prints lies inside what its statistic can be (Fisher's z scale, by construction)."""
    # A random answer order and questions of varied lengths, so that the fit has causes it can separate
    # and summarise (in forward order the slot is the position, and one length ties distance to both).
    design = {"answer_order": "random", "answer_mode": "constrained", "varied": True}
    job = make_job(db, batch_sizes=(5, 10), iterations=iterations, shard_size=4, **design)
    _run(db, job.job_id)
    env = {"POSBIAS_DATABASE_URL": database_url, "COLUMNS": "250"}
    as_json = run_cli(["explain", str(job.job_id), "--json"], env=env, folder=tmp_path)
    assert as_json.code == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    found = _explained_intervals(shown)
    if iterations < MIN_CLUSTERS:
        assert found == [] and all(not e["effects"] for e in shown)
        assert all(f"run at least {MIN_CLUSTERS} iterations" in e["verdict"] for e in shown), shown
    else:
        assert found, shown  # it fitted: the answer slot, at least, has intervals
    outside = [(w, lo, hi) for w, lo, hi, most in found if not (-most <= lo <= hi <= most)]
    assert outside == [], outside
    printed = run_cli(["explain", str(job.job_id)], env=env, folder=tmp_path)
    assert printed.code == 0, printed.stderr
    assert "Warning" not in printed.stdout + printed.stderr
    if iterations < MIN_CLUSTERS:
        assert f"too few trials to fit: {iterations} trials" in printed.stdout, printed.stdout[-1500:]


def test_a_parse_collapse_at_the_end_of_the_sheet_fails_the_verdict_and_shows_in_compare(
    db: Database, database_url: str, make_job: Any, answer: Any, tmp_path: Path
) -> None:
    shape = {"batch_sizes": (10,), "iterations": 100, "shard_size": 50, "pool_size": 200}
    base = make_job(db, **shape)
    cand = make_job(db, key="candidate", **shape)
    right = lambda trial, position: (trial + position) % 3 == 0  # noqa: E731
    answer_every_shard(db, base.job_id, answer, correct=right)
    # Positions 9-10 of N = 10 stop parsing: about 9% of their answers parse.
    collapse = lambda trial, position: position >= 9 and trial % 11 != 0  # noqa: E731
    answer_every_shard(db, cand.job_id, answer, correct=right, unparsed=collapse)
    rule = RegressionRule(max_drop=5)
    outcome = verdicts.compare_jobs(db, baseline_job=base.job_id, candidate_job=cand.job_id, rule=rule)
    assert outcome.verdict is Verdict.regression, outcome.reason
    assert (
        "parse rate" in outcome.reason and "positions 9-10" in outcome.reason
    ) or "position 9" in outcome.reason
    # The same collapse in both: nothing regressed, and the pass names what it could not judge.
    both = verdicts.compare_jobs(db, baseline_job=cand.job_id, candidate_job=cand.job_id, rule=rule)
    assert both.verdict is Verdict.passed, both.reason
    assert "could not judge" in both.reason and "positions 9-10" in both.reason, both.reason

    env = {"POSBIAS_DATABASE_URL": database_url, "COLUMNS": "250"}
    shown = run_cli(["compare", str(base.job_id), str(cand.job_id)], env=env, folder=tmp_path)
    assert shown.code == 0, shown.stderr
    assert "parse rate differs at 2 positions" in shown.stdout, shown.stdout[-1500:]
    assert "McNemar p (Holm)" in shown.stdout


def test_explain_names_a_collapse_onto_one_option(sqlite_url: str, make_job: Any, tmp_path: Path) -> None:
    from posbias.service.store import database

    with database.connect(sqlite_url) as db:
        job = make_job(
            db,
            batch_sizes=(10,),
            iterations=60,
            shard_size=60,
            pool_size=200,
            shuffle_choices=True,
            fake={"first": 0.7, "last": 0.7, "collapse": {"option": 4, "positions": [1, 4]}},
        )
        _run(db, job.job_id)
    shown = run_cli(
        ["explain", str(job.job_id)],
        env={"POSBIAS_DATABASE_URL": sqlite_url, "COLUMNS": "250"},
        folder=tmp_path,
    )
    assert shown.code == 0, shown.stderr
    readings = [line for line in shown.stdout.splitlines() if line.startswith("options: ")]
    assert readings == ["options: positions 1-4: a collapse onto option 4"], shown.stdout[-2500:]
