"""`posbias db upgrade|downgrade|current`: the store's schema (Alembic migrations)."""

from __future__ import annotations

from typing import Annotated

import typer

import posbias
from posbias.cli.common import JsonOpt, err, out, print_json, settings_of
from posbias.cli.errors import BadUsage

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
    as_json: JsonOpt = False,
) -> None:
    """Apply migrations (creates the store if it does not exist).

    A database that holds tables but no posbias schema is refused unless --force.

    Example: posbias db upgrade   (the store is POSBIAS_DATABASE_URL, default sqlite:///posbias.db)
    """
    try:
        version = posbias.upgrade_store(revision, settings=settings_of(ctx), force=force)
    except posbias.RevisionError as exc:
        raise BadUsage(str(exc)) from None
    _print_version(version, as_json=as_json)


@app.command("downgrade")
def db_downgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. -1 or base.")],
    as_json: JsonOpt = False,
) -> None:
    """Revert migrations down to REVISION (`base` removes every table; results are lost).

    Example: posbias db downgrade -1
    """
    try:
        version = posbias.downgrade_store(revision, settings=settings_of(ctx))
    except posbias.RevisionError as exc:
        raise BadUsage(str(exc)) from None
    _print_version(version, as_json=as_json)


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
    version = posbias.store_version(settings=settings_of(ctx), wait=wait, on_waiting=err.print)
    now, head = version.current, version.head
    if as_json:
        print_json(_version_json(version))
    else:
        state = "up to date" if version.up_to_date else "run `posbias db upgrade`"
        out.print(f"current: {now or 'none (never upgraded)'}; newest: {head} ({state})")


def _version_json(version: posbias.StoreVersion) -> dict[str, object]:
    """Where the store's schema stands, for scripts: the store (no password), its revision (None: no
    posbias tables), the newest revision, and whether it is up to date."""
    return {
        "store": version.store,
        "current": version.current,
        "head": version.head,
        "up_to_date": version.up_to_date,
    }


def _print_version(version: posbias.StoreVersion, *, as_json: bool) -> None:
    if as_json:
        print_json(_version_json(version))
    else:
        out.print(_in_words(version))


def _in_words(version: posbias.StoreVersion) -> str:
    """Where the store's schema stands, in words (the revision numbers in brackets)."""
    if version.current is None:
        return f"the store {version.store} holds no posbias tables (every one removed)"
    if version.up_to_date:
        return f"the store {version.store} is ready: its schema is this posbias's newest ({version.head})"
    return (
        f"the store {version.store} has an older schema ({version.current}; this posbias's newest is "
        f"{version.head}): `posbias db upgrade` brings it up to date"
    )
