"""Building the self-contained `ShardSpec` a worker runs: from a plan at submit time, or from the store when
a shard is leased."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

from sqlalchemy import select

from posbias.schemas import BASELINE, EndpointReport, JobSpec, Question, ShardSpec, Trial
from posbias.service.store import IN_CHUNK, Database, tables
from posbias.service.work import answer_sheets, costs
from posbias.service.work.stored_spec import load_spec


def shard_spec(
    spec: JobSpec,
    *,
    job_id: int,
    shard_id: int,
    trials: Sequence[Trial],
    questions: Mapping[str, Question],
    endpoint: EndpointReport | None = None,
    variant: str = BASELINE,
) -> ShardSpec:
    """The self-contained unit of work for `trials`: the job's model, engine and prompt settings under
    `variant`, plus every question the trials use (and no other); for a served job with a cost guard, the
    shard's share of it (from the job's `endpoint` report)."""
    run = spec.variant(variant)
    used: dict[str, Question] = {}
    for trial in trials:
        for qid in trial.question_ids:
            if qid not in questions:
                raise ValueError(f"trial {trial.index} uses question {qid}, which is not in `questions`")
            used[qid] = questions[qid]
    return ShardSpec(
        job_id=job_id,
        shard_id=shard_id,
        model=spec.model,
        revision=spec.revision,
        tokenizer=spec.tokenizer,
        model_key=spec.model_key(run),
        engine=spec.engine,
        variant=run,
        fake=spec.fake_for(run),
        answer_mode=spec.answer_mode,
        prompt=spec.prompt,
        chat_template=spec.chat_template,
        sampling=spec.sampling,
        seed=spec.seed,
        filler=spec.filler,
        trials=tuple(trials),
        questions=dict(sorted(used.items())),
        token_budget=costs.shard_budget(spec, endpoint, trials=trials, questions=used),
    )


# Questions already read, per open store. A question row is written once under an id derived from its
# content and never changes, so a dispatcher that leases shard after shard of a job (whose trials reuse the
# same questions) reads each one once; reading them was most of a lease (benchmarks/dispatch.py).
_QUESTIONS: weakref.WeakKeyDictionary[Database, dict[str, Question]] = weakref.WeakKeyDictionary()
QUESTION_CACHE_SIZE = 200_000
"""Questions kept per store (MMLU has 14,042); the cache starts afresh beyond this."""


def _question_cache(db: Database) -> dict[str, Question]:
    cache = _QUESTIONS.setdefault(db, {})
    if len(cache) > QUESTION_CACHE_SIZE:
        cache.clear()
    return cache


def from_store(db: Database, shard_ids: Sequence[int]) -> dict[int, ShardSpec]:
    """The specs of stored shards, by id: their job's settings, trials and questions.

    Read after the lease commits (on SQLite, outside the write lock): a shard's trials and questions never
    change once submitted.
    """
    # Rows are read as plain tuples and turned into records with `model_construct`: they were validated when
    # the job was submitted and never change, and ORM objects plus a second validation of every trial and
    # question cost several times the queries (benchmarks/dispatch.py).
    if not shard_ids:
        return {}
    trial = tables.Trial.__table__.c
    question = tables.Question.__table__.c
    shard = tables.Shard
    job = tables.Job
    with db.read() as session:
        rows = session.execute(select(shard.id, shard.job_id, shard.variant).where(shard.id.in_(shard_ids)))
        job_of: dict[int, int] = {}
        variant_of: dict[int, str] = {}
        for shard_id, job_id, variant in rows:
            job_of[shard_id], variant_of[shard_id] = job_id, variant
        specs: dict[int, JobSpec] = {}
        endpoints: dict[int, EndpointReport] = {}
        for job_id, spec, endpoint in session.execute(
            select(job.id, job.spec, job.endpoint).where(job.id.in_(sorted(set(job_of.values()))))
        ):
            specs[job_id] = load_spec(spec)
            if endpoint is not None:
                endpoints[job_id] = EndpointReport.model_validate(endpoint)
        trials: dict[int, list[Trial]] = {shard_id: [] for shard_id in shard_ids}
        for row in session.execute(
            select(
                trial.shard_id,
                trial.index,
                trial.batch_size,
                trial.iteration,
                trial.question_ids,
                trial.choice_orders,
                trial.rotation,
                trial.variant,
                trial.answer_order,
                trial.probe_position,
                trial.filler_tokens,
            )
            .where(trial.shard_id.in_(shard_ids))
            .order_by(trial.shard_id, trial.index)
        ):
            trials[row.shard_id].append(
                Trial.model_construct(
                    index=row[1],  # `row.index` is the tuple's own method
                    batch_size=row.batch_size,
                    iteration=row.iteration,
                    question_ids=tuple(row.question_ids),
                    choice_orders=None
                    if row.choice_orders is None
                    else tuple(tuple(order) for order in row.choice_orders),
                    rotation=row.rotation,
                    answer_order=None if row.answer_order is None else tuple(row.answer_order),
                    probe=row.probe_position,
                    filler_tokens=row.filler_tokens,
                    variant=row.variant,
                )
            )
        questions = _question_cache(db)
        wanted = sorted(
            {
                qid
                for shard_trials in trials.values()
                for t in shard_trials
                for qid in t.question_ids
                if qid not in questions
            }
        )
        for start in range(0, len(wanted), IN_CHUNK):
            for qid, subject, text, choices, answer in session.execute(
                select(
                    question.id, question.subject, question.question, question.choices, question.answer
                ).where(question.id.in_(wanted[start : start + IN_CHUNK]))
            ):
                questions[qid] = Question.model_construct(
                    id=qid, subject=subject, question=text, choices=tuple(choices), answer=answer
                )
    built = {
        shard_id: shard_spec(
            specs[job_of[shard_id]],
            job_id=job_of[shard_id],
            shard_id=shard_id,
            trials=trials[shard_id],
            questions=questions,
            endpoint=endpoints.get(job_of[shard_id]),
            variant=variant_of[shard_id],
        )
        for shard_id in shard_ids
    }
    return answer_sheets.attach(db, built)
