"""The `posbias` command driven as a user drives it: a subprocess with POSBIAS_* in its environment."""

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


@pytest.fixture
def posbias(store_url: str, tmp_path: Path, mmlu_dir: Path) -> Posbias:
    """Run `posbias ARGS...` in `tmp_path` against `store_url`; `check=False` to expect a failure."""

    def run(*args: str, check: bool = True, timeout: float = 600, **env: str) -> Done:
        environment = {
            **os.environ,
            "POSBIAS_DATABASE_URL": store_url,
            "POSBIAS_MMLU_DIR": str(mmlu_dir),
            "POSBIAS_CACHE_DIR": os.environ.get("POSBIAS_TEST_CACHE_DIR", str(tmp_path / "cache")),
            "POSBIAS_POLL_SECONDS": "0.05",
            "RAY_ADDRESS": "",
            "COLUMNS": "200",
            **env,
        }
        done = subprocess.run(
            [sys.executable, "-m", "posbias.cli", *args],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        result = Done(args=args, code=done.returncode, stdout=done.stdout, stderr=done.stderr)
        if check and result.code != 0:
            raise AssertionError(f"posbias {' '.join(args)} exited {result.code}:\n{result.stderr}")
        return result

    return run
