"""Curves as users ask for them: read a model's or a job's answers from the store and analyse them
(`service/analysis.py` for one curve, `service/comparison.py` for two).

A job's variants are never pooled: each variant is a curve of its own, and two variants of one job answer
the same trials, so comparing them is paired."""

from __future__ import annotations

from posbias.schemas import (
    Comparison,
    ConflictError,
    Curve,
    CurveAxis,
    CurveQuery,
    NotFoundError,
    PosbiasError,
    TokenSource,
)
from posbias.service import analysis, comparison, jobs, store
from posbias.service.database import Database


def _resolve(db: Database, query: CurveQuery) -> tuple[str, str | None, list[int]]:
    """The model, revision and jobs a query names. `NotFoundError` naming the fix when nothing matches."""
    if query.model is None and query.job_id is None:
        raise PosbiasError("name a model (--model) or a job (--job)")
    if query.job_id is not None:
        job = jobs.get(db, query.job_id)  # NotFoundError names the fix
        model, revision = job.model, job.revision
    else:
        assert query.model is not None
        model, revision = query.model, query.revision
    job_ids = store.matching_jobs(
        db,
        model=query.model,
        revision=query.revision,
        batch_size=query.batch_size,
        job_id=query.job_id,
        variant=query.variant,
    )
    if not job_ids:
        others = ""
        if query.variant is not None:
            found = store.variants_of(
                db, job_ids=store.matching_jobs(db, model=query.model, job_id=query.job_id)
            )
            others = f" (it has {', '.join(found)})" if found else ""
        raise NotFoundError(
            f"no results for {query.describe()}{others}: check `posbias status` and `posbias models`"
        )
    return model, revision, job_ids


def curves(
    db: Database,
    query: CurveQuery,
    *,
    by: CurveAxis = CurveAxis.position,
    bin_width: int = 256,
    resamples: int = analysis.BOOTSTRAP_RESAMPLES,
) -> list[Curve]:
    """One curve per variant and batch size with results that match `query`, variant by variant (the
    baseline first), each in batch-size order.

    By position: per-trial answers pooled over the matching jobs (each distinct trial once), analysed with
    every interval and summary of `analysis.build_curve`. By token distance: answers binned `bin_width`
    tokens wide, intervals clustered by trial (or sampled set). A job served by an endpoint whose tokenizer
    is unknown has no token distances; its curves carry a `note` saying so.
    """
    model, revision, job_ids = _resolve(db, query)
    note = _offsets_note(db, job_ids)
    variants = [query.variant] if query.variant else store.variants_of(db, job_ids=job_ids)
    found: list[Curve] = []
    for variant in variants:
        sizes = store.batch_sizes(db, job_ids=job_ids, variant=variant)
        sizes = [n for n in sizes if query.batch_size in (None, n)]
        if by is CurveAxis.token_distance:
            rows = store.token_distance_rows(
                db, job_ids=job_ids, batch_size=query.batch_size, variant=variant
            )
            clusters = store.clusters_of(db, job_ids=job_ids)
            for n in sizes:
                curve = analysis.distance_curve(
                    rows,
                    bin_width=bin_width,
                    clusters=clusters,
                    model=model,
                    revision=revision,
                    job_ids=job_ids,
                    batch_size=n,
                    resamples=resamples,
                )
                if curve.points:
                    found.append(curve.model_copy(update={"variant": variant}))
            continue
        for n in sizes:
            curve = analysis.build_curve(
                store.trial_data(db, job_ids=job_ids, batch_size=n, variant=variant),
                model=model,
                revision=revision,
                resamples=resamples,
            )
            found.append(curve.model_copy(update={"variant": variant}))
    if note is None:
        return found
    if by is CurveAxis.token_distance and not found:
        raise NotFoundError(f"no token distances for {query.describe()}: {note}")
    return [c.model_copy(update={"note": note}) for c in found]


def _offsets_note(db: Database, job_ids: list[int]) -> str | None:
    """Says which jobs ran on an endpoint whose tokenizer is unknown (their token distances are null)."""
    unknown = [
        job_id
        for job_id, endpoint in jobs.endpoints(db, job_ids).items()
        if endpoint.mode.token_offsets is TokenSource.none
    ]
    if not unknown:
        return None
    which = ", ".join(map(str, unknown))
    return (
        f"token offsets are unknown for job {which} (its endpoint has no /tokenize and the job named no "
        "tokenizer): token distances are null there"
    )


def batch_sizes(db: Database, query: CurveQuery) -> list[int]:
    """The batch sizes with results that match `query` (of its variant, or any)."""
    _, _, job_ids = _resolve(db, query)
    return store.batch_sizes(db, job_ids=job_ids, variant=query.variant)


def compare(db: Database, a: CurveQuery, b: CurveQuery, *, batch_size: int) -> Comparison:
    """B minus A, position by position, at one batch size: paired over matched trials (two variants of one
    job match on every trial). A side that names no variant is its jobs' only one there."""
    _, _, jobs_a = _resolve(db, a.model_copy(update={"batch_size": batch_size}))
    _, _, jobs_b = _resolve(db, b.model_copy(update={"batch_size": batch_size}))
    variant_a = variant_of(db, a, job_ids=jobs_a, batch_size=batch_size)
    variant_b = variant_of(db, b, job_ids=jobs_b, batch_size=batch_size)
    return comparison.compare(
        store.trial_data(db, job_ids=jobs_a, batch_size=batch_size, variant=variant_a),
        store.trial_data(db, job_ids=jobs_b, batch_size=batch_size, variant=variant_b),
        labels=(label(a, variant=variant_a), label(b, variant=variant_b)),
    )


def variant_of(db: Database, query: CurveQuery, *, job_ids: list[int], batch_size: int | None) -> str:
    """The variant `query` names, or its jobs' only one. `ConflictError` naming the choices when they have
    several."""
    if query.variant is not None:
        return query.variant
    found = store.variants_of(db, job_ids=job_ids, batch_size=batch_size)
    if len(found) != 1:
        example = f"{query.job_id}:{found[0]}" if query.job_id is not None else f"--variant {found[0]}"
        raise ConflictError(f"{query.describe()} has variants {', '.join(found)}: name one, e.g. {example}")
    return found[0]


def label(query: CurveQuery, *, variant: str | None = None) -> str:
    """How a comparison names one side: `job 3`, `job 3:global-only`, `model@revision`."""
    if query.job_id is not None:
        base = f"job {query.job_id}"
    else:
        base = f"{query.model}@{query.revision}" if query.revision else str(query.model)
    return f"{base}:{variant}" if variant is not None and (variant != "baseline" or query.variant) else base
