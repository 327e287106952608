"""Curves as users ask for them: read a model's or a job's answers from the store and analyse them
(`service/analysis.py` for one curve, `service/comparison.py` for two)."""

from __future__ import annotations

from posbias.schemas import Comparison, Curve, CurveAxis, CurveQuery, NotFoundError, PosbiasError, TokenSource
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
        db, model=query.model, revision=query.revision, batch_size=query.batch_size, job_id=query.job_id
    )
    if not job_ids:
        raise NotFoundError(f"no results for {query.describe()}: check `posbias status` and `posbias models`")
    return model, revision, job_ids


def curves(
    db: Database,
    query: CurveQuery,
    *,
    by: CurveAxis = CurveAxis.position,
    bin_width: int = 256,
    resamples: int = analysis.BOOTSTRAP_RESAMPLES,
) -> list[Curve]:
    """One curve per batch size with results that match `query`, in batch-size order.

    By position: per-trial answers pooled over the matching jobs (each distinct trial once), analysed with
    every interval and summary of `analysis.build_curve`. By token distance: answers binned `bin_width`
    tokens wide, intervals clustered by trial (or sampled set). A job served by an endpoint whose tokenizer
    is unknown has no token distances; its curves carry a `note` saying so.
    """
    model, revision, job_ids = _resolve(db, query)
    note = _offsets_note(db, job_ids)
    sizes = [n for n in store.batch_sizes(db, job_ids=job_ids) if query.batch_size in (None, n)]
    if by is CurveAxis.token_distance:
        rows = store.token_distance_rows(db, job_ids=job_ids, batch_size=query.batch_size)
        clusters = store.clusters_of(db, job_ids=job_ids)
        found = [
            analysis.distance_curve(
                rows,
                bin_width=bin_width,
                clusters=clusters,
                model=model,
                revision=revision,
                job_ids=job_ids,
                batch_size=n,
                resamples=resamples,
            )
            for n in sizes
        ]
        found = [c for c in found if c.points]
        if not found and note is not None:
            raise NotFoundError(f"no token distances for {query.describe()}: {note}")
    else:
        found = [
            analysis.build_curve(
                store.trial_data(db, job_ids=job_ids, batch_size=n),
                model=model,
                revision=revision,
                resamples=resamples,
            )
            for n in sizes
        ]
    return found if note is None else [c.model_copy(update={"note": note}) for c in found]


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
    """B minus A, position by position, at one batch size: paired over matched trials."""
    _, _, jobs_a = _resolve(db, a.model_copy(update={"batch_size": batch_size}))
    _, _, jobs_b = _resolve(db, b.model_copy(update={"batch_size": batch_size}))
    return comparison.compare(
        store.trial_data(db, job_ids=jobs_a, batch_size=batch_size),
        store.trial_data(db, job_ids=jobs_b, batch_size=batch_size),
        labels=(_label(a), _label(b)),
    )


def _label(query: CurveQuery) -> str:
    if query.job_id is not None:
        return f"job {query.job_id}"
    return f"{query.model}@{query.revision}" if query.revision else str(query.model)
