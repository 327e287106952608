"""The `posbias` command: the app, its global options, and the one place where errors become a line.

Every command reads the one `Settings` (environment `POSBIAS_*`, or `.env`), parses its flags, makes one call
to the Python API (`posbias.api`) and renders what comes back. Whatever goes wrong becomes one line on
stderr (`run` below): exit code 2 for bad usage, 1 for everything else. A store error names the fix, never
the SQL statement or its parameters; a bug (an exception posbias did not expect) says so and asks for
`--debug`, which shows every traceback.
"""

from __future__ import annotations

import errno
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Annotated, NoReturn

import typer
from typer.exceptions import TyperException

from posbias.cli import curves, db, explain, export, jobs, models, schedule, submit, worker
from posbias.cli.common import BadUsage, err, out
from posbias.schemas import PosbiasError, RotationCostWarning, one_line
from posbias.service import database
from posbias.service.settings import load_settings

INTERNAL = "internal error"
"""How a line about a bug begins (after `error: `): the fuzz programs count these."""

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
        settings = load_settings()
        database.normalise_url(settings.database_url)  # a malformed URL is a setting to fix: exit 2
    except PosbiasError as exc:
        raise BadUsage(str(exc)) from None
    ctx.obj = settings.model_copy(update={"debug": True}) if debug else settings


def main() -> NoReturn:
    """Console-script entry point: run the app, map errors to one line and an exit code."""
    sys.exit(run(sys.argv[1:]))


def run(args: Sequence[str]) -> int:
    """Run `posbias ARGS...` and return its exit code; every error is one line on stderr (`error: ...`).

    With `--debug` among the arguments, tracebacks too.
    """
    command = typer.main.get_command(app)
    debug = "--debug" in args
    try:
        with warnings.catch_warnings():
            if not debug:
                # A library's warning is not the user's business; --debug shows them.
                warnings.simplefilter("ignore")
            warnings.simplefilter("ignore", RotationCostWarning)  # shown by submit itself
            code = command.main(args=list(args), prog_name="posbias", standalone_mode=False)
    except BaseException as exc:
        line, code = _line(exc)
        if debug and line is not None:
            traceback.print_exc()
        if line is not None:
            err.print(f"error: {line}" if line != "aborted" else line, markup=False, soft_wrap=True)
    return code if isinstance(code, int) else 0


def _line(exc: BaseException) -> tuple[str | None, int]:
    """What the user reads about `exc` (None: nothing) and the exit code."""
    if isinstance(exc, typer.Exit):
        return None, int(getattr(exc, "exit_code", 0))
    if isinstance(exc, KeyboardInterrupt | typer.Abort):
        return "aborted", 130
    if isinstance(exc, SystemExit):
        return None, exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, TyperException):  # click's usage errors (typer vendors click)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return f"{_flat(message)}{hint}", int(getattr(exc, "exit_code", 2))
    if isinstance(exc, PosbiasError):
        return _flat(str(exc)), 2 if isinstance(exc, BadUsage) else 1
    if isinstance(exc, database.STORE_ERRORS):
        return str(database.explain(exc, url=_store_url())), 1
    if isinstance(exc, OSError):
        return _os_error(exc), 1
    if isinstance(exc, RecursionError):
        return "the input nests too deeply to be read (rerun with --debug to see where)", 1
    if isinstance(exc, MemoryError):
        return "out of memory: the input or the job is too large for this machine", 1
    return (
        f"{INTERNAL}: {one_line(exc, typed=True)} (a bug in posbias: rerun with --debug for the traceback "
        "and report it)",
        1,
    )


def _flat(text: str) -> str:
    return " ".join(text.split())


def _os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device{where}: free some space and run the command again"
    if exc.errno in {errno.EACCES, errno.EPERM, errno.EROFS}:
        return f"{exc.strerror}{where}: check its permissions, or choose another path"
    return f"{exc.strerror or one_line(exc, typed=True)}{where}"


def _store_url() -> str | None:
    try:
        return load_settings().database_url
    except PosbiasError:
        return None
