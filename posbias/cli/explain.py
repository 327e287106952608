"""`posbias explain`: which of position, answer slot and token distance moves a job's curve, and whether the
model's sliding window puts a step in it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

import posbias
from posbias.cli.common import ID_MAX, BatchSizeOpt, JsonOpt, out, pp, print_json, settings_of
from posbias.schemas import BASELINE
from posbias.schemas.explanation import Explanation


def register(app: typer.Typer) -> None:
    """Add `explain` to the app."""
    app.command()(explain)


def explain(
    ctx: typer.Context,
    jobs: Annotated[
        list[int],
        typer.Argument(
            help="Job id(s): several jobs of one model are pooled (e.g. a forward and a reverse-order job).",
            show_default=False,
            min=1,
            max=ID_MAX,
        ),
    ],
    batch_size: BatchSizeOpt = None,
    variant: Annotated[
        str, typer.Option(help="Which variant of the jobs to explain (each is explained on its own).")
    ] = BASELINE,
    as_json: JsonOpt = False,
) -> None:
    """Fit correctness on position (first to last), answer slot (first to last) and token distance (per
    1,000 tokens) together, with errors clustered by trial (or sampled set) and question difficulty adjusted;
    print each effect with its 95% interval and whether it is distinguishable from zero, say which effects
    the design moves together (e.g. slot and position in forward order: answer in random order to separate
    them; position and distance without filler: add filler at several lengths), and for a model with a
    sliding window test for a step at the window against a smooth decay, with the step's location and its
    95% interval.

    Example: posbias explain 3
    """
    found = posbias.explain(jobs, settings=settings_of(ctx), batch_size=batch_size, variant=variant)
    if as_json:
        print_json([e.model_dump(mode="json") for e in found])
        return
    for explanation in found:
        print_explanation(explanation)


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def print_explanation(e: Explanation) -> None:
    """One batch size's explanation: the effects' table, what the design moves together, the window."""
    jobs = ",".join(map(str, e.job_ids))
    model = f"{e.model}{'@' + e.revision if e.revision else ''}"
    table = Table(title=f"what moves the curve: {model} - batch size {e.batch_size} (jobs {jobs})")
    for column in ("cause", "effect (points)", "95% CI", "p", "not zero"):
        table.add_column(column, justify="left" if column == "cause" else "right")
    for effect in e.effects:
        cause = f"{effect.name}, {effect.unit}"
        if effect.effect is None:
            table.add_row(cause, effect.status, "", "", "")
            continue
        table.add_row(
            cause,
            _points(effect.effect.estimate),
            f"{_points(effect.effect.low)} to {_points(effect.effect.high)}",
            f"{effect.p:.2g}" if effect.p is not None else "",
            "yes" if effect.distinguishable else "no",
        )
    out.print(table)
    adjusted = (
        "question difficulty adjusted"
        if e.difficulty_adjusted
        else "no difficulty covariate (the design shows each set several times)"
    )
    distances = next((x.range_covered for x in e.effects if x.name == "token distance"), None)
    covered = f"; distances {distances[0]:,.0f} to {distances[1]:,.0f} tokens" if distances else ""
    out.print(
        f"design: {e.design}. {e.answers} parsed answers of {e.trials} trials in {e.clusters} "
        f"{e.cluster_unit}s{covered}; one least-squares fit, errors clustered, {adjusted}; "
        "'not zero': the 95% interval excludes zero."
    )
    for confound in e.confounds:
        names = " and ".join(confound.effects)
        r = f" (correlation {confound.correlation:+.2f})" if confound.correlation is not None else ""
        joint = f"; together: p = {confound.joint_p:.2g}" if confound.joint_p is not None else ""
        out.print(f"cannot be told apart here: {names}{r}{joint}. To separate them: {confound.fix}.")
    for effect in e.effects:
        if effect.note:
            out.print(f"{effect.name}: {effect.note}.")
    w = e.window
    if w is not None:
        layers = (
            f", layers {','.join(map(str, w.sliding_layers))} of {w.num_layers}"
            if w.sliding_layers is not None and w.num_layers is not None
            else ""
        )
        out.print(
            f"sliding window {w.window:,} tokens{layers}: {w.answers_inside} answers inside, "
            f"{w.answers_beyond} beyond"
        )
        if w.tested and w.jump is not None:
            out.print(
                f"  step at the window over a smooth decay: {pp(w.jump.estimate)} (95% CI "
                f"{pp(w.jump.low)} to {pp(w.jump.high)}), p = {w.p:.2g}: {'a step' if w.found else 'no step'}"
            )
        if w.break_interval is not None:
            low, high = w.break_interval
            inside = "includes" if w.window_in_interval else "does not include"
            out.print(
                f"  where the data put it: after {w.break_low:,} and by {w.break_high:,} tokens (95% CI "
                f"{low:,.0f} to {high:,.0f}), which {inside} the window"
            )
        if w.note:
            out.print(f"  not tested: {w.note}")
    out.print(f"verdict: {e.verdict}")
