"""The cells of a view matrix (issue 37): one job in one view, two jobs compared, every job listed, each held
to what a user would check. The fake engine's matrix (tests/e2e/test_view_matrix.py) and the engines' matrices
(tests/integration/engine/test_hf_view_matrix.py, test_served_view_matrix.py) run these same cells.

A cell passes when the view gives an answer, or one line that names why it does not apply, with the README's
exit code (0 or 1; never an internal error, an HTTP 500, a bare exception from Python, or NaN in JSON), and
when its counts agree with `status` and `export` (`n` counts every answer, parsed or not; explain's `answers`
the parsed ones). A refusal for missing results says what to do about them (`FIXES`).

Every view runs in this process (`support.in_process`), as a user runs it, against a `Store`: one database
whose jobs the matrix named.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select, text

import posbias
from posbias.schemas import PosbiasError
from posbias.service.settings import Settings
from posbias.service.store import database
from posbias.service.store.tables import Trial
from support.in_process import run_cli

CURVE_AXES = ("position", "answer-slot", "token-distance", "rope-distance", "filler-length")
CURVE_VIEWS = [(by, "json") for by in CURVE_AXES] + [
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
    "python-columns",
]
"""What each job is shown in. `curve-plot` writes each job's plot in one of `PLOTS` in turn (by the order the
store's jobs were submitted in), with the band every other job (so each format is drawn with and without
it)."""
STORE_VIEWS = ["status", "viewer-list", "viewer-jobs-api"]
"""Views of every job at once: run once per store, checked for each job."""
PAIR_VIEWS = ["compare", "compare-json", "viewer-compare", "report-two", "python-compare"]
"""What two jobs are shown in together: `posbias compare` at every batch size both have, the viewer's
/compare page, a report of both, `posbias.compare`."""
ATTENTION_VIEWS = [
    "attention-position-json",
    "attention-token-distance-json",
    "attention-position-table",
    "attention-token-distance-csv",
    "attention-plot",
    "attention-explain",
    "attention-report",
    "python-attention-curves",
    "python-attention-explanations",
]
"""The attention evidence of an `hf` job (docs/attention.md): `curve --metric attention` by each axis it
takes, as JSON (whose counts are checked), a table, CSV and a plot; explain's attention section; the
report's; and the same from Python. A job without attention rows refuses each in one line (explain and the
report leave the section out)."""

FIXES = {
    "queued": "posbias worker",
    "running": "posbias worker",
    "cancelled": "was cancelled",
    "failed": "posbias retry",
    "done": "posbias status",
}
"""What a refusal for missing results must say to do, by the job's status."""

REFUSALS: list[str] = []
"""Every refusal the cells saw (a matrix writes them out, for a reader to judge)."""


@dataclass
class Store:
    """One store and the jobs a matrix put in it, by name."""

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

    def submit(self, name: str, spec: dict[str, Any]) -> None:
        """Submit `spec` as the job called `name`."""
        self.jobs[name] = posbias.submit(spec, settings=self.settings).job_id

    def work(self) -> None:
        """`posbias worker --until-empty`: every job submitted so far run to its end."""
        done = self.cli("worker", "--until-empty")
        assert done.code == 0, done.stderr

    def fact(self, job_id: int) -> dict[str, Any]:
        """What `status --json` and `posbias.results` say of a job: the references every view is held to."""
        if job_id not in self.facts:
            status = self.cli("status", str(job_id), "--json")
            assert status.code == 0, status.stderr
            answers = posbias.results(job_id, settings=self.settings)
            self.facts[job_id] = {"status": json.loads(status.stdout), "answers": answers}
        return self.facts[job_id]

    def write_refusals(self) -> None:
        """Every refusal seen, in the store's folder (pytest keeps it), for a reader to judge that each names
        the real reason."""
        (self.folder / "refusals.txt").write_text("\n".join(sorted(set(REFUSALS))) + "\n")


# --- what every cell must be --------------------------------------------------------------------------


def no_nan(text: str) -> Any:
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


def cli(m: Store, *args: str) -> Seen:
    """`posbias ARGS`, which must answer (exit 0, no error line) or refuse in one `error:` line (exit 1)."""
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


def python(call: Callable[[], Any], where: str) -> Any:
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


def _job(m: Store, name: str) -> tuple[int, str | None]:
    """The job called `name` (`NAME:VARIANT` names a variant) and the variant named."""
    job, _, variant = name.partition(":")
    return m.jobs[job], variant or None


def _first_trial(m: Store, job_id: int) -> int:
    answers = m.fact(job_id)["answers"]
    if len(answers):
        return int(answers["trial_id"].iloc[0])
    with database.connect(m.url) as db, db.read() as session:
        return int(session.scalar(select(Trial.id).where(Trial.job_id == job_id).order_by(Trial.id).limit(1)))


def _has_answers(m: Store, job_id: int) -> bool:
    return len(m.fact(job_id)["answers"]) > 0


def _explainable(m: Store, job_id: int) -> bool:
    """Whether the job has parsed answers at a batch size with positions to explain."""
    answers = m.fact(job_id)["answers"]
    return bool(((answers["batch_size"] > 1) & (answers["parse_status"] == "ok")).any())


def _report_data(page: str) -> Any:
    """The data a report page (a file, or the viewer's) carries, which must hold no NaN."""
    start = page.index('<script id="posbias-data" type="application/json">')
    body = page[page.index(">", start) + 1 : page.index("</script>", start)]
    return no_nan(body)


# --- the cells ----------------------------------------------------------------------------------------


def view(m: Store, name: str, view: str) -> None:
    """The job called `name` in `view` (one of `VIEWS`); a refusal for missing results says what to do."""
    before = len(REFUSALS)
    _view(m, name, view)
    status = m.fact(m.jobs[name])["status"]["status"]
    for refusal in REFUSALS[before:]:  # a missing result's fix follows where the job stands
        if "no results" in refusal:
            assert FIXES[status] in refusal, (status, refusal)


def _view(m: Store, name: str, view: str) -> None:
    job_id, _ = _job(m, name)
    fact = m.fact(job_id)
    answers = fact["answers"]
    job = str(job_id)
    out = m.folder / f"{name}-{view}"
    if view == "status-job":
        assert cli(m, "status", job).code == 0
    elif view == "status-json":
        status = no_nan(cli(m, "status", job, "--json").stdout)
        trials = posbias.trials(job_id, settings=m.settings)
        done = trials[trials["status"] == "done"]
        assert status["trials_done"] == len(done)
        per_trial = answers.groupby(["trial_id", "variant"]).size()
        assert len(per_trial) <= len(done)
    elif view.startswith("curve-") and view.split("-")[-1] in ("table", "csv", "json"):
        by, fmt = view.removeprefix("curve-").rsplit("-", 1)
        seen = cli(m, "curve", "--job", job, "--by", by, "--format", fmt)
        if seen.code == 1:
            assert by == "filler-length" or not _has_answers(m, job_id), seen.refusal
            return
        if fmt == "json":
            curves = no_nan(seen.stdout)
            distance = by in ("token-distance", "rope-distance")
            counted = answers[answers["token_distance"].notna()] if distance else answers
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
        cli(m, "curve", "--job", job, "--band")
    elif view == "curve-plot":
        turn = list(m.jobs).index(name)
        path = out.with_suffix(f".{PLOTS[turn % len(PLOTS)]}")
        extra = ["--band"] if turn % 2 else []
        seen = cli(m, "curve", "--job", job, "--plot", str(path), *extra)
        assert (seen.code == 0) == path.is_file(), seen.refusal
        assert seen.code == 0 or not _has_answers(m, job_id), seen.refusal
    elif view == "curve-heatmap":
        path = out.with_suffix(".png")
        seen = cli(m, "curve", "--job", job, "--heatmap", str(path))
        assert (seen.code == 0) == path.is_file(), seen.refusal
    elif view == "explain":
        seen = cli(m, "explain", job)
        if _explainable(m, job_id):
            assert seen.code == 0, seen.refusal
        elif _has_answers(m, job_id) and set(answers["batch_size"]) == {1}:
            assert seen.refusal is not None and "batch size 1" in seen.refusal
    elif view == "explain-json":
        seen = cli(m, "explain", job, "--json")
        if seen.code == 0:
            for explanation in no_nan(seen.stdout):
                n = explanation["batch_size"]
                assert n > 1
                assert explanation["answers"] == _parsed(answers, batch_size=n, variant="baseline"), n
                assert explanation["trials"] <= fact["status"]["trials_done"]
        else:
            assert not _explainable(m, job_id), seen.refusal
    elif view == "explain-each-size":
        for n in fact["status"]["batch_sizes"]:
            seen = cli(m, "explain", job, "--batch-size", str(n), "--json")
            if seen.code == 0:
                assert n > 1 and len(no_nan(seen.stdout)) == 1
            elif n == 1 and _has_answers(m, job_id):
                assert seen.refusal is not None and "batch size 1" in seen.refusal, seen.refusal
    elif view in ("trial", "trial-json"):
        trial = str(_first_trial(m, job_id))
        seen = cli(m, "trial", job, trial, *(["--json"] if view == "trial-json" else []))
        if view == "trial-json" and seen.code == 0:
            shown = no_nan(seen.stdout)
            mine = answers[(answers["trial_id"] == int(trial)) & (answers["variant"] == shown["variant"])]
            assert len(shown["answers"]) == len(mine)
    elif view == "report":
        path = out.with_suffix(".html")
        seen = cli(m, "report", job, "--out", str(path))
        assert seen.code == 0, seen.refusal  # a report shows any job, whatever is missing
        page = path.read_text()
        assert "internal error" not in page
        _report_data(page)
    elif view in ("export-csv", "export-parquet"):
        kind = view.removeprefix("export-")
        path = out.with_suffix(f".{kind}")
        seen = cli(m, "export", job, "--out", str(path))
        if seen.code == 0:
            import pandas as pd

            table = pd.read_csv(path) if kind == "csv" else pd.read_parquet(path)
            assert len(table) == len(answers)
            _same_export(m, job_id, path)
        else:
            assert not _has_answers(m, job_id), seen.refusal
    elif view.startswith("viewer-"):
        _viewer(m, name, view)
    elif view == "python-results":
        assert int((answers["parse_status"] == "ok").sum()) == int(answers["parse_status"].eq("ok").sum())
        assert fact["status"]["trials_done"] >= answers["trial_id"].nunique()
    elif view == "python-trials":
        trials = python(lambda: posbias.trials(job_id, settings=m.settings), view)
        assert trials is not None and int(trials["status"].eq("done").sum()) == fact["status"]["trials_done"]
    elif view == "python-explain":
        found = python(lambda: posbias.explain([job_id], settings=m.settings), view)
        if _explainable(m, job_id):
            assert found, "explain refused a job with positions to explain"
        for explanation in found or []:
            n = explanation.batch_size
            assert explanation.answers == _parsed(answers, batch_size=n, variant="baseline")
    elif view == "python-options":
        found = python(lambda: posbias.options_by_position(job_id, settings=m.settings), view)
        for table in found or []:
            no_nan(json.dumps(table.model_dump(mode="json")))
    elif view == "python-curves":
        found = python(lambda: posbias.curves(job_id, settings=m.settings), view)
        if found is not None:
            assert sum(p.n for c in found for p in c.points) == len(answers)
        else:
            assert not _has_answers(m, job_id)
    elif view == "python-columns":
        _same_columns(m, job_id)
    else:
        raise AssertionError(f"no view {view}")


def _same_export(m: Store, job_id: int, path: Path) -> None:
    """The export (read as columns) is the row-by-row export's (`support.reference_export`): its CSV byte
    for byte, its Parquet table value for value."""
    import pyarrow.parquet as pq

    from support.reference_export import reference_csv, reference_table

    db = database.connect(m.url, read_only=True)
    try:
        if path.suffix == ".csv":
            assert path.read_bytes() == reference_csv(db, job_id)
        else:
            assert pq.read_table(path).equals(reference_table(db, job_id))
    finally:
        db.close()


def _same_columns(m: Store, job_id: int) -> None:
    """The answers as every analysis reads them (columns: by ADBC, and by SQLAlchemy where no driver is
    installed) are `TrialData.pool`'s over the store's rows (`reference_trial_data`), at every batch size
    and variant."""
    import numpy as np

    from posbias.service.stats import options, queries
    from posbias.service.store import columns
    from support.reference_rows import reference_options, reference_trial_data

    db = database.connect(m.url, read_only=True)
    try:
        with db.read() as session:
            found = session.execute(
                select(Trial.batch_size, Trial.variant).where(Trial.job_id == job_id).distinct()
            ).all()
        for batch_size, variant in found:
            expected = reference_trial_data(db, job_ids=[job_id], batch_size=batch_size, variant=variant)
            adbc = queries.trial_data(db, job_ids=[job_id], batch_size=batch_size, variant=variant)
            original = columns.adbc_connection
            columns.adbc_connection = lambda _db: None  # type: ignore[assignment]
            try:
                plain = queries.trial_data(db, job_ids=[job_id], batch_size=batch_size, variant=variant)
            finally:
                columns.adbc_connection = original  # type: ignore[assignment]
            for got in (adbc, plain):
                assert_same_data(got, expected)
            read = options.load(db, job_ids=[job_id], batch_size=batch_size, variant=variant)
            want = reference_options(db, job_ids=[job_id], batch_size=batch_size, variant=variant)
            for name in ("gold", "predicted", "probs", "shuffled", "cluster"):
                assert np.array_equal(getattr(read, name), getattr(want, name), equal_nan=True), name
    finally:
        db.close()


def assert_same_data(got: Any, expected: Any) -> None:
    """Two `TrialData` hold the same answers in the same trials and clusters (question codes may be numbered
    differently: they must map one to one where there are answers)."""
    import numpy as np

    for name in (
        "correct",
        "parsed",
        "answered",
        "gold_prob",
        "slot",
        "distance",
        "filler",
        "lines",
        "cluster",
    ):
        a, b = getattr(got, name), getattr(expected, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert np.array_equal(a, b, equal_nan=True), name
    assert (got.batch_size, got.jobs, got.duplicates) == (
        expected.batch_size,
        expected.jobs,
        expected.duplicates,
    )
    assert got.cluster_unit == expected.cluster_unit
    assert (got.chance is None) == (expected.chance is None)
    if got.chance is not None:
        assert abs(got.chance - expected.chance) < 1e-12
    mask = got.answered > 0
    pairs = set(zip(got.questions[mask].tolist(), expected.questions[mask].tolist(), strict=True))
    assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})
    assert len(got.keys) == len(expected.keys) and len(set(got.keys)) == len(set(expected.keys))


def _viewer(m: Store, name: str, view: str) -> None:
    from posbias.service.reports.viewer import Viewer, open_read_only

    job_id, _ = _job(m, name)
    targets = {
        "viewer-job": f"/job/{job_id}",
        "viewer-trial-api": f"/api/trial/{job_id}/{_first_trial(m, job_id)}",
    }
    with Viewer(open_read_only(m.url), cache_dir=m.folder / "cache") as viewer:
        status, kind, body = viewer.route(targets[view])
    page = body.decode()
    assert status == 200, (view, status, page[-500:])
    if kind == "application/json":
        no_nan(page)
    elif view == "viewer-job":
        _report_data(page)


def pair(m: Store, a: str, b: str, view: str) -> None:
    """Jobs `a` and `b` (`NAME:VARIANT` names a variant) together in `view` (one of `PAIR_VIEWS`)."""
    job_a, variant_a = _job(m, a)
    job_b, variant_b = _job(m, b)
    side_a = f"{job_a}:{variant_a or 'baseline'}" if variant_b else str(job_a)
    side_b = f"{job_b}:{variant_b}" if variant_b else str(job_b)
    sizes = sorted(set(m.fact(job_a)["status"]["batch_sizes"]) & set(m.fact(job_b)["status"]["batch_sizes"]))
    out = m.folder / f"{a}-{b}-{view}".replace(":", "_")
    if view in ("compare", "compare-json"):
        for n in sizes:
            args = ["compare", side_a, side_b, "--batch-size", str(n)]
            seen = cli(m, *args, *(["--json"] if view == "compare-json" else []))
            if seen.code == 0 and view == "compare-json":
                no_nan(seen.stdout)
    elif view == "viewer-compare":
        from posbias.service.reports.viewer import Viewer, open_read_only

        with Viewer(open_read_only(m.url), cache_dir=m.folder / "cache") as viewer:
            status, _, body = viewer.route(f"/compare?a={job_a}&b={job_b}")
        assert status == 200, (status, body.decode()[-500:])
    elif view == "report-two":
        seen = cli(m, "report", str(job_a), str(job_b), "--out", str(out.with_suffix(".html")))
        assert seen.code == 0 or job_a == job_b, seen.refusal
    elif view == "python-compare":
        for n in sizes:
            found = python(
                lambda n=n: posbias.compare(side_a, side_b, batch_size=n, settings=m.settings), view
            )
            if found is not None:
                no_nan(json.dumps(found.model_dump(mode="json")))
    else:
        raise AssertionError(f"no pair view {view}")


def listed(m: Store, view: str) -> None:
    """Every job of the store in `view` (one of `STORE_VIEWS`), each with the trials `status` counts."""
    from posbias.service.reports.viewer import Viewer, open_read_only

    if view == "status":
        shown = no_nan(cli(m, "status", "--json", "--limit", "1000").stdout)
    else:
        with Viewer(open_read_only(m.url), cache_dir=m.folder / "cache") as viewer:
            status, _, body = viewer.route("/" if view == "viewer-list" else "/api/jobs")
        assert status == 200, body.decode()[-500:]
        if view == "viewer-list":
            return
        shown = no_nan(body.decode())
    by_id = {job["id"]: job for job in shown}
    for name, job_id in m.jobs.items():
        assert by_id[job_id]["trials_done"] == m.fact(job_id)["status"]["trials_done"], name


def _layers(m: Store, job_id: int) -> dict[tuple[str, str], int]:
    """How many layers of each kind each variant of an `hf` job was built with, as its canary stored them."""
    with database.connect(m.url) as db, db.read() as session:
        rows = session.execute(
            text(
                "SELECT variant, kind, count(*) FROM attention_layers WHERE job_id = :j "
                "GROUP BY variant, kind"
            ),
            {"j": job_id},
        ).all()
    return {(variant, kind): int(count) for variant, kind, count in rows}


def attention(m: Store, name: str, view: str) -> None:
    """The job called `name` in `view` (one of `ATTENTION_VIEWS`): an `hf` job's attention evidence, or one
    line saying there is none. A curve's `n` counts (trial, layer) rows: every answer `export` has, times the
    layers of the curve's kind its canary stored."""
    job_id, _ = _job(m, name)
    layers = _layers(m, job_id)
    recorded = bool(layers)
    answers = m.fact(job_id)["answers"]
    job = str(job_id)
    out = m.folder / f"{name}-{view}"
    if view.startswith("attention-") and view.split("-")[-1] in ("json", "table", "csv"):
        by, fmt = view.removeprefix("attention-").rsplit("-", 1)
        seen = cli(m, "curve", "--metric", "attention", "--job", job, "--by", by, "--format", fmt)
        assert (seen.code == 0) == recorded, seen.refusal
        if seen.code == 0 and fmt == "json":
            counted: dict[tuple[str, str], int] = {}
            for curve in no_nan(seen.stdout):
                assert curve["by"] == by and curve["job_id"] == job_id
                rows = answers[
                    (answers["batch_size"] == curve["batch_size"]) & (answers["variant"] == curve["variant"])
                ]
                kind = (curve["variant"], curve["layer_kind"])
                assert sum(p["n"] for p in curve["points"]) == len(rows) * layers[kind], (view, curve)
                counted[kind] = counted.get(kind, 0) + sum(p["n"] for p in curve["points"])
            assert sum(counted.values()) == len(answers) * sum(layers.values())
    elif view == "attention-plot":
        path = out.with_suffix(".svg")
        seen = cli(m, "curve", "--metric", "attention", "--job", job, "--plot", str(path))
        assert (seen.code == 0) == recorded == path.is_file(), seen.refusal
    elif view == "attention-explain":
        seen = cli(m, "explain", job)
        assert seen.code == 0 or not _explainable(m, job_id), seen.refusal
        if seen.code == 0:
            said = " ".join(seen.stdout.split())  # a table's title wraps at its width
            assert (f"(hf job {job_id}," in said) == recorded, seen.stdout[-2000:]
    elif view == "attention-report":
        path = out.with_suffix(".html")
        assert cli(m, "report", job, "--out", str(path)).code == 0
        data = _report_data(path.read_text())
        [shown] = data["jobs"]
        assert (shown["attention"] is not None) == recorded, shown["missing"]
    elif view == "python-attention-curves":
        found = python(lambda: posbias.attention_curves(job_id, settings=m.settings), view)
        assert (found is not None) == recorded
        for curve in found or []:
            no_nan(json.dumps(curve.model_dump(mode="json")))
    elif view == "python-attention-explanations":
        found = python(lambda: posbias.attention_explanations(job_id, settings=m.settings), view)
        assert (found is not None) == recorded
        for explanation in found or []:
            no_nan(json.dumps(explanation.model_dump(mode="json")))
    else:
        raise AssertionError(f"no attention view {view}")
