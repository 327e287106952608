"""Bad input, a few hundred generated cases on each store: every one exits 1 or 2 with one line on stderr, no
traceback, and leaves the store and the working folder as they were.

Every case that can runs in this process through the command's real entry point and error mapping
(`posbias.cli.app.run`, what the console script calls, set up as a process would be); the ones that must be
processes of their own (Ray addresses) and a fixed sample of the others (every
`SAMPLE_EVERY`-th) run as `python -m posbias.cli`. The cases come from tests/support/fuzzcases.py, which
benchmarks/fuzz.py runs by the thousand. Every address is on loopback.

A sample of the cases the Python API can be asked too (`Case.api`) is: it must refuse each with a posbias
error, and with the line the command prints wherever the refusal is not the command's own flags'.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest
from support import fuzzcases
from support.ports import free_port
from support.postgres import PostgresServer

CASES = 144
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
        store_sql=fuzzcases.store_sql(mmlu_dir),
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


API_SAMPLE = 60
"""Cases with an API call asked of the API too, per store (the first, in the seed's order)."""


def test_the_api_refuses_what_the_command_refuses_in_the_same_words(
    context: fuzzcases.Context, tmp_path: Path, mmlu_dir: Path
) -> None:
    asked = [case for case in islice(fuzzcases.generate(SEED + 1, context), CASES * 2) if case.api]
    asked = asked[:API_SAMPLE]
    assert {case.template for case in asked} >= {"spec_field", "database_url", "damaged_store", "job_id"}
    problems = []
    for n, case in enumerate(asked):
        folder = tmp_path / f"case{n}"
        cli = fuzzcases.run_in_process(
            case, context, folder=folder, cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir
        )
        if cli.problems:
            problems.append(cli.report())
            continue
        # The same working folder as the command had, rebuilt: the command may not change it, nor may the API.
        api = fuzzcases.run_api(
            case, context, folder=folder, cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir, cli=cli
        )
        if api.problems:
            problems.append(api.report())
    assert problems == [], "\n".join(problems)
    assert any(not case.same_text for case in asked) and any(case.same_text for case in asked)


def _execute(url: str, sql: str) -> None:
    """Run `sql` on the store at `url` outside posbias (as a user's SQL client would)."""
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.split(":///", 1)[1])) as connection, connection:
            connection.executescript(sql)
        return
    import psycopg
    from sqlalchemy import make_url

    parsed = make_url(url)
    with psycopg.connect(
        host=parsed.host, port=parsed.port, user=parsed.username, dbname=parsed.database, autocommit=True
    ) as connection:
        connection.execute(sql)


def _refused(case: fuzzcases.Case, context: fuzzcases.Context, folder: Path, mmlu_dir: Path) -> str:
    outcome = fuzzcases.run_in_process(
        case, context, folder=folder, cache_dir=folder / "cache", mmlu_dir=mmlu_dir
    )
    assert outcome.problems == [], outcome.report()
    return outcome.lines[0]


def test_db_upgrade_refuses_a_store_missing_a_table_or_its_revision(
    context: fuzzcases.Context, tmp_path: Path, mmlu_dir: Path
) -> None:
    upgrade = fuzzcases.Case("partial_schema", ("db", "upgrade"))
    _execute(context.store_url, "DROP TABLE checkpoints")
    line = _refused(upgrade, context, tmp_path / "dropped", mmlu_dir)
    assert "lacks the table checkpoints" in line and "restore the database from a backup" in line
    _execute(context.store_url, "DROP TABLE alembic_version")
    line = _refused(upgrade, context, tmp_path / "unversioned", mmlu_dir)
    assert "holds some of posbias's tables" in line and "no schema revision" in line


def test_a_downgrade_the_migrations_refuse_is_one_line_and_changes_nothing(
    context: fuzzcases.Context, tmp_path: Path, mmlu_dir: Path
) -> None:
    import posbias
    from posbias.service.settings import Settings

    settings = Settings(database_url=context.store_url, mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")
    posbias.submit(
        {**fuzzcases.VALID_SPEC, "variants": [{"name": "worse", "fake": {"last": 0.4}}]}, settings=settings
    )
    line = _refused(
        fuzzcases.Case("downgrade", ("db", "downgrade", "base")), context, tmp_path / "down", mmlu_dir
    )
    assert "cannot go below revision 0007" in line and "the store is unchanged" in line
