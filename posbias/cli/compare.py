"""`posbias compare`: the difference between two position curves (two jobs, two variants, two models)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JsonOpt, err, out, pct, pp, print_json, settings_of
from posbias.schemas.ids import looks_like_id, parse_id
from posbias.schemas.limits import MAX_BATCH_SIZE

if TYPE_CHECKING:
    from posbias.schemas import BlockDiff, Comparison


def register(app: typer.Typer) -> None:
    """Add `compare` to the app."""
    app.command()(compare)


def _operand(text: str) -> int | str:
    """A `compare` operand: a job id, a job and one of its variants (`3:global-only`), or a model name."""
    # Digits of any script are meant as a job id: a full-width 2 is refused there, not taken for a model.
    if looks_like_id(text):
        return parse_id(text, what="job id")
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
    simultaneous 95% band, and `*` only where the band excludes zero; then blocks of positions (a tenth, a
    fifth, a half, all, at every start) in the same band's family, the one that best fits the difference,
    and the parse rate's changes. Trials of A and B that show
    the same questions at the same positions are compared paired (with McNemar's exact test per position,
    Holm-adjusted over positions); the output says how many matched. Two variants of one job answer the
    same trials, so they pair fully.

    Example: posbias compare 3 7 --batch-size 50; posbias compare 3:baseline 3:global-only
    """
    comparison = posbias.compare(_operand(a), _operand(b), settings=settings_of(ctx), batch_size=batch_size)
    if as_json:
        print_json(comparison.model_dump(mode="json"))
    else:
        _print_comparison(comparison)


def _tiles(d: BlockDiff) -> bool:
    """Whether a block is one of the non-overlapping blocks of its width (those starting at a multiple of
    it)."""
    return (d.first_position - 1) % (d.last_position - d.first_position + 1) == 0


def _print_comparison(c: Comparison) -> None:
    paired = c.method != "unpaired"
    table = Table(title=f"{c.b} minus {c.a} - batch size {c.batch_size}")
    columns = ["position", "A", "B", "B - A", "95% CI (pointwise)", "95% band (simultaneous)", ""]
    if paired:
        columns.insert(-1, "McNemar p (Holm)")
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
            row.append("" if p.mcnemar_holm is None else f"{p.mcnemar_holm:.3f}")
        row.append("*" if p.different else "")
        table.add_row(*row)
    out.print(table)
    how = {
        "paired": f"paired: all {c.matched_trials} trials matched (same questions at the same positions)",
        "partly paired": f"partly paired: {c.matched_trials} of {c.trials_a} and {c.trials_b} trials matched",
        "unpaired": "unpaired: no trials matched",
    }[c.method]
    out.print(
        f"{how}; * the simultaneous band excludes zero (different at 95% over all positions and blocks)"
        + ("; McNemar p adjusted over positions (Holm), not used for *" if paired else "")
    )
    if c.blocks:
        # Every start of every width is in the family; the table keeps to the non-overlapping blocks of each
        # width and the best fit (--json has them all).
        shown = [d for d in c.blocks if _tiles(d) or d == c.located]
        blocks = Table(
            title="blocks of positions (accuracy, same band) and parse rate (its own band): the "
            "non-overlapping ones of each width"
        )
        for column in ["positions", "accuracy B - A", "95% band", "", "parse rate B - A", "95% band", ""]:
            blocks.add_column(column, justify="right")
        parse = {(d.first_position, d.last_position): d for d in c.parse}
        for d in shown:
            q = parse.get((d.first_position, d.last_position))
            blocks.add_row(
                f"{d.first_position}-{d.last_position}",
                pp(d.diff),
                f"{pp(d.band_low)} to {pp(d.band_high)}",
                "*" if d.different else "",
                pp(q.diff if q else None),
                f"{pp(q.band_low)} to {pp(q.band_high)}" if q else "-",
                "*" if q and q.different else "",
            )
        out.print(blocks)
        others = sum(d.different for d in c.blocks if d not in shown)
        if others:
            out.print(f"{others} more blocks (other starts) marked different: --json lists every block")
    if c.located is not None:
        d = c.located
        where = "the whole curve" if (d.first_position, d.last_position) == (1, c.batch_size) else d.where
        out.print(
            f"best fit of the difference (of the positions and blocks marked): {where}: {pct(d.a)} -> "
            f"{pct(d.b)} ({pp(d.diff)}, band {pp(d.band_low)} to {pp(d.band_high)})"
        )
    changed = [d for d in c.parse if d.different and d.first_position == d.last_position]
    if changed:
        worst = min(changed, key=lambda d: d.diff or 0.0)
        out.print(
            f"parse rate differs at {len(changed)} positions; most at {worst.where}: {pct(worst.a)} -> "
            f"{pct(worst.b)} ({pp(worst.diff)}, band {pp(worst.band_low)} to {pp(worst.band_high)})"
        )
    else:
        out.print("parse rate: no position differs (simultaneous 95% band)")
    if c.contrast_diff is not None:
        k = c.contrast_diff
        out.print(f"change in last minus first: {pp(k.estimate)} (95% CI {pp(k.low)} to {pp(k.high)})")
    if c.warning:
        err.print(f"warning: {c.warning}")
