"""Where the `posbias` command turns whatever went wrong into one line on stderr and an exit code.

Exit code 2 for bad usage (`UsageError`s: the API's and the command's own `BadUsage`, and click's usage
errors), 130 for an interrupt, 1 for everything else. A
store error names the fix, never the SQL statement or its parameters; a bug (an exception posbias did not
expect) says so and asks for `--debug`, which shows every traceback (`app.run`).
"""

from __future__ import annotations

import typer
from typer.exceptions import TyperException

import posbias
from posbias.schemas.errors import PosbiasError, UsageError, foreign_problem, one_line

INTERNAL = "internal error"
"""How a line about a bug begins (after `error: `): the fuzz programs count these."""


class BadUsage(UsageError):
    """A flag or argument the user must change: exit code 2."""


def line(exc: BaseException) -> tuple[str | None, int]:
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
        return _flat(str(exc)), 2 if isinstance(exc, UsageError) else 1
    # The API raises these as PosbiasErrors with the same line; here for the command's own reads and writes.
    foreign = foreign_problem(exc)
    if foreign is not None:
        return foreign, 1
    # The store's errors (SQLAlchemy's, the drivers') are none of the above.
    problem = posbias.store_problem(exc)
    if problem is not None:
        return problem, 1
    return (
        f"{INTERNAL}: {one_line(exc, typed=True)} (a bug in posbias: rerun with --debug for the traceback "
        "and report it)",
        1,
    )


def help_asked(exc: BaseException) -> str | None:
    """The help typer raises, as a usage error, for a group run with no command (`posbias`, `posbias db`);
    None for any other exception."""
    if isinstance(exc, TyperException) and type(exc).__name__ == "NoArgsIsHelpError":
        return exc.format_message() if hasattr(exc, "format_message") else str(exc)
    return None


def _flat(text: str) -> str:
    return " ".join(text.split())
