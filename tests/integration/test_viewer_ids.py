"""The viewer reads the ids in its URLs as the command does (`schemas.ids`: ASCII digits only): `/compare`
with a superscript 2 answered HTTP 500, and a full-width 2 in `/compare` or `/job/` served job 2. Now an id
that is not ASCII digits is a 400 naming it, and an id of no job a 404."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

from posbias.schemas import Submitted
from posbias.service.reports.viewer import Viewer, open_read_only
from posbias.service.store import database

FULL_WIDTH_2 = "\uff12"
SUPERSCRIPT_2 = "\u00b2"


def test_the_viewer_answers_400_to_an_id_that_is_not_ascii_digits_and_404_to_no_job(
    sqlite_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    with database.connect(sqlite_url) as db:
        make_job(db)
        make_job(db, key="second", seed=1)
    with Viewer(open_read_only(sqlite_url), cache_dir=tmp_path / "cache") as viewer:
        assert viewer.route("/compare?a=1&b=2")[0] is HTTPStatus.OK
        refused = [
            f"/compare?a={SUPERSCRIPT_2}&b=1",
            f"/compare?a=1&b={FULL_WIDTH_2}",
            "/compare?a=1_0&b=1",
            "/compare?a=+1&b=2",
            f"/job/{FULL_WIDTH_2}",
            "/job/1_0",
            "/job/%EF%BC%92",
            f"/api/trial/{FULL_WIDTH_2}/1",
            f"/api/trial/1/{SUPERSCRIPT_2}",
            "/api/trial/1/0",
        ]
        for path in refused:
            status, _, body = viewer.route(path)
            assert status is HTTPStatus.BAD_REQUEST, (path, status, body[:300])
            assert b"digits 0-9" in body or b"out of range" in body, (path, body[:300])
        for path in ("/job/3", "/compare?a=1&b=3", "/api/trial/3/1"):
            assert viewer.route(path)[0] is HTTPStatus.NOT_FOUND, path
