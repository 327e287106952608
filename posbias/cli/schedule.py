"""`posbias schedule ...`: regression runs for new checkpoints (the API is `posbias/schedules_api.py`).

A typer sub-app mounted by `posbias/cli/app.py`. It reads the same `Settings` (the parent's context object)
and leaves errors to `errors.py`: `PosbiasError` is one line and exit 1, a usage error exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JsonOpt, err, out, print_json, settings_of
from posbias.cli.schedule_json import checkpoint_json, report_json, schedule_json, tick_json
from posbias.cli.submit import StepProgress
from posbias.schemas.choices import HubRevisions
from posbias.schemas.errors import PosbiasError
from posbias.schemas.limits import MAX_BATCH_SIZE

if TYPE_CHECKING:
    from posbias.schemas import Interval
    from posbias.schemas.schedule import PositionDrop, RegressionRule

app = typer.Typer(
    help="Regression runs: evaluate each new checkpoint of a model and judge it against a baseline.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="Schedule name.", show_default=False)]


def _rule(
    ctx: typer.Context,
    *,
    max_drop: float | None,
    max_shift: float | None,
    max_parse_drop: float,
    confidence: float,
) -> RegressionRule:
    from pydantic import ValidationError

    from posbias.schemas.schedule import RegressionRule

    try:
        return RegressionRule(
            max_drop=max_drop, max_shift=max_shift, max_parse_drop=max_parse_drop, confidence=confidence
        )
    except ValidationError as exc:
        # A usage error (exit 2): the flags must change. Name the flag, not the field.
        first = exc.errors()[0]
        flag = "--" + "-".join(str(part) for part in first["loc"]).replace("_", "-")
        message = str(first["msg"]).removeprefix("Value error, ")
        ctx.fail(message if flag == "--" else f"bad regression rule: {flag}: {message}")


# --- add / list / show / remove / pause / resume --------------------------------------------------------


@app.command("add")
def add(
    ctx: typer.Context,
    name: NameArg,
    spec: Annotated[
        str,
        typer.Option(
            help="Job spec template: a YAML/JSON file, or inline JSON. Each checkpoint fills in `model` "
            "(and `revision`).",
            show_default=False,
        ),
    ],
    folder: Annotated[
        Path | None,
        typer.Option(
            help="Folder whose subfolders are checkpoints (e.g. checkpoint-1000/).", show_default=False
        ),
    ] = None,
    hub: Annotated[
        str | None, typer.Option(help="Hugging Face repository id whose new revisions are checkpoints.")
    ] = None,
    branch: Annotated[str, typer.Option(help="Hub branch to follow.")] = "main",
    revisions: Annotated[
        HubRevisions,
        typer.Option(help="Hub: `commits` (new commits on --branch) or `branches` (each branch or tag)."),
    ] = HubRevisions.commits,
    baseline: Annotated[
        str,
        typer.Option(
            help="Compare with: `first` (the first checkpoint's job), `previous` (the previous "
            "checkpoint's job) or a job id."
        ),
    ] = "first",
    max_drop: Annotated[
        float | None,
        typer.Option(help="Regression: accuracy at some position drops by more than this many points."),
    ] = None,
    max_shift: Annotated[
        float | None,
        typer.Option(
            help="Regression: last-minus-first accuracy (position bias) changes by more than this many "
            "points, either way."
        ),
    ] = None,
    max_parse_drop: Annotated[
        float,
        typer.Option(help="Regression: the parse rate at some position or block drops by more than this."),
    ] = 5.0,
    confidence: Annotated[float, typer.Option(help="Confidence of the intervals the rule uses.")] = 0.95,
    as_json: JsonOpt = False,
) -> None:
    """Add a schedule: where checkpoints appear, the job each gets, its baseline and regression rule.

    A checkpoint folder counts once it holds config.json and all its weights. With the fake engine, a
    checkpoint folder's posbias-fake.json (`fake` block and `seed`) overrides the template's: a test hook.

    Example: posbias schedule add nightly --folder runs/ckpts --spec spec.yaml --baseline first --max-drop 5
    """
    if (folder is None) == (hub is None):
        ctx.fail("give one checkpoint source: --folder DIR or --hub OWNER/NAME")
    rule = _rule(
        ctx, max_drop=max_drop, max_shift=max_shift, max_parse_drop=max_parse_drop, confidence=confidence
    )
    source = (
        posbias.FolderSource(path=folder)
        if folder is not None
        else posbias.HubSource(repo=str(hub), branch=branch, revisions=revisions)
    )
    try:
        record = posbias.add_schedule(
            name, spec=spec, source=source, rule=rule, baseline=baseline, settings=settings_of(ctx)
        )
    except posbias.ScheduleSpecError as exc:
        ctx.fail(str(exc))
    if as_json:
        print_json(schedule_json(record))
        return
    out.print(f"added schedule {record.name}: {record.source_text}, baseline {record.baseline_text}")
    out.print(f"rule: {record.rule.describe()}")
    out.print(f"run `posbias schedule tick {record.name}` from cron, and `posbias worker` to run its jobs")


@app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List schedules with their source, baseline, rule and state.

    Example: posbias schedule list --json
    """
    found = posbias.list_schedules(settings=settings_of(ctx))
    if as_json:
        print_json([{**schedule_json(s.schedule), "checkpoints": len(s.checkpoints)} for s in found])
        return
    if not found:
        out.print("no schedules yet: `posbias schedule add --help`")
        return
    table = Table(title="schedules")
    for column in ("name", "source", "baseline", "rule", "state", "checkpoints", "last tick", "problem"):
        table.add_column(column)
    for state in found:
        r = state.schedule
        table.add_row(
            r.name,
            r.source_text,
            r.baseline_text,
            r.rule.describe(),
            "paused" if r.paused else "active",
            str(len(state.checkpoints)),
            f"{r.last_tick_at:%Y-%m-%d %H:%M}" if r.last_tick_at else "never",
            r.last_error or "",
        )
    out.print(table)


@app.command("show")
def show(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """One schedule: its settings and every checkpoint with its job and verdict.

    Example: posbias schedule show nightly
    """
    found = posbias.schedule(name, settings=settings_of(ctx))
    record, checkpoints = found.schedule, found.checkpoints
    if as_json:
        print_json(
            {
                **schedule_json(record),
                "checkpoints": [checkpoint_json(c) for c in checkpoints],
            }
        )
        return
    out.print(f"schedule {record.name} ({'paused' if record.paused else 'active'}): {record.source_text}")
    out.print(f"baseline: {record.baseline_text}; rule: {record.rule.describe()}")
    if record.last_error:
        out.print(f"last tick: {record.last_error}")
    table = Table()
    for column in ("checkpoint", "step", "job", "job status", "verdict", "reason"):
        table.add_column(column)
    for c in checkpoints:
        table.add_row(
            c.name,
            "" if c.step is None else str(c.step),
            "" if c.job_id is None else str(c.job_id),
            c.job_status.value if c.job_status else "",
            c.verdict.value,
            c.reason,
        )
    out.print(table if checkpoints else "no checkpoints yet: `posbias schedule tick` looks for them")


@app.command("remove")
def remove(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Delete a schedule and its checkpoint records; the jobs it submitted and their results stay.

    Example: posbias schedule remove nightly
    """
    forgotten = posbias.remove_schedule(name, settings=settings_of(ctx))
    if as_json:
        print_json({"schedule": name, "removed": True, "checkpoints": forgotten})
    else:
        out.print(f"removed schedule {name} ({forgotten} checkpoint records; its jobs stay)")


@app.command("pause")
def pause(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Stop picking up new checkpoints (jobs already submitted still get their verdicts).

    Example: posbias schedule pause nightly
    """
    _print_paused(posbias.pause_schedule(name, settings=settings_of(ctx)), as_json=as_json)


@app.command("resume")
def resume(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Pick up new checkpoints again; the next tick catches up on any that appeared meanwhile.

    Example: posbias schedule resume nightly
    """
    _print_paused(posbias.resume_schedule(name, settings=settings_of(ctx)), as_json=as_json)


def _print_paused(record: posbias.ScheduleRecord, *, as_json: bool) -> None:
    if as_json:
        print_json(schedule_json(record))
    else:
        out.print(f"schedule {record.name} is {'paused' if record.paused else 'active'}")


# --- tick -----------------------------------------------------------------------------------------------


@app.command("tick")
def tick(
    ctx: typer.Context,
    name: Annotated[
        str | None, typer.Argument(help="One schedule (default: every schedule).", show_default=False)
    ] = None,
    fail_on_regression: Annotated[
        bool,
        typer.Option(
            help="Exit 1 while a schedule's newest compared checkpoint is a regression (for CI gates)."
        ),
    ] = False,
    run: Annotated[
        bool,
        typer.Option(
            "--run",
            help="Also run the schedules' unfinished jobs here (a local Ray, as `posbias worker`), then "
            "judge them: one CI step instead of tick, worker, tick.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Find new checkpoints, submit their jobs, judge finished ones against the baseline, post verdicts to
    POSBIAS_WEBHOOK_URL. Safe to run from cron every few minutes, even two at once; runs no job itself
    unless --run.

    Example: posbias schedule tick nightly --run --fail-on-regression
    """
    settings = settings_of(ctx)
    done = _tick(name, settings=settings)
    ran: list[int] = []
    before = done
    if run:
        ran = _unfinished_jobs(name, settings=settings)
        if not as_json:
            _print_tick(before)
            out.print(f"running jobs {', '.join(map(str, ran))} here" if ran else "no jobs to run")
        if ran:
            posbias.dispatch(ran, settings=settings)
        done = _tick(name, settings=settings)
    if as_json:
        print_json(
            {
                **tick_json(done),
                **({"ran_jobs": ran, "first_tick": tick_json(before)} if run else {}),
            }
        )
    else:
        _print_tick(done)
    if fail_on_regression and done.regressions:
        first = done.regressions[0]
        named = "; ".join(f"{r.checkpoint} of schedule {r.schedule}" for r in done.regressions)
        raise PosbiasError(
            f"regression: {named} ({first.reason}); see `posbias schedule report {first.schedule}`"
        )


MANY_CHECKPOINTS = 10
"""Checkpoints a tick submits jobs for: fewer take a few seconds and need no progress shown."""


def _tick(name: str | None, *, settings: posbias.Settings) -> posbias.TickReport:
    """One tick, with its progress on stderr while it submits many checkpoints' jobs (`StepProgress`)."""
    with StepProgress(asked=settings.verbose) as progress:

        def taken(schedule: str, done: int, total: int) -> None:
            if total >= MANY_CHECKPOINTS:
                progress.update(f"schedule {schedule}", done, total, unit="checkpoints")

        return posbias.tick_schedules(name, settings=settings, on_progress=taken)


def _unfinished_jobs(name: str | None, *, settings: posbias.Settings) -> list[int]:
    """The jobs of the schedules (or of schedule `name`) that have not finished, oldest first."""
    from posbias.schemas import FINISHED_JOB_STATUSES

    states = (
        [posbias.schedule(name, settings=settings)] if name else posbias.list_schedules(settings=settings)
    )
    return sorted(
        c.job_id
        for state in states
        for c in state.checkpoints
        if c.job_id is not None and c.job_status is not None and c.job_status not in FINISHED_JOB_STATUSES
    )


def _print_tick(done: posbias.TickReport) -> None:
    if not done.schedules:
        out.print("no schedules: `posbias schedule add --help`")
    for s in done.schedules:
        parts = ["paused"] if s.paused else []
        if s.discovered:
            parts.append(f"new checkpoints {', '.join(s.discovered)}")
        if s.submitted:
            parts.append("jobs " + ", ".join(f"{x.checkpoint}: {x.job_id}" for x in s.submitted))
        if s.settled:
            parts.append("verdicts " + ", ".join(f"{v.checkpoint}: {v.verdict.value}" for v in s.settled))
        if s.waiting:
            parts.append("not complete yet " + ", ".join(f"{w.name} ({w.reason})" for w in s.waiting))
        out.print(f"schedule {s.schedule}: {'; '.join(parts) or 'nothing new'}")
        if s.problem:
            err.print(f"warning: schedule {s.schedule}: {s.problem}")
        for v in s.settled:
            out.print(f"  {v.checkpoint}: {v.verdict.value} - {v.reason}")
    if done.announced:
        out.print(f"posted {len(done.announced)} verdicts to the webhook")


# --- report ---------------------------------------------------------------------------------------------


@app.command("report")
def report(
    ctx: typer.Context,
    name: NameArg,
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Batch size to report (default: the template's largest).", min=1, max=MAX_BATCH_SIZE
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Also write a PNG: the finished checkpoints' curves overlaid.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Every checkpoint in order: job, status, verdict, first and last accuracy, last minus first, and the
    worst drop of its verdict (flagged *, or else the largest drop the data allow, a simultaneous bound).

    Example: posbias schedule report nightly --batch-size 50 --plot nightly.png
    """
    found = posbias.schedule_report(name, batch_size=batch_size, settings=settings_of(ctx))
    if plot is not None:
        found.plot(plot)
    if as_json:
        print_json(report_json(found))
        return
    table = Table(
        title=f"schedule {name} - batch size {found.batch_size}, baseline {found.schedule.baseline_text}"
    )
    for column in ("checkpoint", "job", "status", "verdict", "first", "last", "last - first", "worst drop"):
        table.add_column(column, justify="left" if column in {"checkpoint", "status", "verdict"} else "right")
    for row in found.rows:
        c = row.checkpoint
        table.add_row(
            c.name,
            "" if c.job_id is None else str(c.job_id),
            c.job_status.value if c.job_status else "",
            c.verdict.value,
            _pct(row.first_accuracy),
            _pct(row.last_accuracy),
            _contrast(row.contrast),
            _drop(row.worst_drop),
        )
    out.print(table if found.rows else f"no checkpoints yet: `posbias schedule tick {name}` looks for them")
    for row in found.rows:
        if row.checkpoint.verdict.value in {"regression", "error", "inconclusive"}:
            out.print(f"{row.checkpoint.name}: {row.checkpoint.reason}")
    if plot is not None:
        out.print(f"wrote {plot}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _contrast(value: Interval | None) -> str:
    if value is None or value.estimate is None or value.low is None or value.high is None:
        return "-"
    return f"{100 * value.estimate:+.1f} ({100 * value.low:+.1f} to {100 * value.high:+.1f}) pts"


def _drop(value: PositionDrop | None) -> str:
    if value is None:
        return "-"
    if value.flagged:
        return f"{100 * value.diff:+.1f} pts at {value.where} (at most {100 * value.upper:+.1f}) *"
    return f"{100 * value.diff:+.1f} pts at {value.where} (at least {100 * value.lower:+.1f})"
