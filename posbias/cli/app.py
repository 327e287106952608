"""The `posbias` command: the app, its global options, and its entry point (`main`, `run`).

Every command reads the one `Settings` (environment `POSBIAS_*`, or `.env`), parses its flags, makes one call
to the Python API (`import posbias`) and renders what comes back. Whatever goes wrong becomes one line on
stderr: `posbias/cli/errors.py` says which line and which exit code.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from posbias import startup
from posbias.cli import errors
from posbias.cli import help as help_format
from posbias.cli.common import SettingsLoader, err, out
from posbias.schemas.errors import RotationCostWarning

COMMANDS: dict[str, str] = {
    "submit": "submit",
    "run": "submit",
    "worker": "worker",
    "status": "jobs",
    "cancel": "jobs",
    "retry": "jobs",
    "curve": "curves",
    "compare": "compare",
    "explain": "explain",
    "diagnose": "diagnose",
    "export": "export",
    "trial": "trial",
    "report": "report",
    "view": "report",
    "datasets": "datasets",
    "serve": "serve",
    "models": "models",
    "db": "db",
    "schedule": "schedule",
}
"""Each command and the module of `posbias.cli` that declares it (its `register`, or its `app` for `db` and
`schedule`), in the order `posbias --help` lists them."""


class _Commands(TyperGroup):
    """The top command, whose subcommands are imported when asked for: a command's flags are parsed, and a
    usage error said, before the other commands' imports (the records, the API) are paid for."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            for name, command in _declared(COMMANDS[cmd_name]).items():
                self.add_command(help_format.tidy_options(command), name)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except TyperException as exc:
            # typer suggests among the commands loaded so far; the names are all known without loading.
            message = getattr(exc, "message", None)
            if isinstance(message, str) and args and "Did you mean" not in message:
                matches = difflib.get_close_matches(args[0], self.list_commands(ctx))
                if matches:
                    suggested = ", ".join(repr(m) for m in matches)
                    setattr(exc, "message", f"{message.rstrip('.')}. Did you mean {suggested}?")  # noqa: B010
            raise


def _declared(module_name: str) -> dict[str, Any]:
    """The commands one module of `posbias.cli` declares, built as typer builds an app's."""
    module: Any = importlib.import_module(f"posbias.cli.{module_name}")
    holder = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)
    if hasattr(module, "register"):
        module.register(holder)
    else:
        holder.add_typer(module.app, name=module_name)
    return dict(typer.main.get_group(holder).commands)


app = typer.Typer(
    name="posbias",
    help="Measure how an LLM's accuracy depends on where a question sits in a long prompt.\n\n"
    "Quick try without a model:  posbias run --engine fake --batch-sizes 1,10,50 --iterations 50",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=_Commands,
)


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
    startup.begin()
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
        shown = errors.help_asked(exc)
        if shown is not None:  # `posbias` or `posbias db` alone: the help as it reads, then the one line
            out.print(shown, markup=False, highlight=False)
            path = getattr(getattr(exc, "ctx", None), "command_path", "posbias")
            err.print(f"error: name a command (listed above; `{path} COMMAND --help` for one)", markup=False)
            return 2
        said, code = errors.line(exc)
        if debug and said is not None:
            traceback.print_exc()
        if said is not None:
            err.print(f"error: {said}" if said != "aborted" else said, markup=False, soft_wrap=True)
    return code if isinstance(code, int) else 0
