"""A SQLite store's files while posbias has them open, and what must not change under it.

The database file must stay the file that was opened: one deleted or replaced (`rm`, `mv`, a restore from a
backup) keeps taking commits on the open descriptor, which then vanish with the old file, while a new
connection would write to the new file. So a write transaction counts only if the path names the opened file
(device and inode) before and after its commit.

The wal-index (`-shm`) is mapped into memory by every connection in WAL mode. Once that file is truncated,
replaced or made unwritable, SQLite's next touch of the mapping is a SIGBUS that kills the process (no
exception, a native dump), and the last connection's close touches it to checkpoint. So the files are checked
before each transaction begins, and once they have failed a check no connection is closed: the process ends
with them open, as after a crash, which SQLite recovers from on the next open (the WAL keeps every commit).
What no check in the process can catch: a `-shm` truncated while a transaction is inside SQLite faults there,
before control returns to posbias (seen under load in the suite), so a truncation is caught when it lands
between transactions; a file made unwritable keeps its mapping and is always caught.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.service.store.store_errors import Problem, StoreError

WAL_INDEX_REGION = 32768
"""Bytes SQLite maps of the wal-index at a time: a mapped `-shm` is never smaller."""


@dataclass(frozen=True)
class FileState:
    """A file as `stat` saw it."""

    device: int
    inode: int
    size: int

    @classmethod
    def of(cls, path: Path) -> FileState | None:
        """`path`'s state now; None when there is no file there."""
        try:
            found = path.stat()
        except FileNotFoundError:
            return None
        return cls(device=found.st_dev, inode=found.st_ino, size=found.st_size)

    def same_file(self, other: FileState | None) -> bool:
        """`other` is this file (it may have grown)."""
        return other is not None and (other.device, other.inode) == (self.device, self.inode)


class SqliteFiles:
    """The database file a store opened, its wal-index as last seen mapped, and whether either has failed a
    check (then every later transaction is refused and no connection is closed)."""

    def __init__(self, path: Path) -> None:
        """Record `path` (an existing SQLite file, checked by the caller) as the file the store opens."""
        self.path = path
        self.shm = path.with_name(path.name + "-shm")
        opened = FileState.of(path)
        if opened is None:
            raise StoreError(f"there is no database at {path}", problem=Problem.unreachable)
        self.opened = opened
        self.failure: StoreError | None = None
        """The first failed check, raised again for every later transaction."""
        self.unsafe_to_close = False
        """The wal-index mapping would fault: closing the last connection (a checkpoint) would kill us."""
        self._mapped: FileState | None = None
        """The wal-index as last seen while this store had connections open (so SQLite had it mapped)."""
        self._mapped_writable = False
        self._connections = 0
        self._lock = threading.Lock()

    # --- the database file ----------------------------------------------------------------------------

    def check_database(self) -> None:
        """Raise `StoreError` unless the path still names the file that was opened."""
        if self.failure is not None:
            raise self.failure
        now = FileState.of(self.path)
        if not self.opened.same_file(now):
            what = "deleted" if now is None else "replaced by another file"
            self._fail(
                f"the database file {self.path} was {what} while posbias had it open: nothing more is "
                "written to it, and what was being written is not stored (leases lapse and the work is "
                "redone); point POSBIAS_DATABASE_URL at the store to use and run the command again"
            )

    # --- the wal-index --------------------------------------------------------------------------------

    def check_before_transaction(self) -> None:
        """Raise `StoreError` when the database file or its wal-index is no longer what SQLite has open or
        mapped, before SQLite touches the mapping again."""
        self.check_database()
        now = FileState.of(self.shm)
        with self._lock:
            mapped = self._mapped
        problem = None
        if mapped is not None and not mapped.same_file(now):
            problem = "was deleted" if now is None else "was replaced by another file"
        elif now is not None and mapped is not None and now.size < mapped.size:
            problem = "was truncated"
            self.unsafe_to_close = True
        elif now is not None and self._mapped_writable and not os.access(self.shm, os.W_OK):
            # Mapped for writing: the next write through the mapping faults. (A store the user may only read
            # has it mapped read-only from the start, which SQLite handles itself.)
            problem = "is no longer writable"
            self.unsafe_to_close = True
        if problem is not None:
            self._fail(
                f"the store's shared-memory file {self.shm} {problem} while posbias had the database open: "
                "stop every process using the store, make that file writable or remove it, and run the "
                "command again (SQLite rebuilds it from the database and its -wal file)"
            )
        if now is not None and now.size >= WAL_INDEX_REGION:
            with self._lock:
                if self._connections and (mapped is None or now.size > mapped.size):
                    self._mapped = now
                    self._mapped_writable = os.access(self.shm, os.W_OK)

    def close_safely(self) -> bool:
        """Before a connection closes: True when it may be closed, False when it must stay open (closing the
        last one checkpoints through a mapping that would fault)."""
        if not self.unsafe_to_close and self.failure is None:
            with contextlib.suppress(StoreError):  # remembered in `failure`; a close has no one to tell
                self.check_before_transaction()
        return not self.unsafe_to_close

    def connection_factory(self) -> Any:
        """The `factory` for `sqlite3.connect`: connections counted while open (the wal-index is mapped only
        then), and kept open once the files have failed a check (`close_safely`)."""
        files = self
        # Bound now: a connection freed as the interpreter ends may find the module's globals gone.
        keep = ctypes.pythonapi.Py_IncRef
        as_object = ctypes.py_object

        class Connection(sqlite3.Connection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._posbias_open = True
                with files._lock:
                    files._connections += 1

            def __del__(self) -> None:
                # Freed without `close` (the interpreter ending with the store open): SQLite's close runs
                # next, unless a check has found it unsafe; then the object is kept, never freed.
                if getattr(self, "_posbias_open", False):
                    if files.unsafe_to_close:
                        keep(as_object(self))
                    else:
                        files._forget_connection()

            def close(self) -> None:
                if not getattr(self, "_posbias_open", False):
                    return
                if not files.close_safely():
                    # Never closed nor freed: the process ends with it open, as a crash would leave it.
                    keep(as_object(self))
                    return
                self._posbias_open = False
                files._forget_connection()
                super().close()

        return Connection

    def _forget_connection(self) -> None:
        with self._lock:
            self._connections -= 1
            if not self._connections:
                self._mapped = None  # SQLite unmaps it with the last connection
                self._mapped_writable = False

    def _fail(self, message: str) -> None:
        self.failure = StoreError(message, problem=Problem.changed)
        raise self.failure
