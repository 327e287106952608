"""`posbias view`: the report's pages served live from the store by a local web server that cannot write.

Pages: `/` (every job, with running jobs' progress, and a form to compare two), `/job/ID` (a job's report),
`/compare?a=ID&b=ID` (two jobs' reports and their comparison); data: `/api/jobs`,
`/api/answers/JOB?variant=V&batch=N&axis=A&at=X` (the answers behind one point, from the store, a thousand
at a time: what a click on a point lists) and `/api/trial/JOB/TRIAL` (one trial's page, fetched when a
trial is clicked). A report page is built once per change of the store however many ask for it at once
(`service/reports/page_cache.py`), and carries no answers: every trial is read from the store on demand.

Read-only three times over: the database connection is opened read-only (SQLite through a `mode=ro` URI
with `query_only` on, PostgreSQL with `default_transaction_read_only`), the server answers only GET and
HEAD (every other method is 405 before anything is read), and it binds 127.0.0.1 unless told otherwise.
A request whose Host is not this machine is refused, so that a web page elsewhere cannot read the store
through the browser (DNS rebinding).
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from sqlalchemy import URL

from posbias.schemas import NotFoundError, PosbiasError, UsageError, one_line
from posbias.schemas.ids import parse_id
from posbias.service.reports import answer_lists, report, report_data, report_page
from posbias.service.reports.page_cache import PageCache, StoreChanges
from posbias.service.store import (
    Database,
    check_schema,
    check_sqlite_file,
    create_db_engine,
    normalise_url,
    sqlite_path,
)
from posbias.service.work import jobs as job_store

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
# Any segment: the ids in it are read by `parse_id` (ASCII digits only; `\d` would pass a full-width 2).
_JOB = re.compile(r"/job/([^/]+)/?")
_TRIAL = re.compile(r"/api/trial/([^/]+)/([^/]+)/?")
_ANSWERS = re.compile(r"/api/answers/([^/]+)/?")
_COUNT = re.compile(r"[0-9]{1,9}")


def open_read_only(url: str | URL) -> Database:
    """The store at `url`, opened so that nothing can be written through it, after checking it is at this
    posbias's schema version (`PosbiasError` naming the fix otherwise)."""
    parsed = normalise_url(url)
    path = sqlite_path(parsed)
    if path is not None:
        check_sqlite_file(path)
        # `mode=ro`: SQLite itself opens the file read-only. `create=True` below only keeps
        # create_db_engine from rewriting this URI to its own `mode=rw`; nothing can be created read-only.
        parsed = parsed.set(
            database=f"file:{quote(str(path.absolute()))}", query={"mode": "ro", "uri": "true"}
        )
    engine = create_db_engine(parsed, read_only=True, create=True)
    try:
        check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return Database(engine)


class Viewer:
    """A running viewer on one store: `url` to open, `serve_forever()` or `start()` (in a thread), and
    `close()`; a context manager."""

    def __init__(
        self,
        db: Database,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cache_dir: Path | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.db = db
        self.cache_dir = cache_dir
        self.log = log
        self._host = host
        self._pages = PageCache()
        self._changes = StoreChanges(db)
        self._thread: threading.Thread | None = None
        try:
            self.server = ThreadingHTTPServer((host, port), _handler(self))
        except OSError as exc:
            raise PosbiasError(
                f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port, or 0 for a free one"
            ) from None
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        """Where the viewer is, e.g. `http://127.0.0.1:8765/`."""
        return f"http://{self._host}:{self.server.server_port}/"

    def serve_forever(self) -> None:
        """Answer requests until `close()` (from another thread) or Ctrl-C."""
        self.server.serve_forever(poll_interval=0.2)

    def start(self) -> Viewer:
        """Answer requests in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="posbias-view", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop answering and close the server and the store."""
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join()
        self.server.server_close()
        self._changes.close()
        self.db.close()

    def __enter__(self) -> Viewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- pages ------------------------------------------------------------------------------------------

    def report_page(self, job_ids: list[int]) -> bytes:
        """The report page of `job_ids`: the one built since the store last changed, or (once, however
        many ask at the same time) built now."""
        token = self._changes.token()  # before the build: the page is at least as new as its token
        return self._pages.get(tuple(job_ids), token=token, build=lambda: self.build_report(job_ids))

    def build_report(self, job_ids: list[int]) -> bytes:
        """The report page of `job_ids` computed from the store (`NotFoundError` names a missing job)."""
        data = report.report_data_for(self.db, job_ids, live=True, cache_dir=self.cache_dir)
        return report_page.render(data, title=report.title_of(job_ids), live=True).encode()

    def list_page(self) -> str:
        """The job list: every job, newest first, with its progress."""
        data = {
            "page": "list",
            "live": True,
            "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "job_list": report_data.job_list(self.db),
            "jobs": [],
        }
        return report_page.render(data, title="posbias: jobs", live=True)

    def route(self, target: str) -> tuple[HTTPStatus, str, bytes]:
        """The status, content type and body for GET `target`."""
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        html_type, json_type = "text/html; charset=utf-8", "application/json"
        try:
            if path in {"/", "/index.html"}:
                return HTTPStatus.OK, html_type, self.list_page().encode()
            if match := _JOB.fullmatch(path):
                return HTTPStatus.OK, html_type, self.report_page([parse_id(match[1])])
            if path in {"/compare", "/compare/"}:
                ids = [_job_id(query, "a"), _job_id(query, "b")]
                return HTTPStatus.OK, html_type, self.report_page(ids)
            if path == "/api/jobs":
                return HTTPStatus.OK, json_type, _json(report_data.job_list(self.db))
            if match := _ANSWERS.fullmatch(path):
                job_id = parse_id(match[1])
                job_store.get(self.db, job_id)  # NotFoundError names the fix
                found = answer_lists.point_answers(self.db, job_id, _point(query), after=_after(query))
                return HTTPStatus.OK, json_type, _json(found)
            if match := _TRIAL.fullmatch(path):
                job_id, trial_id = parse_id(match[1]), parse_id(match[2], what="trial id")
                page = report.trial_page(self.db, job_id, trial_id, cache_dir=self.cache_dir)
                return HTTPStatus.OK, json_type, _json(page)
        except NotFoundError as exc:
            return _error(HTTPStatus.NOT_FOUND, str(exc), path)
        except PosbiasError as exc:
            return _error(HTTPStatus.BAD_REQUEST, str(exc), path)
        return _error(
            HTTPStatus.NOT_FOUND, f"no page {path}: the pages are /, /job/ID and /compare?a=ID&b=ID", path
        )


def _job_id(query: dict[str, list[str]], name: str) -> int:
    value = (query.get(name) or [""])[0]
    try:
        return parse_id(value)
    except UsageError as exc:
        raise UsageError(f"/compare needs two job ids, e.g. /compare?a=1&b=2: {name}: {exc}") from None


def _point(query: dict[str, list[str]]) -> answer_lists.Point:
    """The point `/api/answers` names: `variant`, `batch`, `axis`, `at`, and `width` (a token-distance
    bin's) and `filler` (a filler length's curve) where they apply."""

    def value(name: str) -> str:
        found = query.get(name)
        if not found:
            raise UsageError(
                f"/api/answers needs {name}=, e.g. /api/answers/1?variant=baseline&batch=5&axis=position&at=1"
            )
        return found[0]

    def count(name: str) -> int:
        text = value(name)
        if not _COUNT.fullmatch(text):
            raise UsageError(f"{name} {text[:30]!r} is not a count: write it in the digits 0-9 only")
        return int(text)

    return answer_lists.Point(
        variant=value("variant")[:64],
        batch_size=count("batch"),
        axis=value("axis"),
        at=count("at"),
        width=count("width") if "width" in query else None,
        filler=count("filler") if "filler" in query else None,
    )


def _after(query: dict[str, list[str]]) -> tuple[int, int]:
    """Where the last page of a point's answers ended (`after=TRIAL,POSITION`); (0, 0) for the first."""
    text = (query.get("after") or ["0,0"])[0]
    trial, _, position = text.partition(",")
    if not (_COUNT.fullmatch(trial) and _COUNT.fullmatch(position)):
        raise UsageError(f"after {text[:30]!r} is not TRIAL,POSITION, e.g. after=120,7")
    return int(trial), int(position)


def _json(data: Any) -> bytes:
    return report_page.script_json(data).encode()


def _error(status: HTTPStatus, message: str, path: str) -> tuple[HTTPStatus, str, bytes]:
    if path.startswith("/api/"):
        return status, "application/json", _json({"error": message})
    import html

    body = (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{status.value} {status.phrase}</title>'
        f'</head><body><h1>{status.phrase}</h1><p>{html.escape(message)}</p><p><a href="/">all jobs</a>'
        "</p></body></html>"
    )
    return status, "text/html; charset=utf-8", body.encode()


def _handler(viewer: Viewer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "posbias-view"
        sys_version = ""

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _refuse(self) -> None:
            # Read-only: nothing but GET and HEAD is answered, and nothing of the request is read.
            self._send(
                HTTPStatus.METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                b"read-only viewer\n",
                body=True,
                extra={"Allow": "GET, HEAD"},
            )

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

        def _answer(self, *, body: bool) -> None:
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()
            if host not in LOCAL_HOSTS:
                self._send(
                    HTTPStatus.FORBIDDEN,
                    "text/plain; charset=utf-8",
                    b"the viewer answers requests for 127.0.0.1 only\n",
                    body=body,
                )
                return
            try:
                status, kind, content = viewer.route(self.path)
            except Exception as exc:  # a request must not take the server down; the page says what failed
                status, kind, content = _error(HTTPStatus.INTERNAL_SERVER_ERROR, one_line(exc), self.path)
            self._send(status, kind, content, body=body)

        def _send(
            self,
            status: HTTPStatus,
            kind: str,
            content: bytes,
            *,
            body: bool,
            extra: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            headers = {
                "Content-Type": kind,
                "Content-Length": str(len(content)),
                "Content-Security-Policy": report_page.LIVE_POLICY,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-store",
                **(extra or {}),
            }
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:
            if viewer.log is not None:
                viewer.log(f"{self.address_string()} {format % args}")

        def log_error(self, format: str, *args: Any) -> None:
            print(f"posbias view: {format % args}", file=sys.stderr)

    return Handler
