"""Reports and the viewer whatever a job's size (issue 39), on SQLite and PostgreSQL: a report file shows a
stated, reproducible sample of a larger job's trials and carries no other trial's answers; the viewer lists
every answer behind a point from the store, a page at a time; and the viewer builds a page once per change
of the store, however many ask for it at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from support.browser import finish_fake_job, run_fake_job
from support.in_process import run_cli

from posbias.service.reports.answer_lists import Point, point_answers
from posbias.service.reports.page_cache import StoreChanges
from posbias.service.reports.viewer import Viewer, open_read_only
from posbias.service.store.database import Database
from posbias.service.store.tables import Result, Trial

VARIANTS = {"variants": ["baseline", {"name": "late-rise", "fake": {"last": 0.95}}]}
LARGER = {**VARIANTS, "batch_sizes": [3, 4], "iterations": 10}
"""40 trials: two variants x two batch sizes x ten iterations."""


def _data(page: str) -> Any:
    start = page.index('<script id="posbias-data" type="application/json">')
    return json.loads(page[page.index(">", start) + 1 : page.index("</script>", start)])


def test_a_report_shows_a_stated_even_sample_of_a_larger_jobs_trials_and_no_others(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    job = run_fake_job(db, LARGER)
    env = {"POSBIAS_DATABASE_URL": database_url, "POSBIAS_CACHE_DIR": str(tmp_path / "cache")}
    pages = []
    for name in ("a.html", "b.html"):
        done = run_cli(
            ["report", str(job), "--out", str(tmp_path / name), "--max-trials", "6"], env=env, folder=tmp_path
        )
        assert done.code == 0, done.stderr
        assert "6 of 40 trials shown" in done.stdout
        pages.append((tmp_path / name).read_text())
    page = pages[0]
    assert f"job {job}: 6 of 40 trials shown" in page  # said on the page, not only by the command
    data = _data(page)
    report = data["jobs"][0]
    assert report["sample"] == {"shown": 6, "total": 40}
    embedded = {int(key.split(":")[1]) for key in data["trials"]}
    listed = {row[0] for row in report["answers"]["rows"]}
    assert len(embedded) == 6 and listed == embedded  # no answer of a trial the file does not show
    with db.read() as session:
        shown = session.execute(select(Trial.variant, Trial.batch_size).where(Trial.id.in_(embedded))).all()
        answers = session.scalar(select(func.count()).select_from(Result).where(Result.job_id == job))
    assert len(set(shown)) == 4  # every variant at every batch size
    assert len(report["answers"]["rows"]) == sum(n for _, n in shown)  # each shown trial's every answer
    # The curves count every answer, not the sample's.
    assert sum(p["n"] for c in report["curves"]["position"] for p in c["points"]) == answers
    # The same trials every time.
    assert _data(pages[1])["trials"].keys() == data["trials"].keys()


def test_the_viewer_lists_every_answer_behind_a_point_a_page_at_a_time(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    job = run_fake_job(db, LARGER)
    with db.read() as session:
        expected = session.execute(
            select(Result.trial_id, Result.position)
            .where(Result.job_id == job, Result.variant == "late-rise", Result.batch_size == 4)
            .where(Result.position == 2)
            .order_by(Result.trial_id)
        ).all()
    point = Point(variant="late-rise", batch_size=4, axis="position", at=2)
    seen: list[tuple[int, int]] = []
    after = (0, 0)
    while True:
        found = point_answers(db, job, point, after=after, limit=3)
        seen += [(row[0], row[3]) for row in found["rows"]]
        if found["after"] is None:
            break
        after = tuple(found["after"])  # type: ignore[assignment]
    assert seen == [tuple(row) for row in expected] and len(seen) == 10

    with Viewer(open_read_only(database_url), cache_dir=tmp_path / "cache") as viewer:
        status, _, body = viewer.route(f"/api/answers/{job}?variant=late-rise&batch=4&axis=position&at=2")
        assert status is HTTPStatus.OK
        rows = json.loads(body)["rows"]
        assert [(row[0], row[3]) for row in rows] == seen
        distance = json.loads(
            viewer.route(
                f"/api/answers/{job}?variant=baseline&batch=3&axis=token-distance&at=0&width=100000"
            )[2]
        )
        assert len(distance["rows"]) == 10 * 3  # every answer of N = 3 has a distance in [0, 100000)
        for path in (
            f"/api/answers/{job}?variant=baseline&batch=3&axis=sideways&at=1",
            f"/api/answers/{job}?variant=baseline&batch=3&axis=token-distance&at=0",
            f"/api/answers/{job}?variant=baseline&axis=position&at=1",
            f"/api/answers/{job}?variant=baseline&batch=-3&axis=position&at=1",
            f"/api/answers/{job}?variant=baseline&batch=3&axis=position&at=1&after=1",
        ):
            assert viewer.route(path)[0] is HTTPStatus.BAD_REQUEST, path
        assert viewer.route(f"/api/answers/{job + 1}?variant=baseline&batch=3&axis=position&at=1")[0] is (
            HTTPStatus.NOT_FOUND
        )


def _commit_elsewhere(url: str, job: int) -> None:
    """Commit a write from another process (a real one: SQLite writes nothing for an update to the same
    value, so its data version would not move)."""
    script = (
        "import sys; from sqlalchemy import create_engine, text\n"
        "with create_engine(sys.argv[1]).begin() as c:\n"
        "    c.execute(text('UPDATE jobs SET priority = priority + 1 WHERE id = ' + str(int(sys.argv[2]))))\n"
    )
    subprocess.run([sys.executable, "-c", script, url, str(job)], check=True, timeout=60)


def test_the_store_changes_token_moves_with_a_commit_from_another_process(
    db: Database, database_url: str
) -> None:
    job = run_fake_job(db, {})
    viewer_db = open_read_only(database_url)
    changes = StoreChanges(viewer_db)
    try:
        first = changes.token()
        with viewer_db.read() as session:  # the viewer's own reads move nothing
            session.execute(select(func.count()).select_from(Result)).scalar_one()
        assert changes.token() == first
        _commit_elsewhere(database_url, job)
        second = changes.token()
        assert second != first
        assert changes.token() == second
    finally:
        changes.close()
        viewer_db.close()


def test_many_requests_for_one_page_build_it_once_and_a_store_change_builds_it_again(
    db: Database, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = run_fake_job(db, {**VARIANTS, "iterations": 9}, shards=2)  # two of three shards done
    requests = 24
    with Viewer(open_read_only(database_url), cache_dir=tmp_path / "cache").start() as viewer:
        builds: list[list[int]] = []
        tokens: list[Any] = []
        arrived = threading.Semaphore(0)
        build, get, token = viewer.build_report, viewer._pages.get, viewer._changes.token

        def arriving(*args: Any, **kwargs: Any) -> bytes:
            arrived.release()
            return get(*args, **kwargs)

        def counted(job_ids: list[int]) -> bytes:
            builds.append(job_ids)
            if len(builds) == 1:  # the first build waits until every request has asked for the page
                for _ in range(requests):
                    assert arrived.acquire(timeout=60)
            return build(job_ids)

        def seen() -> Any:
            tokens.append(token())
            return tokens[-1]

        monkeypatch.setattr(viewer._pages, "get", arriving)
        monkeypatch.setattr(viewer._changes, "token", seen)
        monkeypatch.setattr(viewer, "build_report", counted)

        def fetch(_: int) -> bytes:
            try:
                with urllib.request.urlopen(f"{viewer.url}job/{job}", timeout=120) as answer:
                    return bytes(answer.read())
            except urllib.error.HTTPError as exc:
                raise AssertionError(exc.read().decode()[-500:]) from None

        with ThreadPoolExecutor(requests) as pool:
            bodies = list(pool.map(fetch, range(requests)))
        # One build per state of the store, however many asked: on SQLite nothing else commits meanwhile;
        # a PostgreSQL server's snapshot also moves with its own background work (autovacuum's analyze).
        assert len(tokens) == requests and len(builds) == len(set(tokens))
        if database_url.startswith("sqlite"):
            assert builds == [[job]]
        assert len(set(bodies)) <= len(builds) and b"posbias-data" in bodies[0]
        built = len(builds)
        page = fetch(0)
        assert len(builds) == built + (tokens[-1] != tokens[-2])  # kept while nothing changes

        finish_fake_job(db, job)  # the store changes: the job's last shard is written
        with ThreadPoolExecutor(4) as pool:
            after = set(pool.map(fetch, range(4)))
        assert len(builds) > built and page not in after
        assert _data(after.pop().decode())["jobs"][0]["summary"]["status"] == "done"

        built = len(builds)
        _commit_elsewhere(database_url, job)  # any commit, from any process, builds it again
        fetch(0)
        assert len(builds) == built + 1
