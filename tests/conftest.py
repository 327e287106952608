"""Fixtures every tier may use: a throwaway PostgreSQL server and a local Ray for the session, the MMLU copy,
and a local webhook receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support import smoke
from support.postgres import PostgresServer, running

from posbias.service.settings import Settings

REPO = Path(__file__).resolve().parents[1]


ONE_WORKER = ("tests/integration/engine/",)
"""Under pytest-xdist (scripts/test.sh runs two workers), the tests in these folders share one worker: their
session engines (the tiny Llama, Gemma 2 and Gemma 3 and the demo model on vLLM) are then built once."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Alone, the CPU image's smoke test runs last: its install goes on in the background till then
    (tests/support/smoke.py). Under pytest-xdist (`--dist loadgroup`), each file is one group, so a module's
    fixtures are set up once, and the engine tests are one group; the smoke test, the longest, goes first."""
    if not smoke.under_xdist(config):
        items.sort(key=smoke.is_smoke)
        return
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = next((folder for folder in ONE_WORKER if path.startswith(folder)), path)
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not smoke.is_smoke(item))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the smoke test's install as soon as the run is known to include it (not under --collect-only,
    and not under pytest-xdist, whose other worker has the idle time the background install would use)."""
    if (
        not session.config.option.collectonly
        and not smoke.under_xdist(session.config)
        and any(smoke.is_smoke(item) for item in session.items)
    ):
        smoke.start_install()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An install a session that ended early left running is stopped, and its folder removed."""
    smoke.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the whole session (started on first use)."""
    with running() as server:
        yield server


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray in this process for the whole session (each start costs 5-15 s), started on first use
    (or the one this process already has: `api.dispatch` starts one where none is) and stopped at the end.
    A test that dispatches in-process uses it; one that runs the CLI as a subprocess gets a Ray of its own."""
    import ray

    from posbias.service.dispatch.ray_connect import LOCAL_SYSTEM_CONFIG

    if not ray.is_initialized():
        # Ray's settings as `posbias worker` starts it: the actors at this process's niceness.
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            _system_config=LOCAL_SYSTEM_CONFIG,
        )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def mmlu_dir() -> Path:
    """The local MMLU copy: POSBIAS_MMLU_DIR when set, else ../shared/data/mmlu next to the repository."""
    folder = Settings().mmlu_dir or REPO.parent / "shared" / "data" / "mmlu"
    if not (folder / "mmlu_test.jsonl").is_file() or not (folder / "csv" / "test").is_dir():
        pytest.fail(
            f"no MMLU copy at {folder} (needs mmlu_test.jsonl and csv/test/); set POSBIAS_MMLU_DIR to one",
            pytrace=False,
        )
    return folder


@pytest.fixture
def webhook() -> Iterator[SimpleNamespace]:
    """A local HTTP server standing in for a chat webhook: `url`, `received` (the JSON bodies it accepted),
    and `statuses`, answers to give before it accepts (then 200)."""
    received: list[dict[str, Any]] = []
    statuses: list[int] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                status = statuses.pop(0) if statuses else 200
                if status == 200:
                    received.append(body)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(
            url=f"http://127.0.0.1:{server.server_address[1]}/hooks/secret-token",
            received=received,
            statuses=statuses,
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
