"""Bad input, a few hundred generated cases on each store: every one exits 1 or 2 with one line on stderr, no
traceback, and leaves the store and the working folder as they were.

Every case that can runs in this process through the command's real entry point and error mapping
(`posbias.cli.app.run`, what the console script calls, set up as a process would be); the ones that must be
processes of their own (Ray addresses) and a fixed sample of the others (every
`SAMPLE_EVERY`-th) run as `python -m posbias.cli`. The cases come from tests/support/fuzzcases.py, which
benchmarks/fuzz.py runs by the thousand. Every address is on loopback.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest
from support import fuzzcases
from support.ports import free_port
from support.postgres import PostgresServer

CASES = 112
"""Cases generated per store: every template eight times."""
SAMPLE_EVERY = 40
"""Of the cases run in this process, every this-many-th (from the first) runs again as a process."""
SEED = 2026


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    with fuzzcases.silent_server() as port:
        yield port


@pytest.fixture
def context(
    store_url: str, tmp_path: Path, mmlu_dir: Path, silent_port: int, request: pytest.FixtureRequest
) -> Iterator[fuzzcases.Context]:
    job = fuzzcases.prepare_store(store_url, mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")
    port, foreign, server = None, None, None
    if store_url.startswith("postgresql"):
        server = request.getfixturevalue("postgres_server")
        assert isinstance(server, PostgresServer)
        name = f"foreign_{uuid.uuid4().hex[:10]}"
        foreign = fuzzcases.foreign_postgres(server, name)
        port = server.port
    yield fuzzcases.Context(
        store_url=store_url,
        dialect="postgresql" if server else "sqlite",
        job_id=job,
        closed_port=free_port(),
        silent_port=silent_port,
        postgres_port=port,
        foreign_postgres_url=foreign,
    )
    if server is not None:
        server.drop_database(name)


def test_every_bad_input_is_one_line_exit_1_or_2_and_changes_nothing(
    context: fuzzcases.Context, tmp_path: Path, mmlu_dir: Path
) -> None:
    cases = list(islice(fuzzcases.generate(SEED, context), CASES))
    in_process = [case for case in cases if case.in_process]
    # A case drawn twice (the Ray template has few choices) runs once.
    needing = {case.describe(): case for case in cases if not case.in_process}
    processes = [*needing.values(), *in_process[::SAMPLE_EVERY]]
    assert {case.template for case in in_process} == set(fuzzcases.TEMPLATES) - {"ray_address"}
    assert any(not case.in_process for case in processes), "no case that needs a process of its own"

    outcomes = [
        fuzzcases.run_in_process(
            case, context, folder=tmp_path / f"case{n}", cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir
        )
        for n, case in enumerate(in_process)
    ]
    outcomes += [
        fuzzcases.run_subprocess(
            case, context, folder=tmp_path / f"process{n}", cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir
        )
        for n, case in enumerate(processes)
    ]

    problems = [outcome.report() for outcome in outcomes if outcome.problems]
    assert problems == [], "\n".join(problems)
    assert {outcome.code for outcome in outcomes} <= {1, 2}
    assert any(outcome.code == 2 for outcome in outcomes) and any(outcome.code == 1 for outcome in outcomes)
