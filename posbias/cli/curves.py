"""`posbias curve`: position curves, as a table, CSV, JSON or a plot."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

import posbias
from posbias.cli.common import (
    BatchSizeOpt,
    id_parser,
    num,
    out,
    pct,
    pp,
    print_json,
    settings_of,
)
from posbias.cli.errors import BadUsage
from posbias.schemas.choices import BASELINE, CurveAxis
from posbias.schemas.errors import PosbiasError

if TYPE_CHECKING:
    from posbias.schemas import Curve

RevisionOpt = Annotated[str | None, typer.Option(help="Model revision on the hub.")]


def register(app: typer.Typer) -> None:
    """Add `curve` to the app."""
    app.command()(curve)


def curve(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model name as submitted.")] = None,
    revision: RevisionOpt = None,
    batch_size: BatchSizeOpt = None,
    job: Annotated[
        int | None,
        typer.Option(help="One job (default: every job of the model).", parser=id_parser("job id")),
    ] = None,
    variant: Annotated[
        str | None,
        typer.Option(help="One variant, e.g. global-only (default: each variant, a curve of its own)."),
    ] = None,
    by: Annotated[
        CurveAxis,
        typer.Option(
            help="position; answer-slot (the line a question was answered on); token-distance (binned); "
            "rope-distance (binned distance in position ids: token distance plus the hf engine's "
            "position_gap); filler-length (every position pooled per length)."
        ),
    ] = CurveAxis.position,
    bin_width: Annotated[int, typer.Option(help="Token-distance bin width.", min=1, max=10_000_000)] = 256,
    output_format: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (the same as --format json).")] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Also write a plot (.png, .pdf or .svg): one line per batch size, filler length and variant "
            "(overlaid, a colour each)."
        ),
    ] = None,
    band: Annotated[
        bool,
        typer.Option(
            "--band", help="Also show the simultaneous 95% band over all positions (table and plot)."
        ),
    ] = False,
    heatmap: Annotated[
        Path | None,
        typer.Option(
            help="Also write a heatmap (.png, .pdf or .svg) of accuracy by filler length x position (a "
            "filler sweep's grid), one panel per batch size."
        ),
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            help="accuracy, or attention (hf jobs: attention on the answered question, per layer kind)."
        ),
    ] = "accuracy",
) -> None:
    """Accuracy by position: per point n, accuracy among parsed answers with its pointwise 95% interval,
    parse rate, accuracy with failed parses counted as wrong (strict), mean p(gold); per curve the
    last-minus-first contrast, the last/first ratio (when the first is bounded away from zero), the slope
    (clustered, difficulty adjusted) and the p-value of "no position effect". --band adds the simultaneous
    95% band (it holds at every position at once). Intervals treat a trial (or, under rotation, a sampled
    set) as one cluster; pooled jobs count each distinct trial once. A job's variants are curves of their
    own, never pooled (--variant picks one). A filler sweep gives one curve per filler length (by position
    or answer slot); --heatmap draws that grid.

    Example: posbias curve --model google/gemma-2-2b-it --batch-size 50 --plot curve.png
    """
    if output_format not in {"table", "csv", "json"}:
        raise BadUsage(f"--format must be table, csv or json (got {output_format!r})")
    if as_json:
        if output_format not in {"table", "json"}:
            raise BadUsage(f"--json and --format {output_format} ask for two formats: give one")
        output_format = "json"
    if metric not in {"accuracy", "attention"}:
        raise BadUsage(f"--metric must be accuracy or attention (got {metric!r})")
    if metric == "attention":
        # Flags only accuracy curves read: taken silently, they would show something the user did not ask for.
        for given, flag in ((band, "--band"), (heatmap is not None, "--heatmap"), (revision, "--revision")):
            if given:
                raise BadUsage(f"{flag} is for --metric accuracy; --metric attention takes --plot")
    if job is None and model is None:
        raise BadUsage("name a model (--model) or a job (--job)")
    for path, flag in ((plot, "--plot"), (heatmap, "--heatmap")):
        if path is not None:
            try:
                posbias.plot_format(path)  # before any work
            except PosbiasError as exc:
                raise BadUsage(f"{flag}: {exc}") from None
    if metric == "attention":
        from posbias.cli.attention_view import attention_command

        target = job if job is not None else model
        attention_command(
            ctx,
            target,
            batch_size=batch_size,
            variant=variant,
            by=by,
            bin_width=bin_width,
            output_format=output_format,
            plot=plot,
        )
        return
    from posbias.schemas import CurveQuery

    query = CurveQuery(model=model, revision=revision, batch_size=batch_size, job_id=job, variant=variant)
    curves = posbias.curves(query, settings=settings_of(ctx), by=by, bin_width=bin_width)
    if plot is not None:
        chance = None
        if curves and all(c.chance is None for c in curves):  # by token distance: the positions' chance
            found = posbias.curves(query, settings=settings_of(ctx))
            chance = next((c.chance for c in found if c.chance is not None), None)
        posbias.plot_curves(curves, path=plot, band=band, chance=chance)
    if heatmap is not None:
        # The heatmap is drawn from the curves by position, whichever axis the table shows.
        grid = curves if by is CurveAxis.position else posbias.curves(query, settings=settings_of(ctx))
        posbias.plot_heatmap(grid, path=heatmap)
    if output_format == "json":
        print_json([c.model_dump(mode="json") for c in curves])
    elif output_format == "csv":
        _write_curve_csv(curves)
    else:
        for c in curves:
            print_curve(c, band=band)
    if output_format == "table":
        for written in (plot, heatmap):
            if written is not None:
                out.print(f"wrote {written}")


def _write_curve_csv(curves: list[Curve]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    x = curves[0].by.replace("-", "_") if curves else "position"
    writer.writerow(
        [
            "model",
            "revision",
            "variant",
            "batch_size",
            "filler_tokens",
            x,
            "n",
            "n_parsed",
            "n_correct",
            "accuracy",
            "ci_low",
            "ci_high",
            "band_low",
            "band_high",
            "parse_rate",
            "accuracy_strict",
            "mean_gold_prob",
        ]
    )
    for c in curves:
        for p in c.points:
            writer.writerow(
                [
                    c.model,
                    c.revision or "",
                    c.variant,
                    c.batch_size,
                    "" if c.filler_tokens is None else c.filler_tokens,
                    num(p.x) if c.by in ("token-distance", "rope-distance") else p.position,
                    p.n,
                    p.n_parsed,
                    p.n_correct,
                    num(p.accuracy),
                    num(p.ci_low),
                    num(p.ci_high),
                    num(p.band_low),
                    num(p.band_high),
                    num(p.parse_rate),
                    num(p.accuracy_strict),
                    num(p.mean_gold_prob),
                ]
            )


def _two(value: float | None) -> str:
    """A ratio to two decimals; `-` when unknown."""
    return "-" if value is None else f"{value:.2f}"


def print_curve(c: Curve, *, band: bool = False) -> None:
    """A curve as a table, with its summaries below it."""
    axis = {
        "token-distance": "tokens (bin centre)",
        "rope-distance": "positions (bin centre)",
        "filler-length": "filler tokens",
    }.get(c.by, c.by)
    jobs = ",".join(map(str, c.job_ids))
    variant = f" [{c.variant}]" if c.variant != BASELINE else ""
    filler = f", {c.filler_tokens:,} filler tokens" if c.filler_tokens else ""
    name = f"{c.model}{'@' + c.revision if c.revision else ''}{variant}"
    # Titles are Rich markup: `[global-only]` would be read as a style and vanish.
    table = Table(title=escape(f"{name} - batch size {c.batch_size}{filler} (jobs {jobs})"))
    columns = [axis, "n", "accuracy", "95% CI (pointwise)"]
    if band:
        columns.append("95% band (simultaneous)")
    columns += ["parse rate", "strict", "p(gold)"]
    for column in columns:
        table.add_column(column, justify="right")
    for p in c.points:
        row = [
            f"{p.x:g}" if c.by in ("token-distance", "rope-distance") else str(p.position),
            str(p.n),
            pct(p.accuracy),
            f"{pct(p.ci_low)} to {pct(p.ci_high)}",
        ]
        if band:
            row.append(f"{pct(p.band_low)} to {pct(p.band_high)}")
        row += [
            pct(p.parse_rate),
            pct(p.accuracy_strict),
            "" if p.mean_gold_prob is None else f"{p.mean_gold_prob:.3f}",
        ]
        table.add_row(*row)
    out.print(table)
    # "50 trials in 50 trials" said nothing: the clusters are named only when they are not the trials.
    clusters = f" in {c.clusters:,} {c.cluster_unit}s" if c.cluster_unit != "trial" else ""
    pooled = f", {len(c.job_ids)} jobs" if len(c.job_ids) > 1 else ""
    duplicates = f"; {c.duplicate_trials:,} duplicate trials counted once" if c.duplicate_trials else ""
    resampled = "whole clusters" if clusters else "whole trials"
    out.print(
        f"accuracy is among parsed answers; strict counts failed parses as wrong. {c.trials:,} trials"
        f"{clusters}{pooled}{duplicates}; intervals resample {resampled}."
    )
    if c.contrast is not None and c.contrast.estimate is not None:
        k = c.contrast
        which = "longest minus no filler" if c.by == "filler-length" else "last minus first"
        out.print(f"{which}: {pp(k.estimate)} (95% CI {pp(k.low)} to {pp(k.high)})")
    if c.note is not None:
        out.print(f"note: {c.note}")
    if c.first_last_ratio is not None:
        r = c.first_last_ratio
        out.print(f"last/first: {_two(r.estimate)} (95% CI {_two(r.low)} to {_two(r.high)})")
    if c.ratio_note:
        out.print(c.ratio_note)
    if c.slope is not None:
        s = c.slope
        effect = c.position_effect
        whole = f"; first to last {pp(effect.estimate)}" if effect is not None else ""
        unit = "slot" if c.by == "answer-slot" else "position"
        out.print(
            f"slope: {pp(s.estimate)} per {unit} (95% CI {pp(s.low)} to {pp(s.high)}; clustered, "
            f"difficulty adjusted{whole})"
        )
    if c.shape_p is not None:
        how = (
            "the permutation test's large-sample form"
            if c.shape_method == "large-sample"
            else "permutation test within clusters"
        )
        shown = "p < 0.001" if c.shape_p < 0.001 else f"p = {c.shape_p:.3g}"
        out.print(f"no position effect at all: {shown} ({how})")
