"""The diagnosis page (`posbias diagnose ... --html PATH`) in a real headless chromium
(tests/support/browser.py), on a diagnosis of the fake engine's window mechanism on SQLite and PostgreSQL: it
loads from the file with no console error and asks nothing of any other machine; every suspect is shown with
a row for every line of evidence; every number and job links into `posbias view`, and every link opens there
a page of its job."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import browser as chromium

import posbias
from posbias.schemas.diagnosis import Line, Suspect
from posbias.service.settings import Settings
from posbias.service.store.database import Database

pytestmark = pytest.mark.skipif(chromium.missing() is not None, reason=chromium.missing() or "")

FAKE = {"window": 1000, "mechanism": {"window_step": 0.3}}


@pytest.fixture(scope="module")
def page() -> Iterator[chromium.Browser]:
    """One browser for the module's tests."""
    with chromium.browser() as opened:
        yield opened


def test_the_diagnosis_page_shows_every_verdict_and_links_into_the_viewer(
    page: chromium.Browser, db: Database, database_url: str, tmp_path: Path, mmlu_dir: Path
) -> None:
    settings = Settings(database_url=database_url, cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir)
    submitted = posbias.diagnose("fake/window", engine="fake", fake=FAKE, budget=400, settings=settings)
    for job in submitted.jobs:
        chromium.finish_fake_job(db, job.job_id)
    again = posbias.diagnose("fake/window", engine="fake", fake=FAKE, budget=400, settings=settings)
    diagnosis = again.diagnosis
    assert diagnosis is not None

    with posbias.viewer(settings=settings).start() as view:
        out = posbias.write_diagnosis(diagnosis, path=tmp_path / "diagnosis.html", view_url=view.url)
        page.driver.get(out.as_uri())
        page.wait_for("table")
        assert page.console_errors() == []
        assert page.leaving() == set()  # nothing fetched: the page is whole, offline
        assert page.count("script") == 0 and page.count("link[rel=stylesheet]") == 0
        rows = page.driver.execute_script(
            "return [...document.querySelectorAll('table tr')].slice(1).map((r) => r.innerText)"
        )
        # One row per suspect and line: the suspect's cells span its lines.
        assert len(rows) == len(Suspect) * len(Line)
        text = page.driver.find_element("css selector", "body").text
        for verdict in diagnosis.suspects:
            assert verdict.suspect.value in text
            for finding in verdict.findings:
                assert finding.reason.split(":")[0] in text
        page.screenshot(f"diagnosis-{'postgresql' if database_url.startswith('postgresql') else 'sqlite'}")

        # Every number with an interval is a link, and every tested finding names its jobs as links.
        numbers = sum(1 for v in diagnosis.suspects for f in v.findings if f.effect and f.job_ids)
        assert page.count("a.number") == numbers > 0
        cited = {j for v in diagnosis.suspects for f in v.findings for j in f.job_ids}
        hrefs = set(
            page.driver.execute_script("return [...document.querySelectorAll('a')].map((a) => a.href)")
        )
        assert hrefs == {f"{view.url}job/{j}" for j in {*cited, *diagnosis.job_ids}}
        for href in sorted(hrefs):
            with urllib.request.urlopen(href, timeout=60) as answer:
                assert answer.status == 200
            page.load(href)  # the viewer's page of that job, drawn
            job = int(href.rsplit("/", 1)[1])
            assert page.count(f"#job-{job}") == 1
        assert page.console_errors() == []
        assert page.leaving() == set()
