"""Curves as users ask for them: read counts from the store, analyse them with `service/analysis.py`."""

from __future__ import annotations

from posbias.schemas import (
    Comparison,
    Curve,
    CurveAxis,
    CurveQuery,
    NotFoundError,
    PosbiasError,
    TokenSource,
)
from posbias.service import analysis, jobs, store
from posbias.service.database import Database


def curves(
    db: Database,
    query: CurveQuery,
    *,
    by: CurveAxis = CurveAxis.position,
    bin_width: int = 256,
    resamples: int = analysis.BOOTSTRAP_RESAMPLES,
) -> list[Curve]:
    """One curve per batch size with results that match `query`, in batch-size order.

    By position, points come from the stored aggregates and the first/last ratio and slope from a cluster
    bootstrap over the per-trial results. By token distance, results are binned `bin_width` tokens wide.
    """
    if query.model is None and query.job_id is None:
        raise PosbiasError("name a model (--model) or a job (--job)")
    if query.job_id is not None:
        job = jobs.get(db, query.job_id)  # NotFoundError names the fix
        model, revision = job.model, job.revision
    else:
        assert query.model is not None
        model, revision = query.model, query.revision
    job_ids = store.matching_jobs(
        db, model=query.model, revision=query.revision, batch_size=query.batch_size, job_id=query.job_id
    )
    if not job_ids:
        raise NotFoundError(f"no results for {query.describe()}: check `posbias status` and `posbias models`")
    note = _offsets_note(db, job_ids)
    if by is CurveAxis.token_distance:
        rows = store.token_distance_rows(db, job_ids=job_ids, batch_size=query.batch_size)
        points = analysis.token_distance_points(rows, bin_width=bin_width)
        sizes = sorted({p.batch_size for p in points})
        if not sizes and note is not None:
            raise NotFoundError(f"no token distances for {query.describe()}: {note}")
        return [
            Curve(
                model=model,
                revision=revision,
                job_ids=tuple(job_ids),
                batch_size=n,
                by=CurveAxis.token_distance.value,
                points=tuple(p for p in points if p.batch_size == n),
                note=note,
            )
            for n in sizes
        ]
    counts = store.curve_counts(
        db, model=query.model, revision=query.revision, batch_size=query.batch_size, job_id=query.job_id
    )
    sizes = sorted({c.batch_size for c in counts})
    built = [
        analysis.build_curve(
            counts,
            model=model,
            revision=revision,
            job_ids=job_ids,
            batch_size=n,
            matrix=store.trial_matrix(db, job_ids=job_ids, batch_size=n) if n > 1 else None,
            resamples=resamples,
        )
        for n in sizes
    ]
    return built if note is None else [c.model_copy(update={"note": note}) for c in built]


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


def compare(db: Database, a: CurveQuery, b: CurveQuery, *, batch_size: int) -> Comparison:
    """B minus A, position by position, at one batch size."""
    curve_a = _one_curve(db, a, batch_size=batch_size)
    curve_b = _one_curve(db, b, batch_size=batch_size)
    return analysis.compare_curves(curve_a, curve_b, labels=(_label(a), _label(b)))


def _one_curve(db: Database, query: CurveQuery, *, batch_size: int) -> Curve:
    found = curves(
        db,
        CurveQuery(model=query.model, revision=query.revision, job_id=query.job_id, batch_size=batch_size),
    )
    return found[0]


def _label(query: CurveQuery) -> str:
    if query.job_id is not None:
        return f"job {query.job_id}"
    return f"{query.model}@{query.revision}" if query.revision else str(query.model)
