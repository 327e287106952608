"""The public Python API: what the `posbias` command does, as functions a notebook or a script can call.

This module holds jobs and their results (submit, run, dispatch, curves, compare, explain, export, plots);
`posbias/schedules_api.py` holds regression schedules, `posbias/store_api.py` the store's schema version and
`posbias/settings_api.py` the settings (`load_settings`, re-exported here). `posbias/__init__.py` exports
all of them, so `posbias.run(...)` and `posbias.tick_schedules()` are called alike.

Each function takes its main argument positionally and everything else by keyword. `settings` defaults to
`Settings()` (environment variables `POSBIAS_*`, or `.env`), so the store is `POSBIAS_DATABASE_URL`, as for
the command. Every function returns pydantic records (`posbias.schemas`); curves and comparisons have a
`to_pandas()`. Problems the caller can fix raise `PosbiasError` with a message that names the fix, the line
the command prints for the same input: `UsageError` for an argument to change (a value out of range or of
the wrong type; the command's exit code 2), `NotFoundError` and `ConflictError` for what the store holds,
and a `PosbiasError` for a failure of the store, of a file or of the disk. Nothing else escapes a public
function but a bug, an interrupt, or an exception raised by the caller's own callback.

    import posbias

    job = posbias.run({"model": "fake", "engine": {"name": "fake"}, "batch_sizes": [10], "iterations": 20})
    curve = posbias.curves(job.job.id)[0]
    print(curve.to_pandas())
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from posbias import edge
from posbias.schemas import (
    BASELINE,
    Comparison,
    ConflictError,
    Curve,
    CurveAxis,
    CurveQuery,
    DatasetSpec,
    DispatchSummary,
    DryRun,
    ExportSummary,
    JobChange,
    JobProgress,
    JobRecord,
    JobSpec,
    JobStatus,
    ModelInfo,
    Plan,
    QuestionPool,
    RunOutcome,
    ShardRecord,
    ShardResult,
    Submitted,
    Variant,
)
from posbias.schemas.explanation import Explanation
from posbias.schemas.ids import looks_like_id, parse_id
from posbias.service.reports import curves as curve_reports
from posbias.service.settings import Settings
from posbias.service.stats import queries
from posbias.service.store import database_url
from posbias.service.work import jobs as job_store
from posbias.settings_api import load_settings as load_settings

SpecLike = JobSpec | Mapping[str, Any] | str | Path
"""A job spec: a `JobSpec`, a mapping of its fields, or the path of a YAML or JSON spec file."""
Target = int | str | CurveQuery
"""Whose curves: a job id (`3`, or `"3:global-only"` for one of its variants), a model name (every job of
it), or a `CurveQuery`."""


_settings = edge.resolve_settings
"""With `_store`, shared by the API's other modules (`posbias/schedules_api.py`, `posbias/reports_api.py`)."""
_store = edge.open_store


def _spec(spec: SpecLike) -> JobSpec:
    if isinstance(spec, JobSpec):
        return spec.checked_as_new()
    if isinstance(spec, str | Path):
        return JobSpec.from_file(spec)
    return JobSpec.build(dict(edge.typed(spec, Mapping, what="spec", kind=edge.SPEC_KINDS)), source="spec")


# --- questions and plans ------------------------------------------------------------------------------


@edge.public
def load_questions(
    dataset: DatasetSpec | Mapping[str, Any] | None = None, *, settings: Settings | None = None
) -> QuestionPool:
    """The questions a dataset spec names (default: MMLU's test split, from the hub or POSBIAS_MMLU_DIR)."""
    from posbias.service.work import datasets

    spec = edge.dataset(dataset)
    found = _settings(settings)
    return datasets.load_questions(spec, mmlu_dir=found.mmlu_dir, datasets_dir=found.datasets_dir)


@edge.public
def dataset_source(name: str) -> dict[str, str]:
    """A dataset named by one string, as a spec's `dataset` block gives it: `{"path": name}` when `name` is
    meant as a local file or folder (it exists, or starts or ends like a path, or is no hub id), even when it
    is missing, so that a typo is reported as a missing file rather than an unreachable hub; else
    `{"name": name}` (a hub id)."""
    from posbias.service.work import datasets

    name = edge.text(name, what="a dataset")
    return {"path" if datasets.looks_local(name) else "name": name}


@edge.public
def unchecked_overrides(spec: JobSpec, variant: Variant) -> list[str]:
    """The config changes `variant` makes (with the spec's own `hf_overrides`) that are passed to the engine
    but not read back from the built model: only sliding windows and RoPE bases are checked after loading."""
    from posbias.schemas.variant import merge_overrides
    from posbias.workers.variants import unverified_keys

    edge.typed(spec, JobSpec, what="spec", kind="a JobSpec")
    edge.typed(variant, Variant, what="variant", kind="a Variant")
    return unverified_keys(merge_overrides(spec.engine.hf_overrides, variant.hf_overrides))


@edge.public
def plan(spec: SpecLike, *, settings: Settings | None = None) -> Plan:
    """The trials and shards `spec` would run, with the questions they use (the same on any machine)."""
    from posbias.service.work import submission

    return submission.prepare(_spec(spec), settings=_settings(settings)).plan


@edge.public
def dry_run(
    spec: SpecLike,
    *,
    settings: Settings | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_render: Callable[[int, int], None] | None = None,
) -> DryRun:
    """Trials, shards and prompt tokens per batch size, without enqueueing anything. `on_progress(trials
    planned, total)` is called while a large plan is built, as for `submit`; `on_render(done, total)` as
    prompts are measured (a vLLM job's longest, as for `submit`, then those whose tokens it counts: one
    per filler length and batch size at least)."""
    from posbias.service.work import submission

    settings = _settings(settings)
    prepared = submission.prepare(
        _spec(spec), settings=settings, check_cost=False, on_progress=on_progress, on_measure=on_render
    )
    return submission.dry_run(prepared, settings=settings, on_progress=on_render)


# --- jobs ---------------------------------------------------------------------------------------------


@edge.public
def submit(
    spec: SpecLike,
    *,
    settings: Settings | None = None,
    idempotency_key: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_render: Callable[[int, int], None] | None = None,
) -> Submitted:
    """Validate, plan and enqueue a job. With an `idempotency_key` that already names a job with the same
    spec, that job is returned and nothing is written. `on_progress(trials planned, total)` is called while
    a large plan is built; `on_render(done, total)` as a vLLM job's longest prompt is measured (one batch
    size at one filler length at a time)."""
    from posbias.service.work import submission

    settings = _settings(settings)
    with _store(settings) as db:
        prepared = submission.prepare(
            _spec(spec), settings=settings, on_progress=on_progress, on_measure=on_render
        )
        return job_store.submit(
            db,
            prepared.spec,
            prepared.plan,
            idempotency_key=idempotency_key,
            endpoint=prepared.endpoint,
            context=prepared.engine_context,
        )


@edge.public
def dispatch(
    job_ids: Collection[int] | None = None,
    *,
    settings: Settings | None = None,
    until_empty: bool = False,
    max_jobs: int | None = None,
    on_ready: Callable[[str], None] | None = None,
    on_written: Callable[[ShardResult], None] | None = None,
) -> DispatchSummary:
    """Run the queue here, as `posbias worker` does: lease shards (of `job_ids` only, when given), run them
    on Ray actors (`settings.ray_address`), write the results. Returns when stopped (SIGTERM, Ctrl-C), when
    `job_ids` are all finished, when nothing is left (`until_empty`), or after `max_jobs` jobs finished.
    The store and Ray are reached first: `on_ready` is called then, before any shard is leased, with the
    store as it may be shown (its URL without the password). `on_written` is called with each shard's
    result once it is stored."""
    from posbias.service.dispatch import Dispatcher, init_ray

    if job_ids is not None:
        job_ids = [
            edge.job_id(i)
            for i in edge.typed(job_ids, Collection, what="job_ids", kind="a collection of ids")
        ]
    if max_jobs is not None:
        max_jobs = edge.whole(max_jobs, what="max_jobs", low=1, high=1_000_000)
    settings = _settings(settings)
    with _store(settings) as db:
        init_ray(settings)
        if on_ready is not None:
            on_ready(database_url.describe(database_url.normalise_url(settings.database_url)))
        dispatcher = Dispatcher(db, settings=settings, job_ids=job_ids)
        try:
            return dispatcher.run(until_empty=until_empty, max_jobs=max_jobs, on_written=on_written)
        finally:
            dispatcher.close()


@edge.public
def run(
    spec: SpecLike,
    *,
    settings: Settings | None = None,
    idempotency_key: str | None = None,
    on_submitted: Callable[[Submitted], None] | None = None,
    on_written: Callable[[ShardResult], None] | None = None,
) -> RunOutcome:
    """Submit a job and run it here to the end (`posbias run`); its curves come back once it is done.

    `on_submitted` is called once the job is in the queue, `on_written` with each shard's stored result
    (for progress). The outcome says how the job ended; a failed job is not an exception here."""
    from posbias.service.dispatch import init_ray
    from posbias.service.work import submission

    settings = _settings(settings)
    with _store(settings) as db:
        prepared = submission.prepare(_spec(spec), settings=settings)
        # Ray is checked before the job is written: a job that cannot run here is not left in the queue.
        init_ray(settings)
        submitted = job_store.submit(
            db,
            prepared.spec,
            prepared.plan,
            idempotency_key=idempotency_key,
            endpoint=prepared.endpoint,
            context=prepared.engine_context,
        )
    if on_submitted is not None:
        on_submitted(submitted)
    summary = dispatch({submitted.job_id}, settings=settings, on_written=on_written)
    record = job(submitted.job_id, settings=settings)
    found = curves(submitted.job_id, settings=settings) if record.status is JobStatus.done else []
    return RunOutcome(job=record, curves=tuple(found), dispatch=summary)


@edge.public
def job(job_id: int, *, settings: Settings | None = None) -> JobRecord:
    """One job, with its progress. `NotFoundError` when there is none."""
    job_id = edge.job_id(job_id)
    with _store(_settings(settings), read_only=True) as db:
        return job_store.get(db, job_id)


@edge.public
def jobs(
    *,
    settings: Settings | None = None,
    status: JobStatus | None = None,
    model: str | None = None,
    limit: int | None = None,
) -> list[JobRecord]:
    """Jobs, newest first, with their progress; optionally only those with `status` or of `model`."""
    status = None if status is None else edge.choice(JobStatus, status, what="status")
    model = None if model is None else edge.text(model, what="model")
    limit = None if limit is None else edge.whole(limit, what="limit", low=1, high=1_000_000)
    with _store(_settings(settings), read_only=True) as db:
        return job_store.find(db, status=status, model=model, limit=limit)


@edge.public
def progress(job_id: int, *, settings: Settings | None = None) -> JobProgress:
    """How far a job has got: trials done and skipped, shards by status."""
    job_id = edge.job_id(job_id)
    with _store(_settings(settings), read_only=True) as db:
        return job_store.progress(db, job_id)


@edge.public
def shards(job_id: int, *, settings: Settings | None = None) -> list[ShardRecord]:
    """A job's shards in order: status, attempts, lease, last error."""
    job_id = edge.job_id(job_id)
    with _store(_settings(settings), read_only=True) as db:
        return job_store.shards(db, job_id)


@edge.public
def cancel(job_id: int, *, settings: Settings | None = None) -> JobChange:
    """Cancel a job: queued shards are dropped, late results of running ones are discarded. Says how many
    shards were cancelled. `ConflictError` when it had already finished."""
    job_id = edge.job_id(job_id)
    with _store(_settings(settings)) as db:
        count = job_store.cancel(db, job_id)
        return JobChange(job=job_store.get(db, job_id), shards=count)


@edge.public
def retry(job_id: int, *, settings: Settings | None = None) -> JobChange:
    """Put a failed job's dead shards back in the queue with fresh attempts. Says how many. `ConflictError`
    when it was cancelled or has no dead shards."""
    job_id = edge.job_id(job_id)
    with _store(_settings(settings)) as db:
        count = job_store.retry(db, job_id)
        return JobChange(job=job_store.get(db, job_id), shards=count)


# --- results ------------------------------------------------------------------------------------------


def _query(
    target: Target, *, revision: str | None, batch_size: int | None, variant: str | None = None
) -> CurveQuery:
    batch_size = edge.batch_size(batch_size)
    if isinstance(target, CurveQuery):
        return target
    edge.typed(target, int | str, what="a curve's target", kind="a job id, a model name or a CurveQuery")
    if isinstance(target, int):
        return CurveQuery(job_id=edge.job_id(target), batch_size=batch_size, variant=variant)
    job, colon, named = target.partition(":")
    if looks_like_id(job):  # a full-width 2 is refused as a job id, not read as job 2 or taken for a model
        return CurveQuery(
            job_id=parse_id(job), batch_size=batch_size, variant=(named if colon else variant) or None
        )
    return CurveQuery(model=target, revision=revision, batch_size=batch_size, variant=variant)


@edge.public
def curves(
    target: Target,
    *,
    settings: Settings | None = None,
    batch_size: int | None = None,
    revision: str | None = None,
    variant: str | None = None,
    by: CurveAxis = CurveAxis.position,
    bin_width: int = 256,
) -> list[Curve]:
    """One curve per variant and batch size of a job (an id) or a model (a name, every job of it), in
    batch-size order, the baseline first (`variant`: that one only): accuracy by position (or by token
    distance, `by`) with intervals. `NotFoundError` when there are no results."""
    query = _query(target, revision=revision, batch_size=batch_size, variant=variant)
    by = edge.choice(CurveAxis, by, what="by")
    bin_width = edge.whole(bin_width, what="bin width", low=1, high=10_000_000)
    with _store(_settings(settings), read_only=True) as db:
        return curve_reports.curves(db, query, by=by, bin_width=bin_width)


@edge.public
def compare(
    a: Target, b: Target, *, settings: Settings | None = None, batch_size: int | None = None
) -> Comparison:
    """B minus A at every position, at one batch size (needed when the two share several). Two variants of
    a job (`compare("3:baseline", "3:global-only")`) answer the same trials: compared paired."""
    qa = _query(a, revision=None, batch_size=None)
    qb = _query(b, revision=None, batch_size=None)
    batch_size = edge.batch_size(batch_size)
    with _store(_settings(settings), read_only=True) as db:
        if batch_size is None:
            sizes = set(curve_reports.batch_sizes(db, qa)) & set(curve_reports.batch_sizes(db, qb))
            if len(sizes) != 1:
                raise ConflictError(
                    f"pick one batch size with --batch-size (batch_size= in Python): both have "
                    f"{sorted(sizes)}"
                    if sizes
                    else "the two have no batch size in common"
                )
            batch_size = sizes.pop()
        return curve_reports.compare(db, qa, qb, batch_size=batch_size)


@edge.public
def explain(
    job_ids: int | Collection[int],
    *,
    settings: Settings | None = None,
    batch_size: int | None = None,
    variant: str = BASELINE,
) -> list[Explanation]:
    """What moves the curve of a job (or of several jobs of one model, pooled), per batch size: position,
    answer slot and token distance fitted together (clustered, difficulty adjusted), which of them is
    distinguishable from zero and which the design cannot tell apart, and for a model with a sliding window
    whether there is a step at the window. `variant`: which of the jobs' variants (each is explained on its
    own, with the window its engine was built with). `NotFoundError` when there are no results."""
    given = (
        [job_ids] if isinstance(job_ids, int) else edge.typed(job_ids, Collection, what="job_ids", kind="ids")
    )
    ids = [edge.job_id(i) for i in given]
    batch_size = edge.batch_size(batch_size)
    variant = edge.text(variant, what="variant")
    with _store(_settings(settings), read_only=True) as db:
        return curve_reports.explain(db, ids, batch_size=batch_size, variant=variant)


@edge.public
def plot_curves(
    curves: Sequence[Curve],
    *,
    path: str | Path,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    band: bool = False,
    chance: float | None = None,
) -> Path:
    """Write `curves` at `path` (.png, .pdf or .svg), a line per curve labelled by what differs (batch
    size, filler, variant; `labels` instead), its pointwise 95% interval shaded and with `band` the
    simultaneous band lighter; chance dashed (`chance` when the curves lack it). Returns the path."""
    from posbias.service.reports import plot

    out = edge.path(path, what="path")
    return plot.plot_curves(curves, path=out, labels=labels, title=title, band=band, chance=chance)


@edge.public
def plot_heatmap(curves: Sequence[Curve], *, path: str | Path, title: str | None = None) -> Path:
    """Write a heatmap at `path` (.png, .pdf or .svg): accuracy by filler length (rows) and position
    (columns), one panel per batch size, from the curves by position of a filler sweep (`curves(job)`, one
    per filler length). Returns the path."""
    from posbias.service.reports import plot

    return plot.plot_heatmap(curves, path=edge.path(path, what="path"), title=title)


@edge.public
def export_format(out: str | Path, format: str | None = None) -> str:
    """The format `export_results` would write `out` in: `format`, or the one `out`'s suffix names.
    `PosbiasError` when neither is csv or parquet (a check that needs no store)."""
    from posbias.service.reports import export

    return export.export_format(edge.path(out, what="out"), edge.format_name(format))


@edge.public
def export_results(
    job_id: int,
    *,
    out: str | Path,
    settings: Settings | None = None,
    format: str | None = None,
    overwrite: bool = False,
) -> ExportSummary:
    """Write every result row of a job to `out` as CSV or Parquet (`format`, or from the suffix). An
    existing file is replaced only with `overwrite` (else `OutputExists`); a device or a pipe
    (`/dev/stdout`) is written to."""
    from posbias.service.reports import export

    job_id, path, format = edge.job_id(job_id), edge.path(out, what="out"), edge.format_name(format)
    with _store(_settings(settings), read_only=True) as db:
        return export.export_results(db, job_id, path=path, format=format, overwrite=overwrite)


@edge.public
def models(*, settings: Settings | None = None) -> list[ModelInfo]:
    """Every model with results: layers, sliding window and which layers use it, RoPE base, context."""
    with _store(_settings(settings), read_only=True) as db:
        return queries.list_models(db)
