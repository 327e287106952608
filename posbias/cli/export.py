"""`posbias export`: every result row of a job to a CSV or Parquet file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import posbias
from posbias.cli.common import JobArg, JsonOpt, out, print_json, settings_of
from posbias.cli.errors import BadUsage
from posbias.schemas.errors import PosbiasError


def register(app: typer.Typer) -> None:
    """Add `export` to the app."""
    app.command()(export)


def export(
    ctx: typer.Context,
    job: JobArg,
    output: Annotated[
        Path, typer.Option("--out", "-o", help="File to write (or a device or pipe, e.g. /dev/stdout).")
    ],
    output_format: Annotated[
        str | None, typer.Option("--format", help="csv or parquet (default: from --out).")
    ] = (None),
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it is an existing file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write every result row of a job (its model, variant, design and filler; trial id, position, gold,
    predicted, tokens, probabilities). Every export has the same columns and types, so the Parquet files of
    several jobs read as one table (DuckDB: SELECT * FROM read_parquet('exports/*.parquet')).

    The file appears complete or not at all (it is written beside --out, then renamed); an existing file is
    replaced only with --force.

    Example: posbias export 3 --out results.parquet
    """
    if as_json and str(output) == "/dev/stdout":
        raise BadUsage("--json and --out /dev/stdout would both write to standard output: drop one")
    try:
        posbias.export_format(output, output_format)  # a flag to fix (exit 2), before the store is opened
    except PosbiasError as exc:
        raise BadUsage(str(exc)) from None
    try:
        summary = posbias.export_results(
            job, out=output, settings=settings_of(ctx), format=output_format, overwrite=force
        )
    except posbias.OutputExists as exc:
        raise BadUsage(str(exc)) from None
    if as_json:
        print_json(summary.model_dump(mode="json"))
    else:
        out.print(f"wrote {summary.rows} results of job {job} to {summary.path}")
