"""A SQLite store read as columns keeps its locks (service/store/columns.py's docstring): ADBC's driver has a
copy of SQLite of its own, and closing its descriptors drops the locks Python's `sqlite3` holds in the same
process, so another process's close would delete the `-shm` this one still has mapped, and the store's next
transaction would stop on "the store's shared-memory file was deleted"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from posbias.service.store import columns, database
from posbias.service.store.tables import Job

pytest.importorskip("adbc_driver_sqlite")

ANOTHER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
connection.execute("SELECT count(*) FROM jobs").fetchall()
connection.close()
"""


def _jobs(db: database.Database) -> int:
    with db.read() as session:
        return int(session.execute(select(func.count()).select_from(Job)).scalar_one())


def test_a_store_read_as_columns_while_another_process_comes_and_goes_keeps_working(sqlite_url: str) -> None:
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    shm = path.with_name(path.name + "-shm")
    with database.connect(sqlite_url, read_only=True) as db:
        assert _jobs(db) == 0  # the session's connection has the -shm mapped from here on
        for _ in range(2):  # the second query is lent the reader the first one opened
            (batch,) = columns.record_batches(db, select(func.count().label("n")).select_from(Job))
            assert batch.column("n").to_pylist() == [0]
        assert len(db.held) == 1
        inode = shm.stat().st_ino
        subprocess.run([sys.executable, "-c", ANOTHER, str(path)], check=True, timeout=60)
        assert shm.exists() and shm.stat().st_ino == inode, "another process's close deleted the -shm in use"
        assert _jobs(db) == 0  # no "shared-memory file was deleted"
    assert db.held == []
