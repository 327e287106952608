"""The `posbias` command: the app, its global options, and the one place where errors become a line.

Every command reads the one `Settings` (environment `POSBIAS_*`, or `.env`), parses its flags, makes one call
to the Python API (`posbias.api`) and renders what comes back. `PosbiasError` becomes one line on stderr with
exit code 1 (2 for bad usage); tracebacks only with `--debug`.
"""

from __future__ import annotations

import sys
import traceback
import warnings
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError
from typer.exceptions import TyperException

from posbias.schemas import PosbiasError, RotationCostWarning
from posbias.schemas.job import describe_validation_error
from posbias.service.cli import curves, db, explain, export, jobs, models, schedule, submit, worker
from posbias.service.cli.common import BadUsage, err, out
from posbias.service.settings import Settings

app = typer.Typer(
    name="posbias",
    help="Measure how an LLM's accuracy depends on where a question sits in a long prompt.\n\n"
    "Quick try without a model:  posbias run --engine fake --batch-sizes 1,10,50 --iterations 50",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for module in (submit, worker, jobs, curves, explain, export, models):
    module.register(app)
app.add_typer(db.app, name="db")
app.add_typer(schedule.app, name="schedule")


def _version() -> str:
    from importlib.metadata import version

    return version("posbias")


def _print_version(value: bool) -> None:
    if value:
        out.print(_version())
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and engine logs.")] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    try:
        settings = Settings()
    except ValidationError as exc:
        raise BadUsage(f"invalid POSBIAS_* setting: {describe_validation_error(exc)}") from None
    ctx.obj = settings.model_copy(update={"debug": True}) if debug else settings


def main() -> NoReturn:
    """Console-script entry point: run the app, map errors to one line and an exit code."""
    command = typer.main.get_command(app)
    debug = "--debug" in sys.argv
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RotationCostWarning)  # shown by submit itself
            code = command.main(standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        err.print("aborted")
        code = 130
    except TyperException as exc:  # click's usage errors (typer vendors click)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        err.print(f"error: {exc.format_message()}{hint}")
        code = int(getattr(exc, "exit_code", 2))
    except PosbiasError as exc:
        if debug:
            traceback.print_exc()
        err.print(f"error: {exc}")
        code = 2 if isinstance(exc, BadUsage) else 1
    sys.exit(code if isinstance(code, int) else 0)
