"""`posbias explain`: which of position, answer slot and token distance moves a job's curve, and whether the
model's sliding window puts a step in it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

import posbias
from posbias.cli.attention_view import print_attention_explanations
from posbias.cli.common import BatchSizeOpt, JsonOpt, id_parser, out, pp, print_json, settings_of
from posbias.cli.options import print_options
from posbias.schemas.choices import BASELINE

if TYPE_CHECKING:
    from posbias.schemas import Interval
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
            parser=id_parser("job id"),
        ),
    ],
    batch_size: BatchSizeOpt = None,
    variant: Annotated[
        str, typer.Option(help="Which variant of the jobs to explain (each is explained on its own).")
    ] = BASELINE,
    as_json: JsonOpt = False,
) -> None:
    """Fit correctness on position, answer slot and token distance together, each cause a natural spline
    (token distance with a step at the model's sliding window, when it has one), errors clustered by trial
    (or sampled set) and question difficulty adjusted. Per cause: its summary effect (first to last, or per
    1,000 tokens) and bend with 95% intervals, the joint test of its terms, how much of its variation the
    design separates from the others, and what the data say: moves the curve, no effect larger than +/-X
    points, cannot tell, or not separable (with the design that would separate it); for a window, the step's
    size, sign and location, the location called informative only when narrow against the window.

    Example: posbias explain 3
    """
    found = posbias.explain(jobs, settings=settings_of(ctx), batch_size=batch_size, variant=variant)
    if as_json:
        print_json([e.model_dump(mode="json") for e in found])
        return
    for explanation in found:
        if explanation.left_out:
            out.print(f"{explanation.left_out}.")
        if explanation.sample:
            out.print(f"{explanation.sample}.")
        print_explanation(explanation)
    print_options(
        posbias.options_by_position(jobs, settings=settings_of(ctx), batch_size=batch_size, variant=variant)
    )
    print_attention_explanations(ctx, jobs, variant=variant)


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def _interval(found: Interval | None) -> str:
    if found is None:
        return ""
    return f"{_points(found.low)} to {_points(found.high)}"


def print_explanation(e: Explanation) -> None:
    """One batch size's explanation: the causes' table, what the design does not separate, the window."""
    jobs = ",".join(map(str, e.job_ids))
    model = f"{e.model}{'@' + e.revision if e.revision else ''}"
    table = Table(title=f"what moves the curve: {model} - batch size {e.batch_size} (jobs {jobs})")
    for column in (
        "cause",
        "effect (points)",
        "95% CI",
        "bend (points)",
        "terms",
        "p",
        "information",
        "reading",
    ):
        table.add_column(column, justify="left" if column in ("cause", "reading") else "right")
    for effect in e.effects:
        cause = f"{effect.name}, {effect.unit}"
        if effect.effect is None:  # not estimated, or not separable (its group's line says more)
            information = f"{effect.information:.2f}" if effect.information is not None else ""
            table.add_row(cause, "", "", "", "", "", information, effect.reading or effect.status)
            continue
        bend = ""
        if effect.bend is not None:
            bend = f"{_points(effect.bend.estimate)} ({_interval(effect.bend)})"
        table.add_row(
            cause,
            _points(effect.effect.estimate),
            _interval(effect.effect),
            bend,
            str(effect.terms or ""),
            f"{effect.p:.2g}" if effect.p is not None else "",
            f"{effect.information:.2f}" if effect.information is not None else "",
            effect.reading,
        )
    out.print(table)
    adjusted = (
        "question difficulty adjusted"
        if e.difficulty_adjusted
        else "no difficulty covariate (the design shows each set several times)"
    )
    distance = next((x for x in e.effects if x.name == "token distance"), None)
    covered = ""
    if distance is not None and distance.range_covered is not None:
        covered = f"; distances {distance.range_covered[0]:,.0f} to {distance.range_covered[1]:,.0f} tokens"
        if distance.span is not None:
            covered += f" (per 1,000 tokens: the smooth part's mean change from {distance.span[0]:,.0f} to "
            covered += f"{distance.span[1]:,.0f})"
    unit = e.cluster_unit if e.clusters == 1 else f"{e.cluster_unit}s"
    clustered = "" if e.cluster_unit == "trial" else f" in {e.clusters:,} {unit}"
    threshold = f" below {e.threshold:.2f}" if e.threshold is not None else ""
    out.print(
        f"design: {e.design}. {e.answers:,} parsed answers of {e.trials:,} trials{clustered}"
        f"{covered}. One least-squares fit, each cause a natural spline (distance with a step at the "
        f"window), errors clustered by {e.cluster_unit or 'trial'}, {adjusted}; p: the joint Wald test of "
        "the cause's terms (F with "
        f"{max(e.clusters - 1, 1):,} denominator degrees of freedom); bend: the middle against the ends; "
        "information: the share of the "
        f"cause's variation the others leave it (not separable{threshold})."
    )
    for confound in e.confounds:
        names = confound.named
        r = f" (correlation {confound.correlation:+.2f})" if confound.correlation is not None else ""
        joint = (
            f"; together: p = {confound.joint_p:.2g} over {confound.terms} terms"
            if confound.joint_p is not None
            else ""
        )
        out.print(f"not separable here: {names}{r}{joint}. To separate them: {confound.fix}.")
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
            f"sliding window {w.window:,} tokens{layers}: {w.answers_inside:,} answers inside, "
            f"{w.answers_beyond:,} beyond"
        )
        if w.tested and w.jump is not None:
            said = f"a step {w.direction}" if w.found else "no step"
            out.print(
                f"  step at the window over a smooth decay: {pp(w.jump.estimate)} (95% CI "
                f"{pp(w.jump.low)} to {pp(w.jump.high)}), p = {w.p:.2g}: {said}"
            )
        if w.break_interval is not None:
            low, high = w.break_interval
            if w.informative:
                inside = "includes" if w.window_in_interval else "does not include"
                said = f"which {inside} the window"
            else:
                said = "too wide against the window to say where the step is"
            out.print(
                f"  where the data put it: after {w.break_low:,} and by {w.break_high:,} tokens (95% CI "
                f"{low:,.0f} to {high:,.0f}), {said}"
            )
        if w.note:
            out.print(f"  not tested: {w.note}")
    out.print(f"verdict: {e.verdict}")
