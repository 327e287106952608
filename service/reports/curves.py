"""Curves as users ask for them: the store-facing layer, which reads a model's or a job's answers from the
store and hands them to the pure analysis (`service/stats/position_curve.py` computes one curve,
`service/stats/comparison.py` compares two, `service/stats/explain.py` says what moves them).

A job's variants are never pooled: each variant is a curve of its own, and two variants of one job answer
the same trials, so comparing them is paired."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from posbias.schemas import (
    BASELINE,
    Comparison,
    ConflictError,
    Curve,
    CurveAxis,
    CurveQuery,
    NotFoundError,
    OptionsView,
    PosbiasError,
    TokenSource,
)
from posbias.schemas.explanation import Explanation
from posbias.service.stats import (
    BOOTSTRAP_RESAMPLES,
    BREAK_RESAMPLES,
    DistanceColumns,
    TrialData,
    bootstrap,
    comparison,
    explain_curve,
    position_curve,
    queries,
)
from posbias.service.stats import options as option_views
from posbias.service.store import Database
from posbias.service.work import jobs


class StoreReads:
    """Where `curves`, `explain` and `compare` read answers and draw resamples: the store, each view on
    its own, and `bootstrap.single` (the default). A report's views share one read of each batch size and
    one set of draws between curves of as many clusters (`service/reports/report_views.py`)."""

    def trial_data(
        self, db: Database, *, job_ids: Collection[int], batch_size: int, variant: str, placement: bool = True
    ) -> TrialData:
        """`queries.trial_data`."""
        return queries.trial_data(
            db, job_ids=job_ids, batch_size=batch_size, variant=variant, placement=placement
        )

    def distances(
        self,
        db: Database,
        *,
        job_ids: list[int],
        batch_size: int | None,
        sizes: Sequence[int],
        variant: str,
        rope: bool,
    ) -> tuple[DistanceColumns, dict[int, int]]:
        """The answers of `variant` of `job_ids` by token (or RoPE) distance, at `batch_size` when given
        (`sizes`: the batch sizes their curves are drawn at), and each trial's cluster."""
        rows = queries.token_distance_rows(
            db, job_ids=job_ids, batch_size=batch_size, variant=variant, rope=rope
        )
        return rows, queries.clusters_of(db, job_ids=job_ids)

    def draws(self, data: TrialData, *, resamples: int, seed: int) -> bootstrap.Resampled:
        """`bootstrap.single`."""
        return bootstrap.single(data, resamples=resamples, seed=seed)


STORE = StoreReads()


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
    job_ids = queries.matching_jobs(
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
            found = queries.variants_of(
                db, job_ids=queries.matching_jobs(db, model=query.model, job_id=query.job_id)
            )
            others = f" (it has {', '.join(found)})" if found else ""
        fix = (
            queries.missing_results_fix(db, query.job_id)
            if query.job_id is not None
            else "check `posbias status` and `posbias models`"
        )
        raise NotFoundError(f"no results for {query.describe()}{others}: {fix}")
    return model, revision, job_ids


def curves(
    db: Database,
    query: CurveQuery,
    *,
    by: CurveAxis = CurveAxis.position,
    bin_width: int = 256,
    resamples: int = BOOTSTRAP_RESAMPLES,
    reads: StoreReads = STORE,
) -> list[Curve]:
    """One curve per variant and batch size with results that match `query`, variant by variant (the
    baseline first), each in batch-size order (and, by position or answer slot, one per filler length of a
    filler sweep: the rows of its length x position grid).

    By position (or answer slot): per-trial answers pooled over the matching jobs (each distinct trial
    once), analysed with every interval and summary of `position_curve.build_curve`. By token distance:
    answers binned `bin_width` tokens wide, intervals clustered by trial (or sampled set). By filler length:
    every position pooled per length. A job served by an endpoint whose tokenizer is unknown has no token
    distances; its curves carry a `note` saying so. `reads`: where answers are read (see `StoreReads`).
    """
    model, revision, job_ids = _resolve(db, query)
    note = _offsets_note(db, job_ids)
    variants = [query.variant] if query.variant else queries.variants_of(db, job_ids=job_ids)
    found: list[Curve] = []
    for variant in variants:
        sizes = queries.batch_sizes(db, job_ids=job_ids, variant=variant)
        sizes = [n for n in sizes if query.batch_size in (None, n)]
        where = (model, revision, job_ids, variant, sizes)
        built = (
            _distance_curves(db, query, *where, bin_width=bin_width, resamples=resamples, by=by, reads=reads)
            if by in (CurveAxis.token_distance, CurveAxis.rope_distance)
            else _position_curves(db, *where, by=by, resamples=resamples, reads=reads)
        )
        found += [curve.model_copy(update={"variant": variant}) for curve in built]
    if note is None:
        return found
    if by in (CurveAxis.token_distance, CurveAxis.rope_distance) and not found:
        raise NotFoundError(f"no token distances for {query.describe()}: {note}")
    return [c.model_copy(update={"note": "; ".join(n for n in (note, c.note) if n)}) for c in found]


def _distance_curves(
    db: Database,
    query: CurveQuery,
    model: str,
    revision: str | None,
    job_ids: list[int],
    variant: str,
    sizes: list[int],
    *,
    bin_width: int,
    resamples: int,
    by: CurveAxis = CurveAxis.token_distance,
    reads: StoreReads = STORE,
) -> list[Curve]:
    rope = by is CurveAxis.rope_distance
    rows, clusters = reads.distances(
        db, job_ids=job_ids, batch_size=query.batch_size, sizes=sizes, variant=variant, rope=rope
    )
    found = [
        position_curve.distance_curve(
            rows,
            bin_width=bin_width,
            clusters=clusters,
            model=model,
            revision=revision,
            job_ids=job_ids,
            batch_size=n,
            resamples=resamples,
            by=by.value,
            draws=reads.draws,
        )
        for n in sizes
    ]
    return [c for c in found if c.points]


def _position_curves(
    db: Database,
    model: str,
    revision: str | None,
    job_ids: list[int],
    variant: str,
    sizes: list[int],
    *,
    by: CurveAxis,
    resamples: int,
    reads: StoreReads = STORE,
) -> list[Curve]:
    found = []
    for n in sizes:
        placement = by is CurveAxis.answer_slot  # slots and distances only for the slot axis
        data = reads.trial_data(db, job_ids=job_ids, batch_size=n, variant=variant, placement=placement)
        if by is CurveAxis.filler_length:
            found.append(
                position_curve.filler_curve(data, model=model, revision=revision, resamples=resamples)
            )
            continue
        levels = data.filler_levels()
        for level in levels:
            part = data.subset(data.filler == level) if data.filler is not None and len(levels) > 1 else data
            found.append(
                position_curve.build_curve(
                    position_curve.slot_view(part) if by is CurveAxis.answer_slot else part,
                    model=model,
                    revision=revision,
                    resamples=resamples,
                    by=by.value,
                    filler_tokens=level if data.filler is not None else None,
                    draws=reads.draws,
                )
            )
    return found


def explain(
    db: Database,
    job_ids: Sequence[int],
    *,
    batch_size: int | None = None,
    variant: str = BASELINE,
    resamples: int = BREAK_RESAMPLES,
    reads: StoreReads = STORE,
) -> list[Explanation]:
    """What moves the curve of `variant` of `job_ids` (one model's jobs, pooled, each distinct trial once),
    per batch size: position, answer slot and token distance fitted together, and a step at the sliding
    window the variant's model was built with, when it has one (`service/stats/explain.py`). `NotFoundError`
    naming the fix when there is nothing to explain; `PosbiasError` when the jobs are of different models."""
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
    found = [n for n in queries.batch_sizes(db, job_ids=ids, variant=variant) if batch_size in (None, n)]
    if not found:
        asked = f" at batch size {batch_size}" if batch_size is not None else ""
        of = f" for variant {variant}" if variant != BASELINE else ""
        fixes = "; ".join(dict.fromkeys(queries.missing_results_fix(db, r.id) for r in records))
        raise NotFoundError(f"job {', '.join(map(str, ids))} has no results{of}{asked}: {fixes}")
    # One question per prompt: position, answer slot and token distance never vary, so there is nothing
    # to fit (its accuracy is the curve's single point, `posbias curve`).
    sizes = [n for n in found if n > 1]
    single = (
        "batch size 1 has no position to explain: each prompt holds one question, so position, answer slot "
        "and token distance never vary (its accuracy is `posbias curve --batch-size 1`)"
    )
    if not sizes:
        others = "" if batch_size is not None else "; submit batch sizes of 2 or more to explain position"
        raise PosbiasError(f"{single}{others}")
    info = queries.job_model(db, ids[0], variant=variant)
    design = "; ".join(dict.fromkeys(r.spec.describe_design() for r in records))
    fits = [
        explain_curve(
            reads.trial_data(db, job_ids=ids, batch_size=n, variant=variant),
            model=model,
            revision=revision,
            info=info,
            design=design,
            resamples=resamples,
        )
        for n in sizes
    ]
    if len(sizes) < len(found):
        fits[0] = fits[0].model_copy(update={"left_out": f"{single}: left out, the other batch sizes fitted"})
    return fits


def options(
    db: Database, job_ids: Sequence[int], *, batch_size: int | None = None, variant: str = BASELINE
) -> list[OptionsView]:
    """Options by position of `variant` of `job_ids` (one model's jobs), per batch size: shares of each
    predicted and gold option, entropy, confidence and accuracy with the option prior removed
    (`service/stats/options.py`). `NotFoundError` naming the fix when there is nothing to read."""
    if not job_ids:
        raise PosbiasError("name a job, e.g. `posbias explain 3`")
    records = [jobs.get(db, job_id) for job_id in job_ids]  # NotFoundError names the fix
    models = {(r.model, r.revision) for r in records}
    if len(models) > 1:
        raise PosbiasError(
            f"jobs {', '.join(map(str, job_ids))} are of different models: one model at a time"
        )
    model, _ = models.pop()
    return option_views.by_position(
        db, sorted(set(job_ids)), model=model, batch_size=batch_size, variant=variant
    )


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
    return queries.batch_sizes(db, job_ids=job_ids, variant=query.variant)


def compare(
    db: Database, a: CurveQuery, b: CurveQuery, *, batch_size: int, reads: StoreReads = STORE
) -> Comparison:
    """B minus A, position by position, at one batch size: paired over matched trials (two variants of one
    job match on every trial). A side that names no variant is its jobs' only one there."""
    _, _, jobs_a = _resolve(db, a.model_copy(update={"batch_size": batch_size}))
    _, _, jobs_b = _resolve(db, b.model_copy(update={"batch_size": batch_size}))
    variant_a = variant_of(db, a, job_ids=jobs_a, batch_size=batch_size)
    variant_b = variant_of(db, b, job_ids=jobs_b, batch_size=batch_size)
    return comparison.compare(
        reads.trial_data(db, job_ids=jobs_a, batch_size=batch_size, variant=variant_a, placement=False),
        reads.trial_data(db, job_ids=jobs_b, batch_size=batch_size, variant=variant_b, placement=False),
        labels=(label(a, variant=variant_a), label(b, variant=variant_b)),
    )


def variant_of(db: Database, query: CurveQuery, *, job_ids: list[int], batch_size: int | None) -> str:
    """The variant `query` names, or its jobs' only one. `ConflictError` naming the choices when they have
    several."""
    if query.variant is not None:
        return query.variant
    found = queries.variants_of(db, job_ids=job_ids, batch_size=batch_size)
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
