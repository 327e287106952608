"""From a job spec to work ready to enqueue: check the model and the data, plan the trials; or say what a job
would do (`--dry-run`) without enqueueing it.

`posbias submit`, `posbias run` and the regression scheduler all prepare through here, then enqueue with
`service.jobs.submit`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from posbias.schemas import BatchSizeEstimate, DryRun, EngineName, JobSpec, Plan, QuestionPool, one_line
from posbias.service import context, planner
from posbias.service.datasets import check_pool, load_questions
from posbias.service.settings import Settings
from posbias.workers.engine import Tokenizer
from posbias.workers.models import check_model_source, context_limit

_UNBOUNDED = 10**8
"""Tokenizers without a stated limit report a huge `model_max_length` (transformers uses 1e30)."""


@dataclass(frozen=True)
class Prepared:
    """A checked spec with its questions and plan, and the context its engine needs."""

    spec: JobSpec
    """As it will be stored: for vLLM, `engine.max_model_len` chosen from the plan unless the user set it."""
    pool: QuestionPool
    plan: Plan
    context: context.Context | None = None
    """The context length and why (vLLM jobs only)."""
    tokenizer: Tokenizer | None = None
    tokenizer_source: str = ""


def prepare(spec: JobSpec, *, settings: Settings) -> Prepared:
    """Check the model source and the dataset, set up the variants from the model's config, plan, and (for
    vLLM) choose the engine's context length from the plan and check it against the model's own. Raises
    `PosbiasError` naming the fix (for a variant the model does not support: what it supports)."""
    if spec.engine.name is EngineName.vllm:
        check_model_source(spec.model)
        spec = with_variants(spec, settings=settings)
    pool = load_questions(spec.dataset, mmlu_dir=settings.mmlu_dir)
    check_pool(spec, pool=pool)
    plan = planner.plan(spec, pool=pool)
    tokenizer, how = _local_tokenizer(spec, settings=settings)
    if spec.engine.name is not EngineName.vllm:
        return Prepared(spec=spec, pool=pool, plan=plan, tokenizer=tokenizer, tokenizer_source=how)
    limits = [context_limit(spec.model, revision=spec.revision, cache_dir=settings.cache_dir)]
    stated = getattr(getattr(tokenizer, "hf", None), "model_max_length", None)
    if isinstance(stated, int) and 0 < stated < _UNBOUNDED:
        limits.append(stated)  # vLLM takes the tokenizer's limit too, when it is smaller
    limit = min((value for value in limits if value is not None), default=None)
    budgets = [value for value in (limit, spec.engine.max_model_len) if value is not None]
    # Every variant has the same prompts: the first variant's are all there is to measure.
    first = [trial for trial in plan.trials if trial.variant == spec.runs[0].name]
    one = plan.model_copy(update={"trials": tuple(first)})
    longest = context.longest_prompt(spec, one, tokenizer=tokenizer, budget=min(budgets, default=None))
    chosen = context.context_for(spec, longest=longest, model_limit=limit)
    if chosen.max_model_len != spec.engine.max_model_len:
        engine = spec.engine.model_copy(update={"max_model_len": chosen.max_model_len})
        spec = spec.model_copy(update={"engine": engine})
    return Prepared(
        spec=spec, pool=pool, plan=plan, context=chosen, tokenizer=tokenizer, tokenizer_source=how
    )


def with_variants(spec: JobSpec, *, settings: Settings) -> JobSpec:
    """`spec` with each variant's `hf_overrides` and expected layers filled in from the model's config (read
    here: a folder, a GGUF file, or a hub model's config, downloaded when not cached). A spec with no
    variant and no `engine.hf_overrides` needs no config and is returned as it is."""
    if not spec.engine.hf_overrides and all(v.is_baseline for v in spec.runs):
        return spec
    from posbias.workers import variants

    config = variants.read_config(spec.model, revision=spec.revision, cache_dir=settings.cache_dir)
    resolved = variants.resolve(spec.runs, config, job_overrides=spec.engine.hf_overrides)
    return spec.model_copy(update={"variants": resolved})


def dry_run(prepared: Prepared, *, settings: Settings, sample: int = 20) -> DryRun:
    """Trials, shards and prompt tokens per batch size. Tokens are counted with the model's tokenizer
    when it is on this machine (a few trials per batch size, rendered exactly), else estimated."""
    from posbias.workers.prompts import render

    spec, plan = prepared.spec, prepared.plan
    tokenizer, how = prepared.tokenizer, prepared.tokenizer_source
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
        spec=spec,
        spec_hash=spec.spec_hash(),
        model_key=spec.model_key(),
        questions_in_pool=len(prepared.pool),
        source=prepared.pool.source,
        tokenizer=how,
        batch_sizes=tuple(estimates),
        max_model_len=spec.engine.max_model_len if spec.engine.name is EngineName.vllm else None,
        model_context=prepared.context.model_limit if prepared.context else None,
    )


def _local_tokenizer(spec: JobSpec, *, settings: Settings) -> tuple[Tokenizer | None, str]:
    if spec.engine.name is EngineName.fake:
        from posbias.workers.testing import FakeTokenizer

        return FakeTokenizer(), "the fake engine's tokenizer"
    from posbias.workers.models import local_tokenizer

    try:
        tokenizer: Tokenizer | None = local_tokenizer(
            spec.model, tokenizer=spec.tokenizer, cache_dir=settings.cache_dir
        )
    except Exception as exc:  # a model folder whose tokenizer transformers cannot read; its load will say so
        why = f"the model's tokenizer cannot be read here: {one_line(exc, typed=True)}"
        return None, f"estimated at 4 characters a token ({why})"
    if tokenizer is None:
        return None, "estimated at 4 characters a token (the model's tokenizer is not on this machine)"
    return tokenizer, "the model's tokenizer"
