"""The store's schema version, as `posbias db` manages it, and what a failure of the store means.

    import posbias

    posbias.upgrade_store()  # create the store, or migrate it to the newest revision
    print(posbias.store_version().up_to_date)

The store is `settings.database_url` (`POSBIAS_DATABASE_URL`); `settings` defaults to this environment's.
Alembic is imported only by `upgrade_store` and `downgrade_store`: reading the revision does without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from posbias import edge
from posbias.schemas import PosbiasError, one_line
from posbias.service.settings import Settings
from posbias.service.store import database_url, migrate, schema_version, store_errors

WAIT_POLL_S = 5.0
"""How often `store_version(wait=...)` looks again."""


@dataclass(frozen=True)
class StoreVersion:
    """Where a store's schema stands."""

    store: str
    """The store as it may be shown: its URL without the password."""
    current: str | None
    """Its schema revision; None when it was never upgraded."""
    head: str
    """The newest revision this posbias knows."""

    @property
    def up_to_date(self) -> bool:
        """True when the store is at the newest revision."""
        return self.current == self.head


@edge.public
def upgrade_store(
    revision: str = "head", *, settings: Settings | None = None, force: bool = False
) -> StoreVersion:
    """Apply migrations up to `revision`, creating the store if it does not exist. A database that holds
    another application's tables and no posbias schema is refused unless `force`. `RevisionError` for a
    revision Alembic does not know."""
    revision = edge.text(revision, what="revision")
    force = edge.typed(force, bool, what="force", kind="True or False")
    url = edge.resolve_settings(settings).database_url
    migrate.upgrade(url, revision, force=force)
    return _version(url)


@edge.public
def downgrade_store(revision: str, *, settings: Settings | None = None) -> StoreVersion:
    """Revert migrations down to `revision` (e.g. `-1`; `base` removes every table, and the results with
    them). `RevisionError` for a revision Alembic does not know."""
    revision = edge.text(revision, what="revision")
    url = edge.resolve_settings(settings).database_url
    migrate.downgrade(url, revision)
    return _version(url)


@edge.public
def store_version(
    *,
    settings: Settings | None = None,
    wait: float | None = None,
    on_waiting: Callable[[str], None] | None = None,
) -> StoreVersion:
    """The store's schema revision and the newest this posbias knows. With `wait`, up to that many seconds
    for the store to reach the newest (another process migrating it, e.g. the migration Job), looking every
    `WAIT_POLL_S` seconds and calling `on_waiting` with a line that says why it is not ready yet;
    `PosbiasError` when it does not get there in time."""
    wait = None if wait is None else edge.seconds(wait, what="wait")
    url = edge.resolve_settings(settings).database_url
    head = schema_version.head()
    if wait is not None:
        now = _wait_for(url, head=head, seconds=wait, on_waiting=on_waiting)
    else:
        now = migrate.current(url)
    return StoreVersion(store=database_url.describe(database_url.normalise_url(url)), current=now, head=head)


def store_problem(exc: BaseException, *, settings: Settings | None = None) -> str | None:
    """What a failure of the store (the database or its driver) means, on one line that names the fix and
    never the SQL statement or its parameters; None when `exc` is no store failure. The line names the
    store of `settings` (default: this environment's, when it can be read)."""
    if not isinstance(exc, store_errors.STORE_ERRORS):
        return None
    try:
        url: str | None = edge.resolve_settings(settings).database_url
    except PosbiasError:  # the settings cannot be read: the line names no store
        url = None
    return str(store_errors.explain(exc, url=url))


def _version(url: str) -> StoreVersion:
    shown = database_url.describe(database_url.normalise_url(url))
    return StoreVersion(store=shown, current=migrate.current(url), head=schema_version.head())


def _wait_for(url: str, *, head: str, seconds: float, on_waiting: Callable[[str], None] | None) -> str | None:
    """The store's revision once it is `head`; `PosbiasError` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            now = migrate.current(url)
            problem = f"it is at {now or 'no revision (never upgraded)'}"
        except Exception as exc:  # unreachable yet (the database or its DNS name still starting)
            now, problem = None, f"it cannot be read ({one_line(exc, typed=True)})"
        if now == head:
            return now
        if time.monotonic() >= deadline:
            raise PosbiasError(
                f"the store did not reach revision {head} within {seconds:.0f} s ({problem}); run "
                "`posbias db upgrade` (the migration Job) with this release"
            )
        if on_waiting is not None:
            on_waiting(f"waiting for the store to reach revision {head}: {problem}")
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
