"""Migrations build exactly the ORM's tables, go down and up again, and `connect` refuses a store at the wrong
schema version with a message that says what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from support.ports import free_port

from posbias.schemas import PosbiasError
from posbias.service.store import database, database_url, migrate, schema_version, store_errors
from posbias.service.store.tables import Base

POSBIAS_TABLES = {"models", "jobs", "shards", "trials", "questions", "results", "curve_points", "batteries"}


def _tables(url: str) -> set[str]:
    engine = database.create_db_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _schema_differences(url: str) -> list[object]:
    engine = database.create_db_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_builds_what_the_orm_declares(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)

    assert migrate.current(empty_database_url) == schema_version.head()
    assert _tables(empty_database_url) >= POSBIAS_TABLES
    assert _schema_differences(empty_database_url) == []


def test_down_to_base_and_up_again(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "base")

    assert migrate.current(empty_database_url) is None
    assert _tables(empty_database_url) & POSBIAS_TABLES == set()

    migrate.upgrade(empty_database_url)
    assert migrate.current(empty_database_url) == schema_version.head()
    assert _schema_differences(empty_database_url) == []
    with database.connect(empty_database_url) as db, db.read() as session:
        assert session.execute(sa.text("SELECT count(*) FROM position_curve")).scalar_one() == 0


def test_upgrade_is_idempotent(database_url: str) -> None:
    migrate.upgrade(database_url)
    assert migrate.current(database_url) == schema_version.head()


def _one_line_error(url: str) -> str:
    with pytest.raises(PosbiasError) as caught:
        database.connect(url)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_connect_to_a_never_upgraded_database_says_to_upgrade(empty_database_url: str) -> None:
    if empty_database_url.startswith("sqlite"):
        # An existing but empty SQLite file (a missing one has its own message, below).
        Path(empty_database_url.removeprefix("sqlite:///")).touch()
    assert "run `posbias db upgrade`" in _one_line_error(empty_database_url)


def test_connect_to_a_missing_sqlite_file_says_to_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere.db'}"
    message = _one_line_error(url)
    assert "no posbias database" in message
    assert "posbias db upgrade" in message
    assert not (tmp_path / "nowhere.db").exists(), "checking must not create the file"


def test_connect_to_an_older_schema_says_to_upgrade(database_url: str) -> None:
    # One revision back: an older posbias's store (the base, while 0001 is the only revision).
    migrate.downgrade(database_url, "-1")
    assert "run `posbias db upgrade`" in _one_line_error(database_url)


def test_connect_to_a_newer_schema_says_to_upgrade_posbias(database_url: str) -> None:
    with database.connect(database_url) as db, db.write() as session:
        session.execute(sa.text("UPDATE alembic_version SET version_num = 'f00dfeed9999'"))
    message = _one_line_error(database_url)
    assert "newer posbias" in message
    assert "f00dfeed9999" in message
    assert "pip install -U posbias" in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://root@localhost/posbias", "unsupported database 'mysql'"),
        pytest.param(
            f"postgresql://nobody@127.0.0.1:{free_port()}/posbias",
            "cannot open the database",
            id="postgresql-nothing-listening",  # the port is free, and so differs per collection (xdist)
        ),
        ("sqlite:////no/such/folder/posbias.db", "no posbias database"),
    ],
)
def test_connect_to_a_bad_url_names_the_setting(url: str, expected: str) -> None:
    message = _one_line_error(url)
    assert expected in message
    assert "POSBIAS_DATABASE_URL" in message


def test_unreachable_postgres_hides_the_password() -> None:
    message = _one_line_error(f"postgresql://me:s3cret@127.0.0.1:{free_port()}/posbias")
    assert "s3cret" not in message
    assert "postgresql+psycopg://me:***@127.0.0.1" in message


def test_upgrade_into_a_missing_folder_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(PosbiasError, match=r"cannot open the database.*POSBIAS_DATABASE_URL"):
        migrate.upgrade(f"sqlite:///{tmp_path / 'missing' / 'posbias.db'}")


# --- stores that are not posbias's, and looking without touching ------------------------------------------


def _execute(url: str, *statements: str) -> None:
    engine = database.create_db_engine(url, create=False)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_upgrade_refuses_another_applications_database_unless_forced(empty_database_url: str) -> None:
    if empty_database_url.startswith("sqlite"):
        Path(empty_database_url.removeprefix("sqlite:///")).touch()
    _execute(empty_database_url, "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")

    with pytest.raises(
        PosbiasError, match=r"already holds tables of another application \(invoices\).*--force"
    ):
        migrate.upgrade(empty_database_url)
    assert _tables(empty_database_url) == {"invoices"}, "a refused upgrade must leave the database alone"

    migrate.upgrade(empty_database_url, force=True)
    assert _tables(empty_database_url) >= POSBIAS_TABLES | {"invoices"}
    assert migrate.current(empty_database_url) == schema_version.head()


def test_a_revision_that_is_not_posbiass_is_refused_and_left_alone(empty_database_url: str) -> None:
    if empty_database_url.startswith("sqlite"):
        Path(empty_database_url.removeprefix("sqlite:///")).touch()
    _execute(
        empty_database_url,
        "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        "INSERT INTO alembic_version VALUES ('abc123other')",
    )
    with pytest.raises(PosbiasError, match="Alembic revision 'abc123other', which is not posbias's"):
        migrate.upgrade(empty_database_url, force=True)
    assert _tables(empty_database_url) == {"alembic_version"}
    with pytest.raises(migrate.RevisionError, match="posbias db current"):
        migrate.downgrade(empty_database_url, "nosuch")


def test_looking_at_a_sqlite_store_creates_nothing_and_leaves_an_empty_file_empty(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    with pytest.raises(PosbiasError, match="no posbias database"):
        migrate.current(f"sqlite:///{missing}")
    with pytest.raises(PosbiasError, match="no posbias database"):
        database.connect(f"sqlite:///{missing}", read_only=True)
    empty = tmp_path / "empty.db"
    empty.touch()
    assert migrate.current(f"sqlite:///{empty}") is None
    with pytest.raises(PosbiasError, match="is an empty file, not a posbias database"):
        database.connect(f"sqlite:///{empty}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]
    assert empty.stat().st_size == 0, "opening must not turn an empty file into a (WAL) database"


def test_a_read_only_store_refuses_writes_on_both(database_url: str) -> None:
    with database.connect(database_url, read_only=True) as db:
        with db.read() as session:
            assert session.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one() == 0
        with pytest.raises(sa.exc.DBAPIError) as raised, db.write() as session:
            session.execute(sa.text("DELETE FROM jobs"))
        assert store_errors.explain(raised.value).problem is store_errors.Problem.read_only


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg2://u@127.0.0.1/db", "driver 'psycopg2' is not one posbias uses"),
        ("postgresql+asyncpg://u@127.0.0.1/db", "driver 'asyncpg' is not one posbias uses"),
        ("postgresql://u@127.0.0.1:99999/db", "port 99999 is not between 1 and 65535"),
        ("postgresql://u@127.0.0.1:abc/db", "is not a database URL"),
        ("postgresql://u@127.0.0.1/", "names no database"),
        ("sqlite+aiosqlite:///x.db", "driver 'aiosqlite' is not one posbias uses"),
    ],
)
def test_urls_and_drivers_are_checked_before_any_driver_is_loaded(url: str, expected: str) -> None:
    with pytest.raises(PosbiasError, match=re.escape(expected)):
        database_url.normalise_url(url)
