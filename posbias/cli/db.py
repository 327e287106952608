"""`posbias db upgrade|downgrade|current`: the store's schema (Alembic migrations)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from posbias.cli.common import BadUsage, JsonOpt, err, out, print_json, settings_of
from posbias.schemas import PosbiasError, one_line
from posbias.service import database

app = typer.Typer(help="Create, upgrade or inspect the store's schema.", no_args_is_help=True)


@app.command("upgrade")
def db_upgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    force: Annotated[
        bool,
        typer.Option(
            help="Add posbias's tables to a database that already holds another application's tables."
        ),
    ] = False,
) -> None:
    """Apply migrations (creates the store if it does not exist).

    A database that holds tables but no posbias schema is refused unless --force.

    Example: posbias db upgrade   (the store is POSBIAS_DATABASE_URL, default sqlite:///posbias.db)
    """
    url = settings_of(ctx).database_url
    try:
        database.upgrade(url, revision, force=force)
    except database.RevisionError as exc:
        raise BadUsage(str(exc)) from None
    out.print(f"{database.describe(database.normalise_url(url))} is at {database.current(url) or 'base'}")


@app.command("downgrade")
def db_downgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. -1 or base.")],
) -> None:
    """Revert migrations down to REVISION (`base` removes every table; results are lost).

    Example: posbias db downgrade -1
    """
    url = settings_of(ctx).database_url
    try:
        database.downgrade(url, revision)
    except database.RevisionError as exc:
        raise BadUsage(str(exc)) from None
    out.print(f"{database.describe(database.normalise_url(url))} is at {database.current(url) or 'base'}")


@app.command("current")
def db_current(
    ctx: typer.Context,
    wait: Annotated[
        float | None,
        typer.Option(
            help="Wait up to this many seconds for the store to reach the newest revision (another process "
            "migrating it, e.g. the migration Job); exit 1 if it does not.",
            min=0,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the store's migration revision and the newest this posbias knows.

    Example: posbias db current --wait 600   (an init container: start only on a migrated store)
    """
    url = settings_of(ctx).database_url
    head = database.head()
    now = _wait_for(url, head=head, seconds=wait) if wait is not None else database.current(url)
    if as_json:
        print_json({"current": now, "head": head, "up_to_date": now == head})
    else:
        state = "up to date" if now == head else "run `posbias db upgrade`"
        out.print(f"current: {now or 'none (never upgraded)'}; newest: {head} ({state})")


def _wait_for(url: str, *, head: str, seconds: float) -> str | None:
    """The store's revision once it is `head`, polling every 5 s; `PosbiasError` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            now = database.current(url)
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
        err.print(f"waiting for the store to reach revision {head}: {problem}")
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
