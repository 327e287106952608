"""`posbias db upgrade|downgrade|current`: the store's schema (Alembic migrations)."""

from __future__ import annotations

from typing import Annotated

import typer

from posbias.service import database
from posbias.service.cli.common import BadUsage, JsonOpt, out, print_json, settings_of

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
def db_current(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Print the store's migration revision and the newest this posbias knows.

    Example: posbias db current --json
    """
    url = settings_of(ctx).database_url
    now, head = database.current(url), database.head()
    if as_json:
        print_json({"current": now, "head": head, "up_to_date": now == head})
    else:
        state = "up to date" if now == head else "run `posbias db upgrade`"
        out.print(f"current: {now or 'none (never upgraded)'}; newest: {head} ({state})")
