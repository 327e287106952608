"""Fixtures every tier may use: a throwaway PostgreSQL server for the session, and the MMLU copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.settings import Settings
from service.throwaway_postgres import PostgresServer, running

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the whole session (started on first use)."""
    with running() as server:
        yield server


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
