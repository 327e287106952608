"""The `posbias` command driven as a user drives it, against an empty store on each dialect: `cli` runs it in
this process (its real entry point, `posbias.cli.app.run`, set up as a process would be:
tests/support/in_process.py), `posbias` as a subprocess (`python -m posbias.cli`) for the checks that need a
process of their own. Both take the same arguments and give the same `Done`, so a test switches by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.in_process import run_cli
from support.postgres import PostgresServer

DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@dataclass
class Done:
    """A finished `posbias` command."""

    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as JSON."""
        return json.loads(self.stdout)

    @property
    def error_lines(self) -> list[str]:
        """stderr lines that are posbias's own (Ray's start-up notices are not)."""
        return [
            line for line in self.stderr.splitlines() if line.strip() and "Token authentication" not in line
        ]


Posbias = Callable[..., Done]


@pytest.fixture(params=DIALECTS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store (not yet upgraded) on SQLite, then on a throwaway PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'posbias.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    with server.scratch_database("e2e") as url:
        yield url


def _environment(store_url: str, tmp_path: Path, mmlu_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """The variables a run of the command gets over the session's own (the same for both ways of running)."""
    return {
        "POSBIAS_DATABASE_URL": store_url,
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_CACHE_DIR": os.environ.get("POSBIAS_TEST_CACHE_DIR", str(tmp_path / "cache")),
        "POSBIAS_POLL_SECONDS": "0.05",
        "RAY_ADDRESS": "",
        "COLUMNS": "200",
        **env,
    }


def _finished(result: Done, check: bool) -> Done:
    if check and result.code != 0:
        raise AssertionError(f"posbias {' '.join(result.args)} exited {result.code}:\n{result.stderr}")
    return result


DISPATCHING = {"worker", "run"}
"""The commands that dispatch shards, here on the session's Ray (`ray_session`) when run in this process."""


@pytest.fixture
def cli(store_url: str, tmp_path: Path, mmlu_dir: Path, request: pytest.FixtureRequest) -> Posbias:
    """Run `posbias ARGS...` in this process, in `tmp_path` against `store_url`, as the `posbias` fixture
    runs it as a process: the same environment, working folder and arguments, the same `Done`.

    `worker` and `run` dispatch on the session's local Ray (`ray_session`, started on first need) rather
    than one of their own. A variable a library reads once per process (`HF_HUB_OFFLINE`, Ray's) has no
    effect here: a check that needs one uses `posbias`."""

    def run(*args: str, check: bool = True, timeout: float | None = None, **env: str) -> Done:
        if next((a for a in args if not a.startswith("-")), None) in DISPATCHING:
            request.getfixturevalue("ray_session")
        environment = _environment(store_url, tmp_path, mmlu_dir, env)
        done = run_cli(args, env=environment, folder=tmp_path, timeout=timeout)
        if done.code is None:
            raise AssertionError(
                f"posbias {' '.join(args)} did not finish within {timeout} s:\n{done.stderr}"
            )
        return _finished(Done(args=args, code=done.code, stdout=done.stdout, stderr=done.stderr), check)

    return run


@pytest.fixture
def posbias(store_url: str, tmp_path: Path, mmlu_dir: Path) -> Posbias:
    """Run `posbias ARGS...` as a process (`python -m posbias.cli`) in `tmp_path` against `store_url`;
    `check=False` to expect a failure."""

    def run(*args: str, check: bool = True, timeout: float = 600, **env: str) -> Done:
        done = subprocess.run(
            [sys.executable, "-m", "posbias.cli", *args],
            cwd=tmp_path,
            env={**os.environ, **_environment(store_url, tmp_path, mmlu_dir, env)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return _finished(Done(args=args, code=done.returncode, stdout=done.stdout, stderr=done.stderr), check)

    return run
