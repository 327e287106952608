"""The report file and the viewer, looked at in a real headless chromium (tests/support/browser.py) on
jobs the fake engine answered, on SQLite and PostgreSQL: the pages load with no console error and ask
nothing of any other machine; a point opens its trials and a trial its prompt and output; the variant and
band toggles change what is drawn; the viewer writes nothing. Screenshots go to build/screenshots/."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from support import browser as chromium
from support.in_process import run_cli

import posbias
from posbias.schemas.schedule import RegressionRule
from posbias.service import scheduler, schedules
from posbias.service.checkpoints import FolderSource
from posbias.service.database import Database
from posbias.service.settings import Settings
from posbias.service.tables import Job, Result, Shard, Trial

pytestmark = pytest.mark.skipif(chromium.missing() is not None, reason=chromium.missing() or "")

VARIANTS = {"variants": ["baseline", {"name": "late-rise", "fake": {"last": 0.95}}]}
SWEEP = {**VARIANTS, "answer_order": "random", "filler": {"tokens": [0, 120], "where": "end"}}


@pytest.fixture(scope="module")
def page() -> Iterator[chromium.Browser]:
    """One browser for the module's tests."""
    with chromium.browser() as opened:
        yield opened


def _dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def _point_n(page: chromium.Browser, css: str) -> int:
    """The n a chart point's tooltip gives."""
    title = page.driver.execute_script(
        "return document.querySelector(arguments[0]).textContent", f"{css} title"
    )
    found = re.search(r"\(n = (\d+)\)", title)
    assert found, title
    return int(found[1])


def _opens_its_trials(page: chromium.Browser, point: str, *, batch_size: int) -> None:
    """Clicking `point` lists one trial per answer at it; the first opens with its prompt and output."""
    n = _point_n(page, point)
    page.click(point)
    page.wait_for("#point-trials .trial-link")
    assert page.count("#point-trials .trial-link") == n
    page.click("#point-trials .trial-link")
    page.wait_for("#trial pre.prompt")
    assert page.count("#trial .prompt .question") == batch_size  # every question's span outlined
    assert page.count("#trial .answers-table tbody tr") == batch_size
    output = page.driver.execute_script("return document.querySelector('#trial pre.output').textContent")
    assert re.search(r"^\d+\. [1-4]$", output, re.MULTILINE), output  # the raw output, constrained lines


def test_the_report_file_draws_every_view_offline(
    page: chromium.Browser, db: Database, database_url: str, tmp_path: Path
) -> None:
    sweep = chromium.run_fake_job(db, SWEEP)
    other = chromium.run_fake_job(db, {"seed": 1})
    out = tmp_path / "report.html"
    done = run_cli(
        ["report", str(sweep), str(other), "--out", str(out)],
        env={"POSBIAS_DATABASE_URL": database_url, "POSBIAS_CACHE_DIR": str(tmp_path / "cache")},
        folder=tmp_path,
    )
    assert done.code == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    html = out.read_text()
    assert "\\u003c/script\\u003e" in html and "<b>bold" not in html  # questions' markup, as data

    page.load(out.as_uri())
    assert page.console_errors() == []
    assert page.leaving() == set()
    # Every view the sweep's design has: answer slot (random order), token distance, filler, heatmap,
    # explain; and the comparison of the two jobs.
    for axis in ("position", "answer-slot", "token-distance", "filler-length"):
        assert page.count(f"#job-{sweep} svg.chart[data-axis='{axis}']") > 0, axis
    assert page.count(f"#job-{sweep} svg.heatmap") == 2  # one per variant at N = 4
    assert page.count(f"#job-{sweep} table.explain-table") == 2
    assert page.count("#comparison svg.chart") == 1

    # The band toggle: pointwise intervals shaded first, then the simultaneous band instead.
    pointwise = page.count("polygon.shade.pointwise")
    assert pointwise > 0 and page.count("polygon.shade.band") == 0
    page.click("input[name=shade][value=band]")
    assert page.count("polygon.shade.pointwise") == 0
    assert page.count("polygon.shade.band") > 0
    # The variant toggle: the second variant's points go, the baseline's stay.
    late = "circle.point[data-variant='late-rise']"
    baseline = page.count("circle.point[data-variant='baseline']")
    assert page.count(late) > 0
    page.click("#variant-toggle input[value='late-rise']")
    assert page.count(late) == 0
    assert page.count("circle.point[data-variant='baseline']") == baseline
    page.click("#variant-toggle input[value='late-rise']")
    assert page.count(late) > 0
    page.screenshot(f"report-{_dialect(database_url)}")

    # A point by position (filler 120, position 2) and one by token distance lead to their trials.
    _opens_its_trials(
        page,
        f"#job-{sweep} circle.point[data-axis='position'][data-filler='120'][data-pos='2']",
        batch_size=4,
    )
    page.screenshot(f"report-trial-{_dialect(database_url)}")
    _opens_its_trials(page, f"#job-{sweep} circle.point[data-axis='token-distance']", batch_size=4)
    assert page.count("b") == 0  # markup in a question is shown as text
    assert page.console_errors() == []
    assert page.leaving() == set()


def _state(db: Database) -> list[Any]:
    """What a write would change: every job's status and progress, every shard's, the result count."""
    with db.read() as session:
        return [
            session.execute(select(Job.id, Job.status, Job.finished_at).order_by(Job.id)).all(),
            session.execute(select(Shard.id, Shard.status, Shard.attempts).order_by(Shard.id)).all(),
            session.execute(select(Trial.id, Trial.status).order_by(Trial.id)).all(),
            session.scalar(select(func.count()).select_from(Result)),
        ]


def _schedule(db: Database, settings: Settings, folder: Path) -> int:
    """A schedule over a folder of two checkpoints, ticked, its jobs run and ticked again (verdicts):
    the second checkpoint's job id."""
    for name in ("ckpt-1", "ckpt-2"):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (folder / name / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    template = {"engine": {"name": "fake"}, "batch_sizes": [3], "iterations": 10}
    schedules.add_schedule(
        db,
        "nightly",
        source=FolderSource(path=folder),
        template=template,
        baseline="first",
        rule=RegressionRule(max_drop=5),
        settings=settings,
    )
    scheduler.tick(db, settings=settings)
    found = {c.name: c.job_id for c in schedules.list_checkpoints(db, "nightly")}
    for job_id in found.values():
        assert job_id is not None
        chromium.finish_fake_job(db, job_id)
    scheduler.tick(db, settings=settings)
    second = found["ckpt-2"]
    assert second is not None
    return second


def test_the_viewer_serves_the_store_read_only(
    page: chromium.Browser, db: Database, database_url: str, tmp_path: Path, mmlu_dir: Path
) -> None:
    sweep = chromium.run_fake_job(db, VARIANTS)
    other = chromium.run_fake_job(db, {"seed": 1})
    running = chromium.run_fake_job(db, {"seed": 2, "iterations": 9}, shards=1)  # 1 of 3 shards done
    settings = Settings(database_url=database_url, cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir)
    checkpoint = _schedule(db, settings, tmp_path / "run")
    dialect = _dialect(database_url)
    with posbias.viewer(settings=settings).start() as view:
        assert view.url.startswith("http://127.0.0.1:")
        page.load(view.url)
        assert page.count("table.job-list tbody tr") == 5
        bar = f".progress[data-job='{running}'] progress"
        assert page.driver.execute_script("return document.querySelector(arguments[0]).value", bar) == 3
        page.screenshot(f"viewer-list-{dialect}")

        page.load(f"{view.url}job/{sweep}")
        assert page.count("circle.point[data-variant='late-rise']") > 0
        assert page.count("polygon.shade.pointwise") > 0
        page.click("input[name=shade][value=band]")
        assert page.count("polygon.shade.pointwise") == 0
        assert page.count("polygon.shade.band") > 0
        _opens_its_trials(
            page, "circle.point[data-axis='position'][data-pos='1']", batch_size=4
        )  # fetched live
        page.screenshot(f"viewer-job-{dialect}")

        # A schedule's checkpoint shows the schedule as a strip, itself marked, each linking to its job.
        page.load(f"{view.url}job/{checkpoint}")
        assert page.count(".strip .checkpoint") == 2
        assert page.count(".strip .checkpoint.current") == 1
        assert page.count(f".strip a[href='/job/{checkpoint - 1}']") == 1
        page.screenshot(f"viewer-schedule-{dialect}")

        page.load(f"{view.url}compare?a={sweep}&b={other}")
        assert page.count("#comparison svg.chart") == 1
        page.screenshot(f"viewer-compare-{dialect}")
        assert page.console_errors() == []
        assert page.leaving() == set()
        assert {u for u in page.requested() if u.startswith(view.url + "api/trial/")}  # trials came live

        # Read-only: every other method is refused, nothing changed, and the connection cannot write.
        before = _state(db)
        for path in ("", f"job/{sweep}", "api/jobs", f"api/trial/{sweep}/1"):
            for method in ("POST", "PUT", "DELETE"):
                request = urllib.request.Request(view.url + path, data=b"status=cancelled", method=method)
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=30)
                assert refused.value.code == 405
        with pytest.raises(Exception, match=r"(?i)read-?only"), view.db.write() as session:
            session.execute(text("DELETE FROM results"))
        assert _state(db) == before

        # Progress is live: the running job finishes while its list is open.
        page.load(view.url)
        chromium.finish_fake_job(db, running)
        page.wait_for(f".progress[data-job='{running}'] progress[value='9']", timeout=30)
