"""Every job a user can make opens in every view (issue 37): a matrix of job shapes against views, on SQLite
and on PostgreSQL.

Each shape (`SHAPES`, `STATES`, the migrated job) is built once per store (the module's `matrix` fixture: one
store, every job submitted, `posbias worker --until-empty`, then the jobs left queued, cancelled, failed
or half done through the queue, and one job written before a downgrade to the oldest revision and migrated
back); each view then runs against it in this process (`tests/support/in_process.py`), as a user runs it.
A cell passes when the view gives an answer, or one line that names why it does not apply, with the
README's exit code (0 or 1; never an internal error, an HTTP 500, a bare exception from Python, or NaN in
JSON), and when its counts agree with `status` and `export` (`n` counts every answer, parsed or not;
explain's `answers` the parsed ones).

The matrix: {shapes} shapes x ({views} views per shape + {store_views} views of every job, run once per
store), plus {pairs} compared pairs x {pair_views} views per pair, on 2 stores: {cells} cells.
`test_the_docstring_states_the_matrix` checks these figures.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from support.in_process import run_cli
from support.postgres import PostgresServer

import posbias
from posbias.schemas import PosbiasError, ShardStatus, WorkerConfig
from posbias.service.settings import Settings
from posbias.service.store import database, migrate
from posbias.service.store.tables import Trial
from posbias.service.work import queue
from posbias.workers.loader import load_engine
from posbias.workers.shard import run_shard

FAKE = {"model": "fake/model", "engine": {"name": "fake"}, "seed": 3, "shard_size": 6}
"""Every shape's base: the fake engine (its accuracy rising from 25% to 55% over the positions)."""
SHAPES: dict[str, dict[str, Any]] = {
    "n1-alone": {"batch_sizes": [1], "iterations": 12},
    "n1-beside": {"batch_sizes": [1, 4], "iterations": 12},
    "n2": {"batch_sizes": [2], "iterations": 12},
    "n3": {"batch_sizes": [3], "iterations": 12},
    "iterations-1": {"batch_sizes": [1, 3], "iterations": 1},
    "iterations-2": {"batch_sizes": [3], "iterations": 2},
    "iterations-4": {"batch_sizes": [2, 4], "iterations": 4},
    "iterations-16": {"batch_sizes": [5], "iterations": 16},
    "reverse": {"batch_sizes": [4], "iterations": 12, "answer_order": "reverse"},
    "random-order": {"batch_sizes": [1, 4], "iterations": 12, "answer_order": "random"},
    "rotation": {"batch_sizes": [3], "iterations": 12, "design": "rotation"},
    "probe": {"batch_sizes": [3], "iterations": 12, "design": "probe"},
    "probe-n1": {"batch_sizes": [1, 2], "iterations": 12, "design": "probe"},
    "filler-end-sweep": {"batch_sizes": [3], "iterations": 12, "filler": {"tokens": [0, 40]}},
    "filler-before": {"batch_sizes": [1, 3], "iterations": 12, "filler": {"tokens": [30], "where": "before"}},
    "filler-after": {
        "batch_sizes": [4],
        "iterations": 12,
        "filler": {"tokens": [0, 30], "where": "after", "position": 2},
    },
    "shuffled": {"batch_sizes": [4], "iterations": 12, "shuffle_choices": True},
    "constrained": {"batch_sizes": [1, 4], "iterations": 12, "answer_mode": "constrained"},
    "combined": {
        "batch_sizes": [1, 3],
        "iterations": 12,
        "design": "rotation",
        "answer_order": "random",
        "answer_mode": "constrained",
        "shuffle_choices": True,
        "filler": {"tokens": [0, 30], "where": "end"},
    },
    "probe-combined": {
        "batch_sizes": [2, 3],
        "iterations": 12,
        "design": "probe",
        "answer_mode": "constrained",
        "shuffle_choices": True,
        "filler": {"tokens": [0, 20], "where": "after", "position": 1},
    },
    "window": {
        "batch_sizes": [1, 4],
        "iterations": 12,
        "answer_order": "random",
        "filler": {"tokens": [0, 60]},
        "fake": {"depends_on": "token-distance", "first": 0.7, "last": 0.3, "window": 120},
    },
    "collapse": {
        "batch_sizes": [4],
        "iterations": 12,
        "shuffle_choices": True,
        "fake": {"collapse": {"option": 4, "positions": [1, 2]}},
    },
    "quick-look": {"batch_sizes": [1, 4], "iterations": 20, "limit": 2},
    "variants": {
        "batch_sizes": [1, 3],
        "iterations": 12,
        "variants": ["baseline", {"name": "late-drop", "fake": {"last": 0.1}}],
    },
    "all-wrong": {"batch_sizes": [1, 2, 3], "iterations": 12, "fake": {"first": 0.0, "last": 0.0}},
    "all-right": {"batch_sizes": [2], "iterations": 12, "fake": {"first": 1.0, "last": 1.0}},
    "parse-none": {"batch_sizes": [1, 3], "iterations": 12, "fake": {"malformed": 1.0}},
    "parse-half": {"batch_sizes": [1, 3], "iterations": 12, "fake": {"malformed": 0.5}},
}
"""Jobs the worker runs to the end."""
STATES: dict[str, dict[str, Any]] = {
    "queued": {"batch_sizes": [1, 4], "iterations": 12},
    "cancelled": {"batch_sizes": [1, 4], "iterations": 12},
    "cancelled-half": {"batch_sizes": [1, 4], "iterations": 12},
    "failed": {"batch_sizes": [1, 4], "iterations": 12},
    "failed-half": {"batch_sizes": [1, 4], "iterations": 12},
    "running-half": {"batch_sizes": [1, 4], "iterations": 12},
}
"""Jobs left unfinished: queued, cancelled (before or halfway), failed (every shard, or half), half done."""
MIGRATED = {"migrated": {"batch_sizes": [1, 4], "iterations": 12}}
"""A job run at the oldest revision's schema's era: written at head, the store taken down to 0001 and up."""
ALL = {**MIGRATED, **SHAPES, **STATES}
PAIRS = [
    ("n1-beside", "constrained"),
    ("n1-beside", "random-order"),
    ("n1-alone", "parse-none"),
    ("n3", "rotation"),
    ("n3", "probe"),
    ("reverse", "shuffled"),
    ("iterations-1", "iterations-2"),
    ("quick-look", "n1-beside"),
    ("variants", "variants:late-drop"),
    ("parse-half", "parse-none"),
    ("all-wrong", "all-right"),
    ("filler-end-sweep", "n3"),
    ("migrated", "n1-beside"),
    ("failed-half", "running-half"),
    ("cancelled", "queued"),
]
"""Compared pairs: `posbias compare` at every batch size both have, the viewer's /compare page, a report of
both."""

CURVE_VIEWS = [(by, "json") for by in ("position", "answer-slot", "token-distance", "filler-length")] + [
    ("position", "table"),
    ("position", "csv"),
]
"""Every axis as JSON (whose counts are checked); the table and CSV by position."""
PLOTS = ("png", "pdf", "svg")
VIEWS = [
    "status-job",
    "status-json",
    *(f"curve-{by}-{fmt}" for by, fmt in CURVE_VIEWS),
    "curve-band",
    "curve-plot",
    "curve-heatmap",
    "explain",
    "explain-json",
    "explain-each-size",
    "trial",
    "trial-json",
    "report",
    "export-csv",
    "export-parquet",
    "viewer-job",
    "viewer-trial-api",
    "python-results",
    "python-trials",
    "python-explain",
    "python-options",
    "python-curves",
]
"""What each shape is shown in. `curve-plot` writes each shape's plot in one of `PLOTS` in turn, with the
band every other shape (so each format is drawn with and without it)."""
STORE_VIEWS = ["status", "viewer-list", "viewer-jobs-api"]
"""Views of every job at once: run once per store, checked for each shape's job."""
PAIR_VIEWS = ["compare", "compare-json", "viewer-compare", "report-two", "python-compare"]


def _docstring_figures() -> dict[str, int]:
    shapes = len(ALL)
    return {
        "shapes": shapes,
        "views": len(VIEWS),
        "pairs": len(PAIRS),
        "pair_views": len(PAIR_VIEWS),
        "store_views": len(STORE_VIEWS),
        "cells": 2 * (shapes * (len(VIEWS) + len(STORE_VIEWS)) + len(PAIRS) * len(PAIR_VIEWS)),
    }


__doc__ = __doc__.format(**_docstring_figures())


# --- building the store -----------------------------------------------------------------------------


@dataclass
class Matrix:
    """One store with every shape in it."""

    url: str
    folder: Path
    mmlu_dir: Path
    jobs: dict[str, int] = field(default_factory=dict)
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(database_url=self.url, mmlu_dir=self.mmlu_dir, cache_dir=self.folder / "cache")

    def cli(self, *args: str) -> Any:
        env = {
            "POSBIAS_DATABASE_URL": self.url,
            "POSBIAS_MMLU_DIR": str(self.mmlu_dir),
            "POSBIAS_CACHE_DIR": str(self.folder / "cache"),
            "POSBIAS_POLL_SECONDS": "0.05",
            "RAY_ADDRESS": "",
            "COLUMNS": "200",
        }
        return run_cli(args, env=env, folder=self.folder)

    def fact(self, job_id: int) -> dict[str, Any]:
        """What `status --json` and `posbias.results` say of a job: the references every view is held to."""
        if job_id not in self.facts:
            status = self.cli("status", str(job_id), "--json")
            assert status.code == 0, status.stderr
            answers = posbias.results(job_id, settings=self.settings)
            self.facts[job_id] = {"status": json.loads(status.stdout), "answers": answers}
        return self.facts[job_id]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mmlu_dir: Path
) -> Iterator[Matrix]:
    """A store holding every shape (see the module's docstring), on each dialect."""
    request.getfixturevalue("ray_session")
    folder = tmp_path_factory.mktemp(f"matrix-{request.param}")
    if request.param == "sqlite":
        yield _build(Matrix(url=f"sqlite:///{folder / 'posbias.db'}", folder=folder, mmlu_dir=mmlu_dir))
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        with server.scratch_database("matrix") as url:
            yield _build(Matrix(url=url, folder=folder, mmlu_dir=mmlu_dir))
    # For a reader to judge that each refusal names the real reason (pytest keeps the folder).
    (folder / "refusals.txt").write_text("\n".join(sorted(set(REFUSALS))) + "\n")


def _submit(m: Matrix, name: str, fields: dict[str, Any]) -> None:
    m.jobs[name] = posbias.submit({**FAKE, **fields}, settings=m.settings).job_id


def _work(m: Matrix) -> None:
    done = m.cli("worker", "--until-empty")
    assert done.code == 0, done.stderr


def _build(m: Matrix) -> Matrix:
    migrate.upgrade(m.url)
    for name, fields in MIGRATED.items():
        _submit(m, name, fields)
    _work(m)
    migrate.downgrade(m.url, "0001")
    migrate.upgrade(m.url)
    for name, fields in SHAPES.items():
        _submit(m, name, fields)
    _work(m)
    for name, fields in STATES.items():
        _submit(m, name, fields)
    with database.connect(m.url) as db:
        held = _leave_unfinished(m, db)
        for name in ("failed", "failed-half"):
            for shard_id in held[name]:
                _kill(db, shard_id, job_id=m.jobs[name])
    return m


OWNER = "matrix"


def _leave_unfinished(m: Matrix, db: database.Database) -> dict[str, list[int]]:
    """Lease every shard of the unfinished shapes, answer half of the half-done ones with the fake engine (as
    a worker would), and cancel the cancelled ones. The shards still held, by shape."""
    held: dict[str, list[int]] = {}
    for name in STATES:
        job_id = m.jobs[name]
        if name == "queued":  # submitted after the worker ran: it waits, as a job nobody has run yet
            continue
        leases = queue.lease(db, owner=OWNER, limit=1000, lease_seconds=3600, job_ids=[job_id])
        if name.endswith("-half"):
            half = len(leases) // 2
            for lease in leases[:half]:
                engine = load_engine(lease.shard, config=WorkerConfig(cache_dir=str(m.folder / "cache")))
                result = run_shard(lease.shard, engine=engine)
                assert queue.complete(db, [result], owner=OWNER)[0].written
            leases = leases[half:]
        held[name] = [lease.shard_id for lease in leases]
        if name.startswith("cancelled"):
            posbias.cancel(job_id, settings=m.settings)
    return held


def _kill(db: database.Database, shard_id: int, *, job_id: int) -> None:
    """Fail a held shard until it is dead (its attempts used up), as an engine that keeps failing does."""
    while queue.fail(db, shard_id, owner=OWNER, error="the engine ran out of memory") is ShardStatus.queued:
        queue.lease(db, owner=OWNER, limit=1000, lease_seconds=3600, job_ids=[job_id])


# --- what every cell must be --------------------------------------------------------------------------


def _no_nan(text: str) -> Any:
    """`text` parsed as JSON, which must hold no NaN or infinity."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in JSON")

    return json.loads(text, parse_constant=refuse)


@dataclass(frozen=True)
class Seen:
    """A view's outcome: its exit code (0 or 1), what it printed, and its refusal's line when it refused."""

    code: int
    stdout: str
    refusal: str | None


REFUSALS: list[str] = []
"""Every refusal the matrix saw (printed at the end, for a reader to judge)."""


def _cli(m: Matrix, *args: str) -> Seen:
    done = m.cli(*args)
    where = f"posbias {' '.join(args)}"
    assert done.code in (0, 1), f"{where} exited {done.code}: {done.stderr[-2000:]}"
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    if done.code == 0:
        assert not any("error" in line.lower() for line in lines), f"{where}: {done.stderr[-2000:]}"
        return Seen(0, done.stdout, None)
    assert len(lines) == 1, f"{where}: not one line: {done.stderr[-2000:]}"
    assert lines[0].startswith("error: "), f"{where}: {lines[0]}"
    assert "internal error" not in lines[0], f"{where}: {lines[0]}"
    REFUSALS.append(f"{where}: {lines[0]}")
    return Seen(1, done.stdout, lines[0])


def _python(call: Callable[[], Any], where: str) -> Any:
    """A public function's answer, or None when it refused with posbias's own one-line error."""
    try:
        return call()
    except PosbiasError as exc:
        assert "\n" not in str(exc), f"{where}: {exc}"
        REFUSALS.append(f"{where}: {type(exc).__name__}: {exc}")
        return None


def _parsed(answers: Any, **where: Any) -> int:
    rows = answers
    for column, value in where.items():
        rows = rows[rows[column] == value]
    return int((rows["parse_status"] == "ok").sum())


def _total(curves: list[dict[str, Any]]) -> int:
    return sum(int(point["n"]) for curve in curves for point in curve["points"])


def _job(m: Matrix, shape: str) -> tuple[int, str | None]:
    """The job of `shape` (`NAME:VARIANT` names a variant) and the variant named."""
    name, _, variant = shape.partition(":")
    return m.jobs[name], variant or None


def _first_trial(m: Matrix, job_id: int) -> int:
    answers = m.fact(job_id)["answers"]
    if len(answers):
        return int(answers["trial_id"].iloc[0])
    with database.connect(m.url) as db, db.read() as session:
        return int(session.scalar(select(Trial.id).where(Trial.job_id == job_id).order_by(Trial.id).limit(1)))


def _has_answers(m: Matrix, job_id: int) -> bool:
    return len(m.fact(job_id)["answers"]) > 0


def _explainable(m: Matrix, job_id: int) -> bool:
    """Whether the job has parsed answers at a batch size with positions to explain."""
    answers = m.fact(job_id)["answers"]
    return bool(((answers["batch_size"] > 1) & (answers["parse_status"] == "ok")).any())


# --- one shape in one view ----------------------------------------------------------------------------


def _view(m: Matrix, shape: str, view: str) -> None:
    job_id, _ = _job(m, shape)
    fact = m.fact(job_id)
    answers = fact["answers"]
    job = str(job_id)
    out = m.folder / f"{shape}-{view}"
    if view == "status-job":
        assert _cli(m, "status", job).code == 0
    elif view == "status-json":
        status = _no_nan(_cli(m, "status", job, "--json").stdout)
        trials = posbias.trials(job_id, settings=m.settings)
        done = trials[trials["status"] == "done"]
        assert status["trials_done"] == len(done)
        per_trial = answers.groupby(["trial_id", "variant"]).size()
        assert len(per_trial) <= len(done)
    elif view.startswith("curve-") and view.split("-")[-1] in ("table", "csv", "json"):
        by, fmt = view.removeprefix("curve-").rsplit("-", 1)
        seen = _cli(m, "curve", "--job", job, "--by", by, "--format", fmt)
        if seen.code == 1:
            assert by == "filler-length" or not _has_answers(m, job_id), seen.refusal
            return
        if fmt == "json":
            curves = _no_nan(seen.stdout)
            counted = answers if by != "token-distance" else answers[answers["token_distance"].notna()]
            if by == "filler-length":
                counted = answers
            assert _total(curves) == len(counted), (view, _total(curves), len(counted))
            for point in (p for c in curves for p in c["points"] if p["accuracy"] is not None):
                assert point["ci_low"] <= point["accuracy"] <= point["ci_high"], (view, point)
        elif fmt == "csv":
            lines = [line for line in seen.stdout.splitlines() if line.strip()]
            header = lines[0].split(",")
            n = header.index("n")
            assert sum(int(line.split(",")[n]) for line in lines[1:]) >= 0
            assert "nan" not in seen.stdout.lower().split(",")
    elif view == "curve-band":
        _cli(m, "curve", "--job", job, "--band")
    elif view == "curve-plot":
        turn = list(ALL).index(shape)
        path = out.with_suffix(f".{PLOTS[turn % len(PLOTS)]}")
        extra = ["--band"] if turn % 2 else []
        seen = _cli(m, "curve", "--job", job, "--plot", str(path), *extra)
        assert (seen.code == 0) == path.is_file(), seen.refusal
        assert seen.code == 0 or not _has_answers(m, job_id), seen.refusal
    elif view == "curve-heatmap":
        path = out.with_suffix(".png")
        seen = _cli(m, "curve", "--job", job, "--heatmap", str(path))
        assert (seen.code == 0) == path.is_file(), seen.refusal
    elif view == "explain":
        seen = _cli(m, "explain", job)
        if _explainable(m, job_id):
            assert seen.code == 0, seen.refusal
        elif _has_answers(m, job_id) and set(answers["batch_size"]) == {1}:
            assert seen.refusal is not None and "batch size 1" in seen.refusal
    elif view == "explain-json":
        seen = _cli(m, "explain", job, "--json")
        if seen.code == 0:
            for explanation in _no_nan(seen.stdout):
                n = explanation["batch_size"]
                assert n > 1
                assert explanation["answers"] == _parsed(answers, batch_size=n, variant="baseline"), n
                assert explanation["trials"] <= fact["status"]["trials_done"]
        else:
            assert not _explainable(m, job_id), seen.refusal
    elif view == "explain-each-size":
        for n in fact["status"]["batch_sizes"]:
            seen = _cli(m, "explain", job, "--batch-size", str(n), "--json")
            if seen.code == 0:
                assert n > 1 and len(_no_nan(seen.stdout)) == 1
            elif n == 1 and _has_answers(m, job_id):
                assert seen.refusal is not None and "batch size 1" in seen.refusal, seen.refusal
    elif view in ("trial", "trial-json"):
        trial = str(_first_trial(m, job_id))
        seen = _cli(m, "trial", job, trial, *(["--json"] if view == "trial-json" else []))
        if view == "trial-json" and seen.code == 0:
            shown = _no_nan(seen.stdout)
            mine = answers[(answers["trial_id"] == int(trial)) & (answers["variant"] == shown["variant"])]
            assert len(shown["answers"]) == len(mine)
    elif view == "report":
        path = out.with_suffix(".html")
        seen = _cli(m, "report", job, "--out", str(path))
        assert seen.code == 0, seen.refusal  # a report shows any job, whatever is missing
        assert "internal error" not in path.read_text()
    elif view in ("export-csv", "export-parquet"):
        kind = view.removeprefix("export-")
        path = out.with_suffix(f".{kind}")
        seen = _cli(m, "export", job, "--out", str(path))
        if seen.code == 0:
            import pandas as pd

            table = pd.read_csv(path) if kind == "csv" else pd.read_parquet(path)
            assert len(table) == len(answers)
        else:
            assert not _has_answers(m, job_id), seen.refusal
    elif view.startswith("viewer-"):
        _viewer(m, shape, view)
    elif view == "python-results":
        assert int((answers["parse_status"] == "ok").sum()) == int(answers["parse_status"].eq("ok").sum())
        assert fact["status"]["trials_done"] >= answers["trial_id"].nunique()
    elif view == "python-trials":
        trials = _python(lambda: posbias.trials(job_id, settings=m.settings), view)
        assert trials is not None and int(trials["status"].eq("done").sum()) == fact["status"]["trials_done"]
    elif view == "python-explain":
        found = _python(lambda: posbias.explain([job_id], settings=m.settings), view)
        if _explainable(m, job_id):
            assert found, "explain refused a job with positions to explain"
        for explanation in found or []:
            n = explanation.batch_size
            assert explanation.answers == _parsed(answers, batch_size=n, variant="baseline")
    elif view == "python-options":
        found = _python(lambda: posbias.options_by_position(job_id, settings=m.settings), view)
        for table in found or []:
            _no_nan(json.dumps(table.model_dump(mode="json")))
    elif view == "python-curves":
        found = _python(lambda: posbias.curves(job_id, settings=m.settings), view)
        if found is not None:
            assert sum(p.n for c in found for p in c.points) == len(answers)
        else:
            assert not _has_answers(m, job_id)
    else:
        raise AssertionError(f"no view {view}")


def _viewer(m: Matrix, shape: str, view: str) -> None:
    from posbias.service.reports.viewer import Viewer, open_read_only

    job_id, _ = _job(m, shape)
    targets = {
        "viewer-job": f"/job/{job_id}",
        "viewer-trial-api": f"/api/trial/{job_id}/{_first_trial(m, job_id)}",
    }
    with Viewer(open_read_only(m.url), cache_dir=m.folder / "cache") as viewer:
        status, kind, body = viewer.route(targets[view])
    text = body.decode()
    assert status == 200, (view, status, text[-500:])
    if kind == "application/json":
        _no_nan(text)


def _pair(m: Matrix, a: str, b: str, view: str) -> None:
    job_a, variant_a = _job(m, a)
    job_b, variant_b = _job(m, b)
    side_a = f"{job_a}:{variant_a or 'baseline'}" if variant_b else str(job_a)
    side_b = f"{job_b}:{variant_b}" if variant_b else str(job_b)
    sizes = sorted(set(m.fact(job_a)["status"]["batch_sizes"]) & set(m.fact(job_b)["status"]["batch_sizes"]))
    out = m.folder / f"{a}-{b}-{view}".replace(":", "_")
    if view in ("compare", "compare-json"):
        for n in sizes:
            args = ["compare", side_a, side_b, "--batch-size", str(n)]
            seen = _cli(m, *args, *(["--json"] if view == "compare-json" else []))
            if seen.code == 0 and view == "compare-json":
                _no_nan(seen.stdout)
    elif view == "viewer-compare":
        from posbias.service.reports.viewer import Viewer, open_read_only

        with Viewer(open_read_only(m.url), cache_dir=m.folder / "cache") as viewer:
            status, _, body = viewer.route(f"/compare?a={job_a}&b={job_b}")
        assert status == 200, (status, body.decode()[-500:])
    elif view == "report-two":
        seen = _cli(m, "report", str(job_a), str(job_b), "--out", str(out.with_suffix(".html")))
        assert seen.code == 0 or job_a == job_b, seen.refusal
    elif view == "python-compare":
        for n in sizes:
            found = _python(
                lambda n=n: posbias.compare(side_a, side_b, batch_size=n, settings=m.settings), view
            )
            if found is not None:
                _no_nan(json.dumps(found.model_dump(mode="json")))


# --- the matrix ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("shape", list(ALL))
def test_every_shape_opens_in_every_view(matrix: Matrix, shape: str, view: str) -> None:
    before = len(REFUSALS)
    _view(matrix, shape, view)
    status = matrix.fact(matrix.jobs[shape])["status"]["status"]
    for refusal in REFUSALS[before:]:  # a missing result's fix follows where the job stands
        if "no results" in refusal:
            assert FIXES[status] in refusal, (status, refusal)


FIXES = {
    "queued": "posbias worker",
    "running": "posbias worker",
    "cancelled": "was cancelled",
    "failed": "posbias retry",
    "done": "posbias status",
}
"""What a refusal for missing results must say to do, by the job's status."""


@pytest.mark.parametrize("view", PAIR_VIEWS)
@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_every_pair_compares(matrix: Matrix, a: str, b: str, view: str) -> None:
    _pair(matrix, a, b, view)


@pytest.mark.parametrize("view", STORE_VIEWS)
def test_every_job_is_listed(matrix: Matrix, view: str) -> None:
    from posbias.service.reports.viewer import Viewer, open_read_only

    if view == "status":
        listed = _no_nan(_cli(matrix, "status", "--json", "--limit", "1000").stdout)
    else:
        with Viewer(open_read_only(matrix.url), cache_dir=matrix.folder / "cache") as viewer:
            status, _, body = viewer.route("/" if view == "viewer-list" else "/api/jobs")
        assert status == 200, body.decode()[-500:]
        if view == "viewer-list":
            return
        listed = _no_nan(body.decode())
    shown = {job["id"]: job for job in listed}
    for name, job_id in matrix.jobs.items():
        assert shown[job_id]["trials_done"] == matrix.fact(job_id)["status"]["trials_done"], name


def test_the_docstring_states_the_matrix() -> None:
    figures = _docstring_figures()
    assert f"{figures['cells']} cells" in (__doc__ or "")
    per_store = len(ALL) * (len(VIEWS) + len(STORE_VIEWS)) + len(PAIRS) * len(PAIR_VIEWS)
    assert figures["cells"] == 2 * per_store


def test_the_states_are_what_they_say(matrix: Matrix) -> None:
    status = {name: matrix.fact(matrix.jobs[name])["status"]["status"] for name in ALL}
    assert status["queued"] == "queued"
    assert status["cancelled"] == status["cancelled-half"] == "cancelled"
    assert status["failed"] == status["failed-half"] == "failed"
    assert status["running-half"] == "running"
    assert {status[name] for name in (*SHAPES, *MIGRATED)} == {"done"}
    assert matrix.fact(matrix.jobs["cancelled-half"])["status"]["trials_done"] > 0
    assert matrix.fact(matrix.jobs["failed-half"])["status"]["trials_done"] > 0
