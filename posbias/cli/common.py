"""What every command module shares: the two consoles, the settings of a command, common arguments, JSON
output, and how numbers are written. Usage errors are in `errors.py`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

import posbias
from posbias.schemas.errors import UsageError
from posbias.schemas.ids import ID_MAX, parse_id
from posbias.schemas.limits import MAX_BATCH_SIZE

if TYPE_CHECKING:
    from posbias.schemas import LayerConfig

out = Console(highlight=False, soft_wrap=True)
"""Standard output: what the command produces (tables, JSON, CSV)."""
err = Console(stderr=True, highlight=False, soft_wrap=True)
"""Standard error: progress, warnings, errors."""

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


class IdParser:
    """The `parser` of an id flag or argument: `schemas.ids.parse_id` (ASCII digits only, where typer's `int`
    reads a full-width 2 as 2 and `1_0` as 10), its refusal a usage error (exit 2) naming `what`. Its bounds
    are `low` to `high`, which `--help` says in words (`help.py`), as it does for typer's own `min`/`max`."""

    low = 1
    high = ID_MAX

    def __init__(self, what: str) -> None:
        self.what = what
        self.__name__ = what  # click names a parser's type by it

    def __call__(self, text: str) -> int:
        try:
            return parse_id(text, what=self.what)
        except UsageError as exc:
            raise typer.BadParameter(str(exc)) from None


def id_parser(what: str) -> Callable[[str], int]:
    """An `IdParser` for ids named `what` (`job id`, `trial id`)."""
    return IdParser(what)


JobArg = Annotated[int, typer.Argument(help="Job id.", parser=id_parser("job id"))]
BatchSizeOpt = Annotated[
    int | None, typer.Option(help="One batch size (default: every one).", min=1, max=MAX_BATCH_SIZE)
]


class SettingsLoader:
    """The one `Settings` of a command, read on first use (`settings_of`), with the global flags' changes."""

    def __init__(self, changes: Mapping[str, Any]) -> None:
        self._changes = dict(changes)
        self._settings: posbias.Settings | None = None

    def load(self) -> posbias.Settings:
        """The settings; an invalid setting or a malformed URL is a usage error (exit 2)."""
        if self._settings is None:
            from posbias.cli.errors import BadUsage
            from posbias.schemas import PosbiasError

            try:
                settings = posbias.load_settings()
            except PosbiasError as exc:
                raise BadUsage(str(exc)) from None
            self._settings = settings.model_copy(update=self._changes) if self._changes else settings
        return self._settings


def settings_of(ctx: typer.Context) -> posbias.Settings:
    """The one `Settings` of this command (read once, when first asked for)."""
    found = ctx.obj
    if isinstance(found, SettingsLoader):
        return found.load()
    settings: posbias.Settings = found
    return settings


def print_json(data: Any) -> None:
    """`data` as JSON on standard output (datetimes and paths as strings), indented by two; coloured on a
    terminal. To a pipe or a file it is written as is: the same text rich would write, without its
    rendering, which takes seconds for a few megabytes (a dry run over 5,000 filler lengths)."""
    compact = json.dumps(data, default=str)
    if out.is_terminal:
        out.print_json(compact)
        return
    # rich's JSON re-reads the text and indents it so; strings never hold a raw control character it strips.
    out.file.write(json.dumps(json.loads(compact), indent=2, ensure_ascii=False) + "\n")


def num(value: float | None) -> str:
    """A number to 6 significant digits; empty when unknown."""
    return "" if value is None else f"{value:.6g}"


def pct(value: float | None) -> str:
    """A proportion as a percentage; `-` when unknown."""
    return "-" if value is None else f"{100 * value:.1f}%"


def pp(value: float | None) -> str:
    """A difference of proportions in percentage points, signed; `-` when unknown."""
    return "-" if value is None else f"{100 * value:+.2f} pts"


def text(value: object) -> str:
    """A value for a table cell; empty when None."""
    return "" if value is None else str(value)


def describe_variant(expect: LayerConfig | None, *, fake: Mapping[str, Any] | None = None) -> str:
    """What a variant asks, in words: the layers it expects vLLM to build, or its fake engine's changes."""
    if expect is not None:
        return expect.describe()
    if fake:
        return "fake engine with " + ", ".join(f"{key} {value}" for key, value in fake.items())
    return "the model as published (recorded, not checked)"
