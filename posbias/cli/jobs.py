"""`posbias status`, `posbias cancel`, `posbias retry`: jobs and their shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JobArg, JsonOpt, describe_variant, id_parser, out, print_json, settings_of
from posbias.schemas.choices import BASELINE

if TYPE_CHECKING:
    from posbias.schemas import JobRecord


def register(app: typer.Typer) -> None:
    """Add `status`, `cancel` and `retry` to the app."""
    app.command()(status)
    app.command()(cancel)
    app.command()(retry)


def status(
    ctx: typer.Context,
    job: Annotated[
        int | None,
        typer.Argument(help="A job id: show its shards.", show_default=False, parser=id_parser("job id")),
    ] = None,
    limit: Annotated[int, typer.Option(help="Jobs to list, newest first.", min=1, max=1_000_000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, or one job's progress and shards (attempts, errors).

    Example: posbias status 3 --json
    """
    settings = settings_of(ctx)
    if job is None:
        found = posbias.jobs(settings=settings, limit=limit)
        if as_json:
            print_json([_job_json(j) for j in found])
            return
        table = Table(title="jobs")
        for column in ("job", "model", "status", "batch sizes", "trials", "created", "error"):
            table.add_column(column)
        for j in found:
            table.add_row(
                str(j.id),
                j.model + (" (quick look)" if j.spec.quick_look else ""),
                j.status.value,
                ",".join(map(str, j.spec.batch_sizes)),
                f"{j.progress.trials_finished}/{j.progress.trials_total}",
                f"{j.created_at:%Y-%m-%d %H:%M}",
                j.error or "",
            )
        out.print(table if found else "no jobs yet: `posbias submit --help`")
        return
    record = posbias.job(job, settings=settings)
    shards = posbias.shards(job, settings=settings)
    p = record.progress
    if as_json:
        data = _job_json(record)
        data["shards"] = [
            {
                "id": s.id,
                "index": s.index,
                "status": s.status.value,
                "attempts": s.attempts,
                "max_attempts": s.max_attempts,
                "lapses": s.lapses,
                "lease_owner": s.lease_owner,
                "lease_expires_at": s.lease_expires_at,
                "trials": s.trial_count,
                "last_error": s.last_error,
                "variant": s.variant,
            }
            for s in shards
        ]
        print_json(data)
        return
    out.print(
        f"job {record.id}: {record.model} - {record.status.value}, "
        f"{p.trials_finished}/{p.trials_total} trials ({p.trials_skipped} skipped)"
    )
    if record.error:
        out.print(f"error: {record.error}")
    if record.spec.limit is not None:
        out.print(
            f"quick look: the first {record.spec.limit} trials of each batch size; left out of the model's "
            f"curves (see them with `posbias curve --job {record.id}`)"
        )
    if record.spec.engine.trust_remote_code:
        out.print("the model's own code: runs on the workers (engine.trust_remote_code: true)")
    if record.context:
        out.print(f"engine context: {record.context.describe()}")
    if record.engine:
        e = record.engine
        out.print(f"engine: {e.name} {e.version}, {e.dtype}, attention {e.attention_backend}, {e.device}")
    if record.endpoint:
        m = record.endpoint.mode
        out.print(
            f"endpoint: {record.endpoint.capabilities.base_url}, {m.api.value} API, constraint "
            f"{m.constraint.value}, option probabilities {'yes' if m.option_probs else 'no'}, token offsets "
            f"{m.token_offsets.value}"
        )
    several = len(record.variants) > 1 or any(v.name != BASELINE for v in record.variants)
    for v in record.variants if several else ():
        fake = record.spec.variant(v.name).fake if v.name in record.spec.names else {}
        built = f"; built: {v.built.describe()}" if v.built is not None else ""
        out.print(f"variant {v.name}: asked {describe_variant(v.expected, fake=fake)}{built}")
    table = Table()
    columns = ["shard", "status", "failed", "lapsed", "trials", "lease owner", "last error"]
    if several:
        columns.insert(1, "variant")
    for column in columns:
        table.add_column(column)
    for s in shards:
        table.add_row(
            str(s.index),
            *([s.variant] if several else []),
            s.status.value,
            f"{s.attempts}/{s.max_attempts}",
            str(s.lapses),
            str(s.trial_count),
            s.lease_owner or "",
            s.last_error or "",
        )
    out.print(table)


def _job_json(job: JobRecord) -> dict[str, Any]:
    progress = job.progress
    return {
        "id": job.id,
        "model": job.model,
        "revision": job.revision,
        "status": job.status.value,
        "priority": job.priority,
        "batch_sizes": list(job.spec.batch_sizes),
        "quick_look": job.spec.limit,
        "trials_total": progress.trials_total,
        "trials_done": progress.trials_done,
        "trials_skipped": progress.trials_skipped,
        "shards": {k.value: v for k, v in progress.shards.items()},
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "error": job.error,
        "idempotency_key": job.idempotency_key,
        "trust_remote_code": job.spec.engine.trust_remote_code,
        "engine": job.engine.model_dump(mode="json") if job.engine else None,
        "endpoint": job.endpoint.model_dump(mode="json") if job.endpoint else None,
        "context": job.context.model_dump(mode="json") if job.context else None,
        "variants": [v.model_dump(mode="json") for v in job.variants],
    }


def cancel(ctx: typer.Context, job: JobArg, as_json: JsonOpt = False) -> None:
    """Cancel a job: queued shards are dropped, late results of running ones are discarded.

    Example: posbias cancel 3
    """
    cancelled = posbias.cancel(job, settings=settings_of(ctx)).shards
    if as_json:
        print_json({"job_id": job, "shards_cancelled": cancelled})
    else:
        out.print(f"cancelled job {job} ({cancelled} shards)")


def retry(ctx: typer.Context, job: JobArg, as_json: JsonOpt = False) -> None:
    """Put a failed job's dead shards back in the queue with fresh attempts.

    Example: posbias retry 3
    """
    requeued = posbias.retry(job, settings=settings_of(ctx)).shards
    if as_json:
        print_json({"job_id": job, "shards_requeued": requeued})
    else:
        out.print(f"job {job}: {requeued} shards back in the queue; run `posbias worker --until-empty`")
