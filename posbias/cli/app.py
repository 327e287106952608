"""The `posbias` command: the app, its global options, and its entry point (`main`, `run`).

Every command reads the one `Settings` (environment `POSBIAS_*`, or `.env`), parses its flags, makes one call
to the Python API (`import posbias`) and renders what comes back. Whatever goes wrong becomes one line on
stderr: `posbias/cli/errors.py` says which line and which exit code.
"""

from __future__ import annotations

import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Annotated, NoReturn

import typer

from posbias.cli import compare, curves, db, errors, explain, export, jobs, models, schedule, submit, worker
from posbias.cli import datasets as datasets_command
from posbias.cli import help as help_format
from posbias.cli import report as report_command
from posbias.cli import serve as serve_command
from posbias.cli import trial as trial_command
from posbias.cli.common import SettingsLoader, err, out
from posbias.schemas import RotationCostWarning

app = typer.Typer(
    name="posbias",
    help="Measure how an LLM's accuracy depends on where a question sits in a long prompt.\n\n"
    "Quick try without a model:  posbias run --engine fake --batch-sizes 1,10,50 --iterations 50",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for module in (submit, worker, jobs, curves, compare, explain, export, models, trial_command):
    module.register(app)
report_command.register(app)
for extra in (datasets_command, serve_command):
    extra.register(app)
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
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", help="Show Ray's notices and its workers' logs (otherwise kept in Ray's log folder)."
        ),
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    changes = {key: True for key, on in (("debug", debug), ("verbose", verbose)) if on}
    # Read when a command first needs them, after its flags are parsed: a usage error comes before the
    # imports that reading them costs (the API, the store's drivers).
    ctx.obj = SettingsLoader(changes)


def main() -> NoReturn:
    """Console-script entry point: run the app, map errors to one line and an exit code."""
    sys.exit(run(sys.argv[1:]))


def run(args: Sequence[str]) -> int:
    """Run `posbias ARGS...` and return its exit code; every error is one line on stderr (`error: ...`).

    With `--debug` among the arguments, tracebacks too.
    """
    command = help_format.tidy(typer.main.get_command(app))
    debug = "--debug" in args
    try:
        with warnings.catch_warnings():
            if not debug:
                # A library's warning is not the user's business; --debug shows them.
                warnings.simplefilter("ignore")
            warnings.simplefilter("ignore", RotationCostWarning)  # shown by submit itself
            code = command.main(args=list(args), prog_name="posbias", standalone_mode=False)
    except BaseException as exc:
        said, code = errors.line(exc)
        if debug and said is not None:
            traceback.print_exc()
        if said is not None:
            err.print(f"error: {said}" if said != "aborted" else said, markup=False, soft_wrap=True)
    return code if isinstance(code, int) else 0
