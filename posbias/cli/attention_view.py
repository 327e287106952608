"""`posbias curve --metric attention`: the attention curves of `hf` jobs, as a table, CSV, JSON or a plot
(one panel per layer kind)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import typer
from rich.table import Table

import posbias
from posbias.cli.common import num, out, print_json, settings_of
from posbias.cli.errors import BadUsage
from posbias.schemas import AttentionCurve, CurveAxis

_COLUMNS = ("own_mean", "own_max", "sink_mean", "other_mean", "instructions_mean", "answers_mean")


def attention_command(
    ctx: typer.Context,
    target: int | str | None,
    *,
    batch_size: int | None,
    variant: str | None,
    by: CurveAxis,
    bin_width: int,
    output_format: str,
    plot: Path | None,
) -> None:
    """Read the attention curves and render them."""
    if by not in (CurveAxis.position, CurveAxis.token_distance):
        raise BadUsage("--metric attention goes --by position or --by token-distance")
    assert target is not None
    curves = posbias.attention_curves(
        target,
        settings=settings_of(ctx),
        batch_size=batch_size,
        variant=variant,
        by=by.value,
        bin_width=bin_width,
    )
    if plot is not None:
        posbias.plot_attention(curves, path=plot)
    if output_format == "json":
        print_json([c.model_dump(mode="json") for c in curves])
    elif output_format == "csv":
        _csv(curves)
    else:
        for c in curves:
            _table(c)
        if plot is not None:
            out.print(f"wrote {plot}")


def _csv(curves: list[AttentionCurve]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    x = curves[0].by.replace("-", "_")
    writer.writerow(
        ["model", "job_id", "variant", "batch_size", "layer_kind", x, "n", *_COLUMNS, "beyond_window"]
    )
    for c in curves:
        for p in c.points:
            writer.writerow(
                [c.model, c.job_id, c.variant, c.batch_size, c.layer_kind.value, num(p.x), p.n]
                + [num(getattr(p, name)) for name in _COLUMNS]
                + [num(p.beyond_window_mean)]
            )


def _table(c: AttentionCurve) -> None:
    axis = "position" if c.by == "position" else "tokens (bin centre)"
    table = Table(
        title=f"{c.model} [{c.variant}] - batch size {c.batch_size}, {c.layer_kind.value} layers "
        f"(job {c.job_id})"
    )
    for column in (
        axis,
        "n",
        "own",
        "own (max head)",
        "sink",
        "other questions",
        "instructions",
        "answers",
        "beyond window",
    ):
        table.add_column(column, justify="right")
    for p in c.points:
        table.add_row(
            f"{p.x:g}",
            str(p.n),
            *(num(getattr(p, name)) for name in _COLUMNS),
            num(p.beyond_window_mean),
        )
    out.print(table)
