"""The viewer's built pages: each built once per change of the store, however many ask for it at once.

A page is keyed by what it shows (its job ids) and by a change token of the store read before it is built.
A request whose token matches a built page gets that page; requests that arrive while the page for their
token is being built wait for that one build (a single flight) instead of starting their own; a new token
(anything committed to the store since) builds the page again, once.

The token is what the store offers to say "nothing was committed since", across processes:

- SQLite: `PRAGMA data_version` on one connection held for the purpose. It changes whenever another
  connection, in this process or any other, commits to the file (the number means nothing compared across
  connections, hence the one held connection), with the file's identity, so that a file replaced under the
  viewer is seen.
- PostgreSQL: the current snapshot (`xmin:xmax:in-progress xids`). Two equal snapshots see the same committed
  transactions, so the same data; any write transaction that starts or ends changes it. It covers the whole
  server, so a write to another database there invalidates too (a rebuild, never a stale page).

Either token moves on any commit (a running worker's heartbeat too): the price of a token that costs one
statement and never misses a change is that a page may be built again when nothing it shows moved.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from posbias.service.store import Database

PAGES_KEPT = 16
"""Built pages the viewer keeps (a page of a 1M-result job is a few MB)."""


@dataclass
class _Flight:
    """One build in progress: the requests that wait for it, and what it made (or raised)."""

    done: threading.Event = field(default_factory=threading.Event)
    page: bytes = b""
    error: BaseException | None = None

    def wait(self) -> bytes:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.page


class PageCache:
    """Pages by key, each built once per token: `get(key, token=..., build=...)`. Thread-safe."""

    def __init__(self, *, kept: int = PAGES_KEPT) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        self._built: OrderedDict[Hashable, tuple[Hashable, bytes]] = OrderedDict()
        self._flights: dict[tuple[Hashable, Hashable], _Flight] = {}

    def get(self, key: Hashable, *, token: Hashable, build: Callable[[], bytes]) -> bytes:
        """The page for `key` built at `token`: the kept one, the one being built (waited for), or one
        built now by calling `build` (read the token before, so the page is at least as new). An error
        of `build` reaches every request that waited for it, and nothing is kept."""
        with self._lock:
            kept = self._built.get(key)
            if kept is not None and kept[0] == token:
                self._built.move_to_end(key)
                return kept[1]
            flight = self._flights.get((key, token))
            leader = flight is None
            if flight is None:
                flight = self._flights[(key, token)] = _Flight()
        if not leader:
            return flight.wait()
        try:
            flight.page = build()
        except BaseException as exc:
            flight.error = exc
            raise
        else:
            with self._lock:
                self._built[key] = (token, flight.page)
                self._built.move_to_end(key)
                while len(self._built) > self._kept:
                    self._built.popitem(last=False)
        finally:
            with self._lock:
                del self._flights[(key, token)]
            flight.done.set()
        return flight.page


class StoreChanges:
    """The store's change token (`token()`), read with one statement; `close()` lets its connection go."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._held: Any = None
        self._file = ""

    def token(self) -> Hashable:
        """Equal to an earlier token only when nothing was committed to the store between the two."""
        if self._db.dialect == "postgresql":
            return self._snapshot()
        with self._lock:
            if self._held is None:
                self._held = self._db.engine.raw_connection()
                self._file = str(self._query("PRAGMA database_list")[2])  # main's file ("": in memory)
            version = int(self._query("PRAGMA data_version")[0])
        try:
            found = os.stat(self._file) if self._file else None
        except OSError:  # gone: the build that follows says so
            found = None
        return (found.st_dev, found.st_ino) if found else None, version

    def _query(self, statement: str) -> Any:
        cursor = self._held.driver_connection.cursor()
        try:
            return cursor.execute(statement).fetchone()
        finally:
            cursor.close()

    def _snapshot(self) -> str:
        with self._db.engine.connect() as connection:
            info = connection.dialect.server_version_info or (0,)
            function = "pg_current_snapshot" if info >= (13,) else "txid_current_snapshot"
            return str(connection.execute(text(f"SELECT {function}()::text")).scalar_one())

    def close(self) -> None:
        """Give the held connection back."""
        with self._lock:
            if self._held is not None:
                self._held.close()
                self._held = None
