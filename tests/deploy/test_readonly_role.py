"""deploy/sql/readonly_role.sql on a real PostgreSQL migrated by posbias: run twice without error, the analyst
can read `position_curve`, `results` and tables that later migrations add, and can write nothing."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from deploy_support import DEPLOY
from psycopg import errors

pytestmark = pytest.mark.postgres

SCRIPT = DEPLOY / "sql" / "readonly_role.sql"
APP = "posbias_app"  # owns the tables and runs the migrations, as in production: not a superuser
DB = "store"


@dataclass(frozen=True)
class Store:
    host: str
    port: int

    def connect(self, user: str) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(host=self.host, port=self.port, user=user, dbname=DB, autocommit=True)

    def run_script(self) -> subprocess.CompletedProcess[str]:
        """The script as the runbook says to run it: psql, stop on the first error, as an admin."""
        psql = shutil.which("psql")
        assert psql, "psql not found"
        return subprocess.run(
            [
                psql,
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-d",
                DB,
                "-f",
                SCRIPT,
            ],
            env={"PGUSER": "posbias", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    from support import postgres as throwaway_postgres

    from posbias.service.store import migrate

    with throwaway_postgres.running() as server:
        with psycopg.connect(
            host=server.host, port=server.port, user="posbias", dbname="postgres", autocommit=True
        ) as admin:
            admin.execute(f"CREATE ROLE {APP} LOGIN")
            admin.execute(f"CREATE DATABASE {DB} OWNER {APP}")
        migrate.upgrade(f"postgresql+psycopg://{APP}@{server.host}:{server.port}/{DB}")
        target = Store(server.host, server.port)
        for attempt in (1, 2):  # idempotent: the second run must succeed too
            done = target.run_script()
            assert done.returncode == 0, f"run {attempt}: {done.stderr}"
        yield target


def test_analyst_reads_the_curve_and_the_results(store: Store) -> None:
    with store.connect("posbias_analyst") as analyst:
        assert analyst.execute("SELECT count(*) FROM position_curve").fetchone() == (0,)
        assert analyst.execute("SELECT count(*) FROM results").fetchone() == (0,)
        tables = [
            row[0] for row in analyst.execute("SELECT tablename FROM pg_tables WHERE schemaname='public'")
        ]
        assert {"jobs", "shards", "results", "curve_points"} <= set(tables)
        for table in tables:
            analyst.execute(f'SELECT * FROM "{table}" LIMIT 1')


def test_analyst_sessions_are_read_only_by_default(store: Store) -> None:
    with store.connect("posbias_analyst") as analyst, pytest.raises(errors.ReadOnlySqlTransaction):
        analyst.execute("DELETE FROM results")


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO jobs (id) VALUES (-1)",
        "UPDATE jobs SET status = 'done'",
        "DELETE FROM results",
        "TRUNCATE curve_points",
        "CREATE TABLE mine (x int)",
        "CREATE VIEW mine AS SELECT 1",
        "DROP VIEW position_curve",
        "ALTER TABLE results ADD COLUMN x int",
    ],
)
def test_privileges_refuse_writes_even_when_the_session_asks_for_them(store: Store, statement: str) -> None:
    """`default_transaction_read_only` is a default the user may turn off; the privileges are the guard."""
    with store.connect("posbias_analyst") as analyst:
        analyst.execute("SET default_transaction_read_only = off")
        with pytest.raises(errors.InsufficientPrivilege):
            analyst.execute(statement)


def test_tables_added_by_a_later_migration_are_readable(store: Store) -> None:
    with store.connect(APP) as app:
        app.execute("CREATE TABLE later_release (x int)")
        app.execute("INSERT INTO later_release VALUES (7)")
        app.execute("CREATE VIEW later_view AS SELECT x FROM later_release")
    with store.connect("posbias_analyst") as analyst:
        assert analyst.execute("SELECT x FROM later_release").fetchall() == [(7,)]
        assert analyst.execute("SELECT x FROM later_view").fetchall() == [(7,)]


def test_the_group_role_cannot_log_in(store: Store) -> None:
    with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
        store.connect("posbias_readonly").close()
