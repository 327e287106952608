"""`posbias diagnose`: plan, submit and read a battery of jobs that names the suspect behind a model's
position curve."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JsonOpt, out, print_json, settings_of
from posbias.schemas import UsageError

if TYPE_CHECKING:
    from datetime import datetime

    from posbias.schemas import Interval
    from posbias.schemas.diagnosis import Battery, DiagnoseOutcome, Diagnosis, Finding


def register(app: typer.Typer) -> None:
    """Add `diagnose` to the app."""
    app.command()(diagnose)


def diagnose(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="The model: a hub id, a folder, or a name for the fake.")],
    budget: Annotated[int, typer.Option(help="Trials the battery may use in all.", min=1)] = 2000,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and its cost; submit nothing.")
    ] = False,
    engine: Annotated[str, typer.Option(help="Engine of the behaviour and intervention jobs.")] = "vllm",
    fake: Annotated[
        str | None,
        typer.Option(
            help="Engine fake: its settings as JSON, e.g. "
            '\'{"window": 1000, "mechanism": {"window_step": 0.3}}\'.'
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the battery's trials.")] = 0,
    replan: Annotated[
        bool,
        typer.Option(
            "--replan",
            help="Plan afresh though a battery is stored for these options; when the plan differs, submit "
            "it under keys of its own in place of the stored one (whose jobs stay in the store).",
        ),
    ] = False,
    html: Annotated[
        str | None, typer.Option(help="When the diagnosis is ready: also write it as an HTML page here.")
    ] = None,
    view_url: Annotated[
        str,
        typer.Option(help="The page's numbers link to their jobs in the viewer here (`posbias view`)."),
    ] = "http://127.0.0.1:8765",
    as_json: JsonOpt = False,
) -> None:
    """Plan a battery from the model's config (layers, window, RoPE base, context): a design that
    separates position, answer slot and token distance (behaviour); the variants the config allows against
    the baseline on the same trials (intervention); attention by layer kind with the hf engine on a subset
    (mechanism). Submit it as ordinary jobs, each under an idempotency key, so running the command again finds
    them; once they are done, it prints a verdict per suspect and line of evidence. The battery is stored at
    its first submit and read from then on as submitted, whatever a newer posbias would plan.

    Example: posbias diagnose google/gemma-2-2b-it --budget 4000 --dry-run
    """
    settings = settings_of(ctx)
    given: dict[str, Any] | None = None
    if fake is not None:
        try:
            given = json.loads(fake)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--fake: not JSON ({exc.msg} at character {exc.pos})") from None
    outcome = posbias.diagnose(
        model,
        settings=settings,
        budget=budget,
        dry_run=dry_run,
        engine=engine,
        fake=given,
        seed=seed,
        replan=replan,
    )
    if html is not None and outcome.diagnosis is not None:
        posbias.write_diagnosis(outcome.diagnosis, path=html, view_url=view_url)
    if as_json:
        print_json(outcome.model_dump(mode="json"))
        return
    print_battery(outcome.battery)
    print_stored(outcome)
    if outcome.costs:
        print_costs(outcome)
        return
    if outcome.diagnosis is None:
        ids = " ".join(str(j.job_id) for j in outcome.jobs)
        states = ", ".join(f"{j.job_id} ({j.line.value}, {j.status})" for j in outcome.jobs)
        new = sum(j.created for j in outcome.jobs)
        out.print(f"jobs: {states}; {new} submitted now, {len(outcome.jobs) - new} found under their keys.")
        out.print(f"run them: posbias worker --until-empty (or on the cluster); watch: posbias status {ids}")
        out.print("then run this command again for the diagnosis.")
        return
    print_diagnosis(outcome.diagnosis)
    if html is not None:
        out.print(f"wrote {html}")


def print_battery(battery: Battery) -> None:
    """The plan: the facts it rests on and each job."""
    f = battery.facts
    window = (
        f"window {f.sliding_window:,} on {len(f.sliding_window_layers or ())} of {f.num_layers} layers"
        if f.sliding_window and f.sliding_window_layers
        else "no sliding window"
    )
    rope = f"RoPE base {f.rope_theta:g}" if f.rope_theta else "RoPE base not stated"
    out.print(
        f"diagnose {battery.model}: {window}; {rope}; batch size {battery.batch_size}; "
        f"{battery.total_trials:,} trials of a budget of {battery.budget:,}"
    )
    for job in battery.jobs:
        variants = ", ".join(job.spec.names)
        out.print(
            f"  {job.line.value}: {job.purpose}; {job.spec.describe_design()}; {job.spec.engine.name}; "
            f"variants {variants}; {job.spec.total_trials:,} trials (key {job.key})"
        )
    for note in battery.notes:
        out.print(f"  not planned: {note}")


def print_stored(outcome: DiagnoseOutcome) -> None:
    """One line: whether the battery is the one stored for these options, and how a fresh plan differs; or
    what `--replan` replaced."""
    if outcome.replaced_stored_at is not None:
        ids = ", ".join(map(str, outcome.replaced_job_ids))
        many = len(outcome.replaced_job_ids) > 1
        left = (
            f"whose job{'s' if many else ''} {ids} {'are' if many else 'is'} not in this plan and "
            f"stay{'' if many else 's'} in the store (`posbias cancel JOB` stops one not done)"
            if ids
            else "every job of which this plan keeps"
        )
        verb = "would replace" if outcome.costs else "replaces"
        out.print(
            f"battery: planned afresh (--replan); it {verb} the one stored "
            f"{_when(outcome.replaced_stored_at)}, {left}"
        )
    elif outcome.battery_read and outcome.battery_stored_at is not None:
        change = outcome.plan_change or "a fresh plan would be the same"
        out.print(
            f"battery: as stored {_when(outcome.battery_stored_at)} by posbias {outcome.battery_stored_by}, "
            f"read as submitted; {change}"
        )


def _when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def print_costs(outcome: DiagnoseOutcome) -> None:
    """The dry run's cost per job and in all."""
    table = Table("job", "trials", "prompt tokens", "GPU time", "rate from")
    for cost in outcome.costs:
        gpu = "-" if cost.gpu_seconds is None else f"{cost.gpu_seconds / 60:,.1f} min"
        table.add_row(
            cost.key.rsplit("/", 1)[-1], f"{cost.trials:,}", f"{cost.prompt_tokens:,}", gpu, cost.rate_source
        )
    out.print(table)
    tokens = sum(c.prompt_tokens for c in outcome.costs)
    gpu_known = [c.gpu_seconds for c in outcome.costs if c.gpu_seconds is not None]
    gpu = f"{sum(gpu_known) / 60:,.1f} min" if gpu_known else "no estimate (no past rate)"
    out.print(f"in all: {outcome.battery.total_trials:,} trials, {tokens:,} prompt tokens, GPU time {gpu}")


def print_diagnosis(diagnosis: Diagnosis) -> None:
    """One row per suspect and line that tested it: the call and its number (95%; accuracy points unless it
    says AUROC or %) with its job; then per suspect whether the lines agree, why each line called it so, and
    for `cannot tell` what would settle it."""
    table = Table("suspect", "verdict", "line", "call", "effect (points, 95%)", "job")
    for verdict in diagnosis.suspects:
        tested = [f for f in verdict.findings if f.call.value != "not tested"]
        for i, f in enumerate(tested):
            number = effect_text(f)
            job = ",".join(map(str, f.job_ids)) + (f":{f.variant}" if f.variant else "")
            first = i == 0
            suspect, call = (verdict.suspect.value, verdict.call.value) if first else ("", "")
            table.add_row(suspect, call, f.line.value, f.call.value, number, job)
    out.print(table)
    for verdict in diagnosis.suspects:
        out.print(f"{verdict.suspect.value}: {verdict.call.value} ({verdict.agreement})")
        for f in verdict.findings:
            if f.call.value != "not tested":
                out.print(f"  {f.line.value}, {f.measure}: {f.reason}")
                if f.settle and f.settle != f.reason:
                    out.print(f"    to settle: {f.settle}")
    out.print(f"diagnosis: {diagnosis.summary}")


def effect_text(finding: Finding) -> str:
    """A finding's number: its interval in its unit (`+0.62 (+0.55 to +0.69) AUROC`), else its bound."""
    unit = finding.unit
    digits = 2 if unit == "AUROC" else 1
    text = interval_text(finding.effect, digits=digits)
    if not text:
        return f"+/-{finding.bound:.{digits}f}" if finding.bound is not None else ""
    return text if unit == "points" else f"{text} {unit}"


def interval_text(effect: Interval | None, *, digits: int = 1) -> str:
    """`-29.8 (-35.1 to -24.5)`; empty for none."""
    if effect is None or effect.estimate is None:
        return ""
    if effect.low is None or effect.high is None:
        return f"{effect.estimate:+.{digits}f}"
    return f"{effect.estimate:+.{digits}f} ({effect.low:+.{digits}f} to {effect.high:+.{digits}f})"
