"""Curves as users ask for them: read a model's or a job's answers from the store and analyse them
(`service/analysis.py` for one curve, `service/comparison.py` for two, `service/attribution.py` for what
moves them)."""

from __future__ import annotations

from collections.abc import Sequence

from posbias.schemas import Comparison, Curve, CurveAxis, CurveQuery, NotFoundError, PosbiasError
from posbias.schemas.explanation import Explanation
from posbias.service import analysis, attribution, comparison, jobs, store
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
    """One curve per batch size with results that match `query`, in batch-size order (and, by position or
    answer slot, one per filler length of a filler sweep: the rows of its length x position grid).

    By position (or answer slot): per-trial answers pooled over the matching jobs (each distinct trial
    once), analysed with every interval and summary of `analysis.build_curve`. By token distance: answers
    binned `bin_width` tokens wide, intervals clustered by trial (or sampled set). By filler length: every
    position pooled per length.
    """
    model, revision, job_ids = _resolve(db, query)
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
        return [c for c in found if c.points]
    found = []
    for n in sizes:
        data = store.trial_data(db, job_ids=job_ids, batch_size=n)
        if by is CurveAxis.filler_length:
            found.append(analysis.filler_curve(data, model=model, revision=revision, resamples=resamples))
            continue
        levels = data.filler_levels()
        for level in levels:
            part = data.subset(data.filler == level) if data.filler is not None and len(levels) > 1 else data
            found.append(
                analysis.build_curve(
                    analysis.slot_view(part) if by is CurveAxis.answer_slot else part,
                    model=model,
                    revision=revision,
                    resamples=resamples,
                    by=by.value,
                    filler_tokens=level if data.filler is not None else None,
                )
            )
    return found


def explain(
    db: Database,
    job_ids: Sequence[int],
    *,
    batch_size: int | None = None,
    resamples: int = attribution.BREAK_RESAMPLES,
) -> list[Explanation]:
    """What moves the curve of `job_ids` (one model's jobs, pooled, each distinct trial once), per batch
    size: position, answer slot and token distance fitted together, and a step at the model's sliding
    window when it has one (`service/attribution.py`). `NotFoundError` naming the fix when there is nothing
    to explain; `PosbiasError` when the jobs are of different models."""
    if not job_ids:
        raise PosbiasError("name a job to explain, e.g. `posbias explain 3`")
    records = [jobs.get(db, job_id) for job_id in job_ids]  # NotFoundError names the fix
    models = {(r.model, r.revision) for r in records}
    if len(models) > 1:
        raise PosbiasError(
            f"jobs {', '.join(map(str, job_ids))} are of different models: explain one model's jobs at a time"
        )
    model, revision = models.pop()
    ids = sorted(set(job_ids))
    sizes = [n for n in store.batch_sizes(db, job_ids=ids) if batch_size in (None, n)]
    if not sizes:
        asked = f" at batch size {batch_size}" if batch_size is not None else ""
        raise NotFoundError(
            f"job {', '.join(map(str, ids))} has no results{asked} yet: run it with "
            "`posbias worker --until-empty`"
        )
    info = store.job_model(db, ids[0])
    design = "; ".join(dict.fromkeys(r.spec.describe_design() for r in records))
    return [
        attribution.explain(
            store.trial_data(db, job_ids=ids, batch_size=n),
            model=model,
            revision=revision,
            info=info,
            design=design,
            resamples=resamples,
        )
        for n in sizes
    ]


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
