"""`posbias curve` and `posbias compare`: position curves and differences between two of them."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import posbias.api as api
from posbias.schemas import Comparison, Curve, CurveAxis, CurveQuery
from posbias.service.cli.common import BadUsage, JsonOpt, num, out, pct, pp, print_json, settings_of

RevisionOpt = Annotated[str | None, typer.Option(help="Model revision on the hub.")]


def register(app: typer.Typer) -> None:
    """Add `curve` and `compare` to the app."""
    app.command()(curve)
    app.command()(compare)


def curve(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model name as submitted.")] = None,
    revision: RevisionOpt = None,
    batch_size: Annotated[int | None, typer.Option(help="One batch size (default: every one).")] = None,
    job: Annotated[int | None, typer.Option(help="One job (default: every job of the model).")] = None,
    by: Annotated[CurveAxis, typer.Option(help="position, or token-distance (binned).")] = CurveAxis.position,
    bin_width: Annotated[int, typer.Option(help="Token-distance bin width.")] = 256,
    output_format: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    plot: Annotated[Path | None, typer.Option(help="Also write a PNG: one line per batch size.")] = None,
) -> None:
    """Accuracy by position with 95% intervals, parse rate, and the first-vs-last ratio.

    Example: posbias curve --model google/gemma-2-2b-it --batch-size 50 --plot curve.png
    """
    if output_format not in {"table", "csv", "json"}:
        raise BadUsage(f"--format must be table, csv or json (got {output_format!r})")
    if job is None and model is None:
        raise BadUsage("name a model (--model) or a job (--job)")
    query = CurveQuery(model=model, revision=revision, batch_size=batch_size, job_id=job)
    curves = api.curves(query, settings=settings_of(ctx), by=by, bin_width=bin_width)
    if plot is not None:
        from posbias.service.plot import plot_curves

        plot_curves(curves, path=plot)
    if output_format == "json":
        print_json([c.model_dump(mode="json") for c in curves])
    elif output_format == "csv":
        _write_curve_csv(curves)
    else:
        for c in curves:
            print_curve(c)
    if plot is not None and output_format == "table":
        out.print(f"wrote {plot}")


def _write_curve_csv(curves: list[Curve]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    x = curves[0].by.replace("-", "_") if curves else "position"
    writer.writerow(
        [
            "model",
            "revision",
            "batch_size",
            x,
            "n",
            "n_correct",
            "accuracy",
            "ci_low",
            "ci_high",
            "parse_rate",
            "mean_gold_prob",
        ]
    )
    for c in curves:
        for p in c.points:
            writer.writerow(
                [
                    c.model,
                    c.revision or "",
                    c.batch_size,
                    p.position,
                    p.n,
                    p.n_correct,
                    num(p.accuracy),
                    num(p.ci_low),
                    num(p.ci_high),
                    num(p.parse_rate),
                    num(p.mean_gold_prob),
                ]
            )


def print_curve(c: Curve) -> None:
    """A curve as a table, with its ratio and slope below it."""
    axis = "position" if c.by == "position" else "tokens"
    jobs = ",".join(map(str, c.job_ids))
    table = Table(
        title=f"{c.model}{'@' + c.revision if c.revision else ''} - batch size {c.batch_size} (jobs {jobs})"
    )
    for column in (axis, "n", "accuracy", "95% CI", "parse rate", "p(gold)"):
        table.add_column(column, justify="right")
    for p in c.points:
        table.add_row(
            str(p.position),
            str(p.n),
            pct(p.accuracy),
            f"{pct(p.ci_low)} to {pct(p.ci_high)}",
            pct(p.parse_rate),
            num(p.mean_gold_prob),
        )
    out.print(table)
    if c.note is not None:
        out.print(f"note: {c.note}")
    if c.first_last_ratio is not None:
        r = c.first_last_ratio
        if r.estimate is None:
            out.print("last/first accuracy: undefined (accuracy at position 1 is 0)")
        else:
            high = "unbounded" if r.high is None else num(r.high)
            out.print(
                f"last/first accuracy: {num(r.estimate)} (95% CI {num(r.low)} to {high}, "
                "cluster bootstrap over trials)"
            )
    if c.slope is not None:
        s = c.slope
        out.print(f"slope: {pp(s.estimate)} per position (95% CI {pp(s.low)} to {pp(s.high)})")


def _operand(text: str) -> int | str:
    """A `compare` operand: a job id, or a model name."""
    return int(text) if text.isdigit() else text


def compare(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(help="Baseline: a job id or a model name.")],
    b: Annotated[str, typer.Argument(help="Candidate: a job id or a model name.")],
    batch_size: Annotated[int | None, typer.Option(help="Batch size to compare (needed if several).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Difference in accuracy (B - A) at every position, with 95% intervals.

    Example: posbias compare 3 7 --batch-size 50
    """
    comparison = api.compare(_operand(a), _operand(b), settings=settings_of(ctx), batch_size=batch_size)
    if as_json:
        print_json(comparison.model_dump(mode="json"))
    else:
        _print_comparison(comparison)


def _print_comparison(c: Comparison) -> None:
    table = Table(title=f"{c.b} minus {c.a} - batch size {c.batch_size}")
    for column in ("position", "A", "B", "B - A", "95% CI", ""):
        table.add_column(column, justify="right")
    for p in c.points:
        clear = p.ci_low is not None and p.ci_high is not None and (p.ci_low > 0 or p.ci_high < 0)
        table.add_row(
            str(p.position),
            pct(p.accuracy_a),
            pct(p.accuracy_b),
            pp(p.diff),
            f"{pp(p.ci_low)} to {pp(p.ci_high)}",
            "*" if clear else "",
        )
    out.print(table)
    out.print("* the interval excludes zero")
