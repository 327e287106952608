"""`posbias submit` and `posbias run`: a job spec from a file and the flags (`spec_flags.py`), submitted, or
run here to the end with a progress bar."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

import posbias
from posbias.cli.common import describe_variant, err, out, print_json, settings_of
from posbias.cli.curves import print_curve
from posbias.cli.errors import BadUsage
from posbias.cli.spec_flags import caught_cautions, print_cautions, takes_spec
from posbias.schemas.errors import PosbiasError

if TYPE_CHECKING:
    from posbias.schemas import DesignEstimate, DryRun, JobSpec, ShardResult, Submitted


def register(app: typer.Typer) -> None:
    """Add `submit` and `run` to the app."""
    app.command()(submit)
    app.command()(run)


KeyOpt = Annotated[
    str | None,
    typer.Option(
        help="Submitting again with the same key returns the same job instead of a new one.",
        rich_help_panel="Output",
    ),
]
OutJsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.", rich_help_panel="Output")]


# --- submit / run -------------------------------------------------------------------------------------


@takes_spec
def submit(
    ctx: typer.Context,
    spec: JobSpec,
    idempotency_key: KeyOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            help="Print trials, shards and prompt tokens, and per batch size and filler length the token "
            "distances covered and how many reach past the model's sliding window; enqueue nothing.",
            rich_help_panel="Output",
        ),
    ] = False,
    as_json: OutJsonOpt = False,
) -> None:
    """Validate a job, plan its trials and enqueue them; prints the job id.

    Example: posbias submit --model google/gemma-2-2b-it --batch-sizes 1,5,10,20,50 --iterations 100
    """
    settings = settings_of(ctx)
    if dry_run:
        with StepProgress(asked=settings.verbose) as progress, caught_cautions(ctx):
            found = posbias.dry_run(
                spec,
                settings=settings,
                on_progress=progress.step("planning", unit="trials", at_least=LARGE_PLAN),
                on_render=progress.step("measuring prompts", unit="", at_least=MANY_PROMPTS),
            )
        _print_dry_run(found, as_json=as_json)
        print_cautions(ctx)
        return
    with StepProgress(asked=settings.verbose) as progress, caught_cautions(ctx):
        submitted = posbias.submit(
            spec,
            settings=settings,
            idempotency_key=idempotency_key,
            on_progress=progress.step("planning", unit="trials", at_least=LARGE_PLAN),
            on_render=progress.step("measuring prompts", unit="", at_least=MANY_PROMPTS),
        )
    print_cautions(ctx)
    if as_json:
        print_json(
            {
                "job_id": submitted.job_id,
                "created": submitted.created,
                "trials": submitted.trials,
                "quick_look": spec.limit,
            }
        )
        return
    verb = "submitted" if submitted.created else "already submitted with this idempotency key:"
    look = f", a quick look: the first {spec.limit} trials of each batch size" if spec.quick_look else ""
    out.print(f"{verb} job {submitted.job_id} ({submitted.trials} trials, {submitted.shards} shards{look})")
    out.print(
        f"run it with `posbias worker --until-empty`; watch it with `posbias status {submitted.job_id}`"
    )


def _print_dry_run(dry: DryRun, *, as_json: bool) -> None:
    if as_json:
        data = dry.model_dump(mode="json")
        data["total_prompt_tokens"] = dry.total_prompt_tokens
        print_json(data)
        return
    table = Table(title=f"dry run: {dry.spec.model} ({dry.questions_in_pool} questions from {dry.source})")
    for column in ("batch size", "trials", "shards", "mean prompt tokens", "max prompt tokens"):
        table.add_column(column, justify="right")
    for b in dry.batch_sizes:
        table.add_row(
            str(b.batch_size),
            str(b.trials),
            str(b.shards),
            f"{b.mean_prompt_tokens:.0f}",
            str(b.max_prompt_tokens),
        )
    out.print(table)
    if dry.designs:
        _print_designs(dry)
    counting = f"; {dry.counting}" if dry.counting else ""
    out.print(
        f"prompt tokens in all: about {dry.total_prompt_tokens:,} (counted with {dry.tokenizer}{counting})"
    )
    if dry.spec.variants:
        out.print(f"{len(dry.spec.variants)} variants, each answering every trial:")
        for v in dry.spec.variants:
            asked = describe_variant(v.expect, fake=v.fake)
            # Only windows and RoPE bases are read back from the built model; say which changes are not.
            unchecked = posbias.unchecked_overrides(dry.spec, v)
            note = f" (not checked after loading: {', '.join(unchecked)})" if unchecked else ""
            out.print(f"  {v.name}: {asked}{note}")
    if dry.context is not None:
        own = f"{dry.model_context:,}" if dry.model_context is not None else "not known here"
        out.print(f"engine context: {dry.context.describe()}; the model's own: {own}")
    if dry.endpoint is not None:
        _print_endpoint(dry)
    out.print(f"the model's own code: {_trust(dry.spec.engine.trust_remote_code)}")
    out.print("nothing was enqueued (dry run)")


def _trust(trusted: bool) -> str:
    return "runs on the workers (engine.trust_remote_code: true)" if trusted else "never run"


def _print_endpoint(dry: DryRun) -> None:
    """What a served job's endpoint can do, what the job would use, and what it may spend."""
    assert dry.endpoint is not None
    caps, mode = dry.endpoint.capabilities, dry.endpoint.mode
    served = caps.served_model + (f", server {caps.server_version}" if caps.server_version else "")
    out.print(f"endpoint {caps.base_url}: {served}")
    table = Table(title="capabilities (probed)")
    for column in ("capability", "found", "this job"):
        table.add_column(column)
    logprobs = f"{caps.completions_logprobs} / {caps.chat_logprobs} alternatives (completions / chat)"
    structured = caps.regex_field or ("json_schema" if caps.json_schema else "none")
    table.add_row("API", f"completions {_yes(caps.completions)}, chat {_yes(caps.chat)}", mode.api.value)
    table.add_row("log-probabilities", logprobs, "option probabilities" if mode.option_probs else "not used")
    table.add_row("structured output", structured, mode.constraint.value)
    table.add_row("/tokenize", _yes(caps.tokenize), f"token offsets: {mode.token_offsets.value}")
    out.print(table)
    bound = (
        f"tokens the job may spend: up to about {dry.endpoint.token_bound:,} (prompts + every output budget)"
    )
    if dry.max_job_tokens is not None:
        verdict = (
            "within" if dry.endpoint.token_bound <= dry.max_job_tokens else "OVER; submit would refuse it"
        )
        bound += f"; cost guard {dry.max_job_tokens:,}: {verdict}"
    out.print(bound)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _print_designs(dry: DryRun) -> None:
    window = dry.sliding_window
    own = f"the model's sliding window: {window:,} tokens" if window else "no sliding window known here"
    table = Table(title=f"design: {dry.design} ({own})")
    columns = ["batch size", "filler tokens", "trials", "mean prompt tokens", "max prompt tokens"]
    columns += ["token distances", "past the window"]
    for column in columns:
        table.add_column(column, justify="right")
    shown = _design_rows(dry)
    for d in shown:
        distances = (
            f"{d.min_distance:,} to {d.max_distance:,}"
            if d.min_distance is not None and d.max_distance is not None
            else "not known here"
        )
        past = "" if d.past_window is None else f"{100 * d.past_window:.0f}% of answers"
        table.add_row(
            str(d.batch_size),
            f"{d.filler_tokens:,}",
            str(d.trials),
            f"{d.mean_prompt_tokens:.0f}",
            str(d.max_prompt_tokens),
            distances,
            past,
        )
    out.print(table)
    if len(shown) < len(dry.designs):
        lengths = len(dry.spec.filler_lengths)
        out.print(
            f"showing {DESIGN_ROWS} of the {lengths:,} filler lengths of each batch size, evenly spaced; "
            "--json lists every one"
        )
    out.print(
        "token distances: from a question's end to its answer, the answers on the lines the design asks for"
    )


DESIGN_ROWS = 40
"""Filler lengths a batch size shows in the dry run's design table at most: a sweep of 5,000 would be 5,000
rows (and seconds to draw them)."""


def _design_rows(dry: DryRun) -> list[DesignEstimate]:
    """The design rows to show: at most `DESIGN_ROWS` filler lengths a batch size, evenly spaced, the first
    and the last among them."""
    by_size: dict[int, list[DesignEstimate]] = {}
    for d in dry.designs:
        by_size.setdefault(d.batch_size, []).append(d)
    shown = []
    for rows in by_size.values():
        picks = sorted({round(i * (len(rows) - 1) / (DESIGN_ROWS - 1)) for i in range(DESIGN_ROWS)})
        shown += [rows[i] for i in picks] if len(rows) > DESIGN_ROWS else rows
    return shown


@takes_spec
def run(
    ctx: typer.Context,
    spec: JobSpec,
    idempotency_key: KeyOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="Also write the curve here (.png, .pdf or .svg).", rich_help_panel="Output"),
    ] = None,
    as_json: OutJsonOpt = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", hidden=True)] = False,
) -> None:
    """Submit a job and run it here to the end (local Ray), with a progress bar; then print its curve.

    Example: posbias run --model demo --batch-sizes 1,5,10 --iterations 4 --answer-mode constrained
    """
    if dry_run:
        raise BadUsage(
            "`posbias run` has no --dry-run: `posbias submit --dry-run` takes the same flags and shows what "
            "the job would do"
        )
    if plot is not None:
        try:
            posbias.plot_format(plot)  # a flag to fix, before the job runs
        except PosbiasError as exc:
            raise BadUsage(str(exc)) from None
    bar = _ProgressBar(model=spec.model, quiet=as_json)

    def submitted(job: Submitted) -> None:
        print_cautions(ctx)
        bar.start(job)

    try:
        with caught_cautions(ctx):
            outcome = posbias.run(
                spec,
                settings=settings_of(ctx),
                idempotency_key=idempotency_key,
                on_submitted=submitted,
                on_written=bar.advance,
            )
    finally:
        bar.stop()
    job = outcome.job
    if plot is not None and outcome.curves:
        posbias.plot_curves(outcome.curves, path=plot)
    if as_json:
        print_json(
            {
                "job_id": job.id,
                "status": job.status.value,
                "error": job.error,
                "curves": [c.model_dump(mode="json") for c in outcome.curves],
            }
        )
    else:
        for curve in outcome.curves:
            print_curve(curve)
        if plot is not None and outcome.curves:
            out.print(f"wrote {plot}")
    if outcome.dispatch.interrupted:
        raise PosbiasError(f"interrupted; job {job.id} continues with `posbias worker --until-empty`")
    if job.status.value != "done":
        raise PosbiasError(
            f"job {job.id} ended {job.status.value}: {job.error}; see `posbias status {job.id}`"
        )


class StepProgress:
    """How far a long step has got (`label: done/total unit`), on stderr: a bar, cleared at the end, when
    stderr is a terminal; a plain line at each tenth done when it is not but progress is asked for
    (`--verbose`, or POSBIAS_VERBOSE); otherwise nothing, so that a pipe or a log gets no noise. One bar
    serves one step after another."""

    def __init__(self, *, asked: bool = False) -> None:
        self._asked = asked
        self._bar: Progress | None = None
        self._task: Any = None
        self._label = ""
        self._said: dict[str, int] = {}

    def __enter__(self) -> StepProgress:
        return self

    def step(self, label: str, *, unit: str, at_least: int = 1) -> Callable[[int, int], None]:
        """A callback `(done, total)` for the step `label` (e.g. `planning`) counting `unit`; steps of
        fewer than `at_least` items are done too fast to show."""

        def update(done: int, total: int) -> None:
            if total >= at_least:
                self.update(label, done, total, unit=unit)

        return update

    def update(self, label: str, done: int, total: int, *, unit: str) -> None:
        """`done` of `total` items of step `label`."""
        if err.is_terminal:
            self._draw(label, done, total, unit=unit)
        elif self._asked and total > 0:
            if done == 0:  # the step starts (again: a dry run measures prompts twice)
                self._said.pop(label, None)
            tenth = 10 * done // total
            if tenth > self._said.get(label, -1):
                self._said[label] = tenth
                err.print(f"{label}: {done:,}/{total:,} {unit}".rstrip())

    def _draw(self, label: str, done: int, total: int, *, unit: str) -> None:
        if self._bar is None:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"),
                console=err,
                transient=True,
            )
            self._task = self._bar.add_task(label, total=total, unit=unit)
            self._label = label
            self._bar.start()
        if label != self._label:
            self._label = label
            self._bar.reset(self._task, total=total, description=label, unit=unit)
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


LARGE_PLAN = 50_000
"""Trials: plans smaller than this are built too fast to need a progress bar."""
MANY_PROMPTS = 200
"""Prompts to measure (or batch sizes x filler lengths whose longest is measured): fewer take too little
time to need a progress bar."""


class _ProgressBar:
    """Trials done out of the job's total on stderr, with the rate and an ETA."""

    def __init__(self, *, model: str, quiet: bool, clock: Callable[[], float] | None = None) -> None:
        self._model = model
        self._quiet = quiet
        self._clock = clock
        self._bar: Progress | None = None
        self._task: Any = None

    def start(self, submitted: Submitted) -> None:
        if self._quiet:
            return
        out.print(f"job {submitted.job_id}: {submitted.trials} trials of {self._model}")
        columns = (
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("trials"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        self._bar = Progress(*columns, console=err, transient=False, get_time=self._clock)
        self._task = self._bar.add_task("running", total=submitted.trials, rate="")
        self._bar.start()

    def advance(self, result: ShardResult) -> None:
        if self._bar is None:
            return
        self._bar.advance(self._task, len(result.trials))
        # The mean since the start, not rich's `speed`: that divides by the time between the samples in its
        # window, which is microseconds when a burst of shards is written at once (586,102 trials/s seen).
        task = self._bar.tasks[0]
        speed = task.completed / task.elapsed if task.elapsed else None
        self._bar.update(self._task, rate=f"{speed:.2f} trials/s" if speed else "")

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
