"""`posbias compare`: the difference between two position curves (two jobs, two variants, two models)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

import posbias
from posbias.cli.common import ID_MAX, JsonOpt, out, pct, pp, print_json, settings_of
from posbias.cli.errors import BadUsage
from posbias.schemas import Comparison
from posbias.schemas.bounds import MAX_BATCH_SIZE


def register(app: typer.Typer) -> None:
    """Add `compare` to the app."""
    app.command()(compare)


def _operand(text: str) -> int | str:
    """A `compare` operand: a job id, a job and one of its variants (`3:global-only`), or a model name."""
    # isdecimal and isascii: `³` and `٣` pass isdigit() but are not job ids.
    if text.isascii() and text.isdecimal():
        if not 1 <= int(text) <= ID_MAX:
            raise BadUsage(f"job id {text[:30]} is out of range (1 to {ID_MAX})")
        return int(text)
    return text


def compare(
    ctx: typer.Context,
    a: Annotated[
        str, typer.Argument(help="Baseline: a job id, JOB:VARIANT (e.g. 3:baseline) or a model name.")
    ],
    b: Annotated[
        str, typer.Argument(help="Candidate: a job id, JOB:VARIANT (e.g. 3:global-only) or a model name.")
    ],
    batch_size: Annotated[
        int | None, typer.Option(help="Batch size to compare (needed if several).", min=1, max=MAX_BATCH_SIZE)
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Difference in accuracy (B - A, among parsed answers) at every position: pointwise 95% interval,
    simultaneous 95% band, and `*` only where the band excludes zero. Trials of A and B that show the same
    questions at the same positions are compared paired (with McNemar's exact test per position); the
    output says how many matched. Two variants of one job answer the same trials, so they pair fully.

    Example: posbias compare 3 7 --batch-size 50; posbias compare 3:baseline 3:global-only
    """
    comparison = posbias.compare(_operand(a), _operand(b), settings=settings_of(ctx), batch_size=batch_size)
    if as_json:
        print_json(comparison.model_dump(mode="json"))
    else:
        _print_comparison(comparison)


def _print_comparison(c: Comparison) -> None:
    paired = c.method != "unpaired"
    table = Table(title=f"{c.b} minus {c.a} - batch size {c.batch_size}")
    columns = ["position", "A", "B", "B - A", "95% CI (pointwise)", "95% band (simultaneous)", ""]
    if paired:
        columns.insert(-1, "McNemar p")
    for column in columns:
        table.add_column(column, justify="right")
    for p in c.points:
        row = [
            str(p.position),
            pct(p.accuracy_a),
            pct(p.accuracy_b),
            pp(p.diff),
            f"{pp(p.ci_low)} to {pp(p.ci_high)}",
            f"{pp(p.band_low)} to {pp(p.band_high)}",
        ]
        if paired:
            row.append("" if p.mcnemar_p is None else f"{p.mcnemar_p:.3g}")
        row.append("*" if p.different else "")
        table.add_row(*row)
    out.print(table)
    how = {
        "paired": f"paired: all {c.matched_trials} trials matched (same questions at the same positions)",
        "partly paired": f"partly paired: {c.matched_trials} of {c.trials_a} and {c.trials_b} trials matched",
        "unpaired": "unpaired: no trials matched",
    }[c.method]
    out.print(f"{how}; * the simultaneous band excludes zero (different at 95% over all positions)")
    if c.contrast_diff is not None:
        d = c.contrast_diff
        out.print(f"change in last minus first: {pp(d.estimate)} (95% CI {pp(d.low)} to {pp(d.high)})")
