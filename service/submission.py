"""From a job spec to queued work: check the model and the data, plan the trials, enqueue them.

`posbias submit`, `posbias run` and the regression scheduler all submit through here.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from posbias.schemas import EngineName, JobSpec, Plan
from posbias.service import planner, queue
from posbias.service.database import Database
from posbias.service.datasets import QuestionPool, check_pool, load_questions
from posbias.service.settings import Settings
from posbias.workers.engine import Tokenizer
from posbias.workers.models import check_model_source


@dataclass(frozen=True)
class Prepared:
    """A checked spec with its questions and plan."""

    spec: JobSpec
    pool: QuestionPool
    plan: Plan


@dataclass(frozen=True)
class BatchSizeEstimate:
    """What one batch size of a job will send to the model."""

    batch_size: int
    trials: int
    shards: int
    mean_prompt_tokens: float
    max_prompt_tokens: int


@dataclass(frozen=True)
class DryRun:
    """What a job would do, without enqueueing it."""

    spec_hash: str
    model_key: str
    questions_in_pool: int
    source: str
    tokenizer: str
    """`model` when prompts were counted with the model's own tokenizer, else how tokens were estimated."""
    batch_sizes: tuple[BatchSizeEstimate, ...]

    @property
    def total_prompt_tokens(self) -> int:
        """Prompt tokens over the whole job (estimate)."""
        return round(sum(b.mean_prompt_tokens * b.trials for b in self.batch_sizes))


def prepare(spec: JobSpec, *, settings: Settings) -> Prepared:
    """Check the model source and the dataset, then plan. Raises `PosbiasError` naming the fix."""
    if spec.engine.name is EngineName.vllm:
        check_model_source(spec.model)
    pool = load_questions(spec.dataset, mmlu_dir=settings.mmlu_dir)
    check_pool(spec, pool=pool)
    return Prepared(spec=spec, pool=pool, plan=planner.plan(spec, pool=pool))


def submit(db: Database, prepared: Prepared, *, idempotency_key: str | None = None) -> queue.Submitted:
    """Enqueue a prepared job (job, shards, trials and questions in one transaction)."""
    return queue.submit(db, prepared.spec, prepared.plan, idempotency_key=idempotency_key)


def dry_run(prepared: Prepared, *, settings: Settings, sample: int = 20) -> DryRun:
    """Trials, shards and prompt tokens per batch size. Tokens are counted with the model's tokenizer
    when it is on this machine (a few trials per batch size, rendered exactly), else estimated."""
    from posbias.workers.prompts import render

    spec, plan = prepared.spec, prepared.plan
    tokenizer, how = _local_tokenizer(spec, settings=settings)
    shards_per_size = Counter(plan.trials[s.trial_indices[0]].batch_size for s in plan.shards)
    estimates = []
    for n in spec.batch_sizes:
        trials = [t for t in plan.trials if t.batch_size == n]
        lengths = []
        for trial in trials[:sample]:
            rendered = render(
                trial,
                questions=plan.questions,
                template=spec.prompt,
                chat_template=spec.chat_template,
                tokenizer=tokenizer,
            )
            # Without the tokenizer, ~4 characters a token is the usual rule for English text.
            lengths.append(rendered.prompt_tokens or round(len(rendered.text) / 4))
        estimates.append(
            BatchSizeEstimate(
                batch_size=n,
                trials=len(trials),
                shards=shards_per_size[n],
                mean_prompt_tokens=statistics.fmean(lengths) if lengths else 0.0,
                max_prompt_tokens=max(lengths, default=0),
            )
        )
    return DryRun(
        spec_hash=spec.spec_hash(),
        model_key=spec.model_key(),
        questions_in_pool=len(prepared.pool),
        source=prepared.pool.source,
        tokenizer=how,
        batch_sizes=tuple(estimates),
    )


def _local_tokenizer(spec: JobSpec, *, settings: Settings) -> tuple[Tokenizer | None, str]:
    if spec.engine.name is EngineName.fake:
        from posbias.workers.testing import FakeTokenizer

        return FakeTokenizer(), "the fake engine's tokenizer"
    from posbias.workers.models import local_tokenizer

    tokenizer: Tokenizer | None = local_tokenizer(
        spec.model, tokenizer=spec.tokenizer, cache_dir=settings.cache_dir
    )
    if tokenizer is None:
        return None, "estimated at 4 characters a token (the model's tokenizer is not on this machine)"
    return tokenizer, "the model's tokenizer"
