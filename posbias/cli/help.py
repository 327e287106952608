"""How `--help` reads: options in groups (each option's `rich_help_panel`, in the order they first appear;
the rest under `Options`, last), and numeric bounds in words (`1 to 200`, `at least 1`) rather than
`[1<=x<=9223372036854775807]`. Applied to the built command tree by `app.run` (`tidy`)."""

from __future__ import annotations

import types
from typing import Any

from posbias.cli.common import IdParser
from posbias.schemas.limits import INT64_MAX

OTHER = "Options"
"""The group of options that name none."""


COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "Jobs": ("submit", "run", "worker", "status", "cancel", "retry"),
    "Results": ("curve", "compare", "explain", "export", "trial", "report", "view"),
    "Models and data": ("models", "datasets", "serve"),
    "Store and schedules": ("db", "schedule"),
}
"""The groups of `posbias --help`'s commands; a command in none is listed under `Other commands`."""


def tidy(command: Any) -> Any:
    """`command` (typer's built command) and its subcommands with grouped options and bounds in words; the
    top command's subcommands in `COMMAND_GROUPS`."""
    _tidy(command)
    if hasattr(command, "list_commands"):
        command.format_commands = types.MethodType(_format_command_groups, command)
    return command


def tidy_options(command: Any) -> Any:
    """`command` and its subcommands with grouped options and bounds in words (a subcommand loaded after
    `tidy` saw the top command)."""
    _tidy(command)
    return command


def _format_command_groups(self: Any, ctx: Any, formatter: Any) -> None:
    names = self.list_commands(ctx)
    limit = formatter.width - 6 - max((len(name) for name in names), default=0)
    placed = {name: group for group, names in COMMAND_GROUPS.items() for name in names}
    rows: dict[str, list[tuple[str, str]]] = {group: [] for group in COMMAND_GROUPS}
    for name in names:
        sub = self.get_command(ctx, name)  # loads a command not yet loaded
        if sub is None or getattr(sub, "hidden", False):
            continue
        rows.setdefault(placed.get(name, "Other commands"), []).append((name, sub.get_short_help_str(limit)))
    for group, found in rows.items():
        if found:
            with formatter.section(group):
                formatter.write_dl(found)


def _tidy(command: Any) -> None:
    command.format_options = types.MethodType(_format_options, command)
    for param in getattr(command, "params", ()):
        if getattr(param, "min", None) is not None or getattr(param, "max", None) is not None:
            param._get_number_range_help_str = _worded(param.min, param.max)
            param.display_type_rich = _plain_type(param.display_type_rich)
        descriptor = getattr(param, "type_descriptor", None)
        parser = getattr(getattr(descriptor, "parameter_info", None), "parser", None)
        if isinstance(parser, IdParser):  # an id read by its own parser: its bounds in words all the same
            param._get_number_range_help_str = _worded(parser.low, parser.high)
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub)


def bounds_in_words(low: float | None, high: float | None) -> str:
    """`1 to 200`, `at least 1`, `at most 5` (a 64-bit limit is no bound a user meets)."""
    if high is not None and high >= INT64_MAX:
        high = None
    if low is not None and high is not None:
        return f"{_number(low)} to {_number(high)}"
    if low is not None:
        return f"at least {_number(low)}"
    if high is not None:
        return f"at most {_number(high)}"
    return ""


def _worded(low: float | None, high: float | None) -> Any:
    return lambda: bounds_in_words(low, high)


def _plain_type(shown: Any) -> Any:
    """`<int>` rather than `<int range>`: the bounds are said in words."""

    def display(ctx: Any) -> Any:
        text = shown(ctx=ctx)
        return text.replace(" range", "") if isinstance(text, str) else text

    return display


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) or float(value).is_integer() else f"{value:g}"


def _format_options(self: Any, ctx: Any, formatter: Any) -> None:
    arguments: list[tuple[str, str]] = []
    groups: dict[str, list[tuple[str, str]]] = {}
    for param in self.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            arguments.append(record)
        elif param.param_type_name == "option":
            groups.setdefault(getattr(param, "rich_help_panel", None) or OTHER, []).append(record)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if OTHER in groups:  # --help and the like, last
        groups[OTHER] = groups.pop(OTHER)
    for panel, records in groups.items():
        with formatter.section(panel):
            formatter.write_dl(records)
    if hasattr(self, "format_commands"):  # a group: its commands, as typer lists them
        self.format_commands(ctx, formatter)
