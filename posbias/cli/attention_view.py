"""`posbias curve --metric attention`: the attention curves of `hf` jobs, as a table, CSV, JSON or a plot
(one panel per layer kind)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

import posbias
from posbias.cli.common import num, out, print_json, settings_of
from posbias.cli.errors import BadUsage
from posbias.schemas.choices import CurveAxis
from posbias.schemas.errors import NotFoundError

if TYPE_CHECKING:
    from posbias.schemas import AttentionCurve, AttentionExplanation

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


def print_attention_explanations(ctx: typer.Context, jobs: list[int], *, variant: str) -> None:
    """`explain`'s attention section, for each `hf` job among or paired with `jobs`; nothing when there is
    none (a job without attention rows and no `hf` job of the same trials)."""
    try:
        found = posbias.attention_explanations(jobs, settings=settings_of(ctx), variant=variant)
    except NotFoundError:
        return
    for e in found:
        _explanation(e)


def _explanation(e: AttentionExplanation) -> None:
    window = f", window {e.window:,} tokens" if e.window else ", no sliding window"
    table = Table(title=escape(f"attention: {e.model}, variant {e.variant} (hf job {e.job_id}{window})"))
    for column in ("layers", "token distance", "rows", "trials", "own (head mean)", "own (largest head)"):
        table.add_column(column, justify="left" if column == "layers" else "right")
    for b in e.bands:
        span = f"{b.low:,}+" if b.high is None else f"{b.low:,}-{b.high:,}"
        table.add_row(b.layer_kind.value, span, str(b.n), str(b.trials), num(b.own_mean), num(b.own_max))
    out.print(table)
    if e.decay_within_window is not None:
        said = "a decay within the window" if e.decay_within_window < 1 else "no decay within the window"
        out.print(
            "sliding layers: own-question attention in the window's far half is "
            f"{e.decay_within_window:.2f}x its near half: {said}"
        )
    if e.window:
        if e.sliding_beyond_max is not None:
            out.print(
                "sliding layers, answer lines wholly beyond the window: own-question attention, largest head "
                f"{num(e.sliding_beyond_max)}"
            )
        if e.global_beyond is not None:
            carried = "they carry it" if e.global_beyond > 0 else "they do not carry it"
            out.print(
                f"global layers, the same lines: own-question attention {num(e.global_beyond)} (head mean): "
                f"{carried}"
            )
    for a in e.aurocs:
        if a.auroc is None:
            continue
        interval = (
            f" (95% CI {a.low:.2f} to {a.high:.2f}, by trial)"
            if a.low is not None and a.high is not None
            else f" (no interval: {a.trials} trials, fewer than 16)"
        )
        out.print(
            f"does {a.layer_kind.value} attention predict correctness (job {e.scored_job_id}) at a fixed "
            f"position? AUROC {a.auroc:.2f}{interval}, within {a.strata} positions ({a.correct} correct, "
            f"{a.wrong} wrong; 0.5: no)"
        )
    if e.note:
        out.print(f"AUROC: {e.note}")
