"""`posbias datasets`: the datasets `--dataset NAME` takes, with their option counts and local copies."""

from __future__ import annotations

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JsonOpt, out, print_json, settings_of


def register(app: typer.Typer) -> None:
    """Add `datasets` to the app."""
    app.command()(datasets)


def datasets(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The named datasets (`--dataset NAME`): hub id, split, options per question, and the local copy read
    instead of the hub (a folder of copies: POSBIAS_DATASETS_DIR; MMLU: POSBIAS_MMLU_DIR) with its size.

    Example: posbias datasets --json
    """
    found = posbias.named_datasets(settings=settings_of(ctx))
    if as_json:
        print_json(
            [
                {
                    **info.dataset.model_dump(mode="json"),
                    "local_copy": info.local_copy,
                    "local_questions": info.local_questions,
                    "local_options": info.local_options,
                    "problem": info.problem,
                }
                for info in found
            ]
        )
        return
    table = Table(title="datasets (--dataset NAME)")
    # A name is what a user types: never cut. The other columns wrap (a path or hub id folds) on a narrow
    # terminal rather than losing their ends to an ellipsis.
    longest = max(len(info.dataset.name) for info in found)
    table.add_column("name", no_wrap=True, min_width=longest)
    for column in ("hub id", "split", "options", "questions", "read from"):
        right = column in {"options", "questions"}
        table.add_column(column, justify="right" if right else "left", overflow="fold")
    for info in found:
        d = info.dataset
        hub = d.hub_id + (f" ({d.config})" if d.config else "")
        if info.problem is not None:
            where, size = f"{info.local_copy}: cannot be read", f"{d.questions:,} on the hub"
        elif info.local_copy is not None:
            where, size = info.local_copy, f"{info.local_questions:,}"
        else:
            where, size = "the hub", f"{d.questions:,} on the hub"
        table.add_row(d.name, hub, d.split, str(info.local_options or d.options), size, where)
    out.print(table)
    for info in found:
        if info.problem is not None:
            out.print(f"{info.dataset.name}: {info.problem}")
