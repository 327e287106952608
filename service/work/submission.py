"""From a job spec to work ready to enqueue: check the model and the data, plan the trials; or say what a job
would do (`--dry-run`) without enqueueing it.

`posbias submit`, `posbias run` and the regression scheduler all prepare through here, then enqueue with
`service.work.jobs.submit`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posbias.schemas import (
    AnswerMode,
    AnswerOrder,
    BatchSizeEstimate,
    Constraint,
    Design,
    DesignEstimate,
    DryRun,
    EndpointReport,
    EngineContext,
    JobSpec,
    Plan,
    PosbiasError,
    QuestionPool,
    Trial,
    one_line,
)
from posbias.service.settings import Settings
from posbias.service.work import context, costs, planner
from posbias.service.work.datasets import check_pool, load_questions
from posbias.service.work.model_names import check_model_name
from posbias.workers.engine import Tokenizer
from posbias.workers.engines import declared
from posbias.workers.filler import read_source as filler_source
from posbias.workers.models import model_context_limit

if TYPE_CHECKING:
    from posbias.workers.prompt_tokens import PromptCounter

_UNBOUNDED = 10**8
"""Tokenizers without a stated limit report a huge `model_max_length` (transformers uses 1e30)."""

SAMPLE_TRIALS = 20
"""Trials per batch size whose prompts are counted with the tokenizer (dry run, served jobs' token bound)."""


@dataclass(frozen=True)
class Prepared:
    """A checked spec with its questions and plan; for vLLM, the context its engine needs; for a served model,
    what its endpoint can do."""

    spec: JobSpec
    """As it will be stored: for vLLM, `engine.max_model_len` chosen from the plan unless the user set it."""
    pool: QuestionPool
    plan: Plan
    context: context.Context | None = None
    """The context length and why (vLLM jobs only)."""
    tokenizer: Tokenizer | None = None
    tokenizer_source: str = ""
    endpoint: EndpointReport | None = None
    """engine openai: the probe, the mode the job will use, its token bound."""
    prompt_tokens: dict[int, list[int]] | None = None
    """engine openai: sampled prompt lengths by batch size (for the dry run)."""
    counted_with: str | None = None
    """engine openai: how those were counted."""

    @property
    def engine_context(self) -> EngineContext | None:
        """The context the engine starts with and its source, as stored with the job (vLLM jobs only)."""
        return self.context.record() if self.context is not None else None


def prepare(
    spec: JobSpec,
    *,
    settings: Settings,
    check_cost: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    pools: dict[str, QuestionPool] | None = None,
    on_measure: Callable[[int, int], None] | None = None,
) -> Prepared:
    """Check the size of the job, the model source and the dataset, read a filler file into the spec, then
    plan (`on_progress(trials planned, total)` is called as a large plan is built). For vLLM, choose the
    engine's context length from the plan and check it against the model's own; for a served model, probe
    its endpoint and refuse what it cannot do, and (`check_cost`) a job over its cost guard. Raises
    `PosbiasError` naming the fix. `on_measure(groups, total)` is called as a vLLM job's longest prompt
    is measured, one group per batch size and filler length.

    `pools` keeps the questions read, by dataset, for the caller's next calls: a tick prepares every new
    checkpoint of a schedule from one template, and reading MMLU is most of what a fake job's prepare costs
    (0.8 s of 0.85 s)."""
    check_size(spec, settings=settings)
    declaration = declared(spec.engine.name)
    if declaration.local_model:
        check_model_name(spec.model, revision=spec.revision)
        spec = with_variants(spec, settings=settings)
    spec = read_filler(spec)
    pool = _questions(spec, settings=settings, pools=pools)
    check_pool(spec, pool=pool)
    plan = planner.plan(spec, pool=pool, on_progress=on_progress)
    if declaration.served:
        return _prepare_served(spec, pool=pool, plan=plan, check_cost=check_cost)
    tokenizer, how = _local_tokenizer(spec, settings=settings)
    if not declaration.chooses_context:
        return Prepared(spec=spec, pool=pool, plan=plan, tokenizer=tokenizer, tokenizer_source=how)
    # A hub model's config alone is fetched when it is not here: the engine's context is never left to the
    # model's own (131,072 tokens for a 70B model a laptop submits, more than its KV cache holds).
    found = model_context_limit(spec.model, revision=spec.revision, cache_dir=settings.cache_dir)
    limits = [found.tokens if found is not None else None]
    where = "the model's config fetched from the hub" if found and found.fetched else "the model's config"
    stated = getattr(getattr(tokenizer, "hf", None), "model_max_length", None)
    if isinstance(stated, int) and 0 < stated < _UNBOUNDED:
        limits.append(stated)  # vLLM takes the tokenizer's limit too, when it is smaller
    limit = min((value for value in limits if value is not None), default=None)
    if limit is not None and limit != limits[0]:
        where = "the model's tokenizer"
    budgets = [value for value in (limit, spec.engine.max_model_len) if value is not None]
    # Every variant has the same prompts: the first variant's are all there is to measure.
    first = [trial for trial in plan.trials if trial.variant == spec.runs[0].name]
    one = plan.model_copy(update={"trials": tuple(first)})
    longest = context.longest_prompt(
        spec, one, tokenizer=tokenizer, budget=min(budgets, default=None), on_progress=on_measure
    )
    chosen = context.context_for(spec, longest=longest, model_limit=limit, limit_source=where)
    if chosen.max_model_len != spec.engine.max_model_len:
        engine = spec.engine.model_copy(update={"max_model_len": chosen.max_model_len})
        spec = spec.model_copy(update={"engine": engine})
    return Prepared(
        spec=spec, pool=pool, plan=plan, context=chosen, tokenizer=tokenizer, tokenizer_source=how
    )


def _questions(spec: JobSpec, *, settings: Settings, pools: dict[str, QuestionPool] | None) -> QuestionPool:
    if pools is None:
        return load_questions(spec.dataset, mmlu_dir=settings.mmlu_dir, datasets_dir=settings.datasets_dir)
    key = spec.dataset.model_dump_json()
    if key not in pools:
        pools[key] = load_questions(
            spec.dataset, mmlu_dir=settings.mmlu_dir, datasets_dir=settings.datasets_dir
        )
    return pools[key]


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


def check_size(spec: JobSpec, *, settings: Settings) -> None:
    """Raise `PosbiasError` when `spec` plans more trials than `settings.max_trials` allows (before any of
    them is built: a plan of 200 million trials would take minutes and gigabytes to refuse)."""
    total = spec.total_trials
    if total > settings.max_trials:
        per = ", ".join(f"{spec.trials_per_batch_size(n):,} at N={n}" for n in spec.batch_sizes[:6])
        more = ", ..." if len(spec.batch_sizes) > 6 else ""
        raise PosbiasError(
            f"the job plans {total:,} trials ({per}{more}), more than "
            f"the {settings.max_trials:,} POSBIAS_MAX_TRIALS allows: lower iterations or batch sizes, or "
            "raise POSBIAS_MAX_TRIALS"
        )


def _prepare_served(spec: JobSpec, *, pool: QuestionPool, plan: Plan, check_cost: bool) -> Prepared:
    endpoint, lengths, how = _probe_endpoint(spec, plan)
    reordered = spec.answer_order is not AnswerOrder.forward or spec.design is Design.probe
    schema = endpoint.mode.constraint is Constraint.json_schema
    if spec.answer_mode is AnswerMode.constrained and reordered and schema:
        raise PosbiasError(
            "this endpoint constrains answers with a JSON schema, which cannot hold the answer order "
            f"the {spec.describe_design()} asks for: use answer_mode free, or an endpoint that takes "
            "regular expressions (vllm serve)"
        )
    guard = spec.engine.max_job_tokens
    if check_cost and guard is not None and endpoint.token_bound > guard:
        raise PosbiasError(
            f"the job may spend up to about {endpoint.token_bound:,} tokens (prompts counted with {how}, "
            f"every output budget in full), over its cost guard engine.max_job_tokens={guard:,}: raise the "
            "guard, or run fewer iterations or batch sizes (--dry-run shows the bound)"
        )
    return Prepared(
        spec=spec, pool=pool, plan=plan, endpoint=endpoint, prompt_tokens=lengths, counted_with=how
    )


def _probe_endpoint(spec: JobSpec, plan: Plan) -> tuple[EndpointReport, dict[int, list[int]], str]:
    """Probe a served job's endpoint, choose how the job uses it, and count a sample of its prompts."""
    from posbias.workers.endpoint_probe import probe
    from posbias.workers.endpoint_session import api_key, open_session
    from posbias.workers.served_mode import choose_mode
    from posbias.workers.tokenizer import CHARS_PER_TOKEN, estimated_prompt_tokens, job_tokenizer

    options = spec.engine
    model = options.model or spec.model
    session = open_session(options, key=api_key(options.api_key_env))
    try:
        capabilities = probe(session, model=model)
        mode = choose_mode(
            capabilities,
            options=options,
            answer_mode=spec.answer_mode,
            chat_template=spec.chat_template,
            tokenizer=spec.tokenizer,
        )
        tokenizer = job_tokenizer(capabilities, session=session, model=model, tokenizer=spec.tokenizer)
        lengths = _prompt_lengths(spec, plan, tokenizer=tokenizer, estimate=estimated_prompt_tokens)
    finally:
        session.close()
    how = {
        "server": "the endpoint's tokenizer",
        "named": f"the tokenizer {spec.tokenizer}",
        "none": f"an estimate of {CHARS_PER_TOKEN} characters a token (the endpoint has no tokenizer)",
    }[mode.token_offsets.value]
    bounds = costs.token_bounds(spec, plan, prompt_tokens=lengths)
    report = EndpointReport(
        capabilities=capabilities,
        mode=mode,
        token_bound=sum(bounds.values()),
        token_bounds=bounds,
        share_basis=costs.share_basis(spec, plan),
    )
    return report, lengths, how


def _prompt_lengths(
    spec: JobSpec, plan: Plan, *, tokenizer: Tokenizer | None, estimate: Callable[[str], int]
) -> dict[int, list[int]]:
    """Prompt tokens of the first `SAMPLE_TRIALS` trials of each batch size, rendered exactly; `estimate`
    counts a prompt without a tokenizer."""
    from posbias.workers.prompts import render

    lengths: dict[int, list[int]] = {}
    for n in spec.batch_sizes:
        sample = [t for t in plan.trials if t.batch_size == n][:SAMPLE_TRIALS]
        lengths[n] = []
        for trial in sample:
            rendered = render(
                trial,
                questions=plan.questions,
                template=spec.prompt,
                chat_template=spec.chat_template,
                tokenizer=tokenizer,
                filler=spec.filler,
                seed=spec.seed,
            )
            lengths[n].append(rendered.prompt_tokens or estimate(rendered.text))
    return lengths


def read_filler(spec: JobSpec) -> JobSpec:
    """`spec` with its filler file's text in `filler.text` (stored with the job, so its prompts can be
    rendered anywhere, again). Raises `PosbiasError` naming the fix when the file cannot be used."""
    filler = spec.filler
    if filler is None or filler.builtin or filler.text is not None:
        return spec
    text = filler_source(filler.source)
    return spec.model_copy(update={"filler": filler.model_copy(update={"text": text})})


def dry_run(
    prepared: Prepared,
    *,
    settings: Settings,
    sample: int = SAMPLE_TRIALS,
    on_progress: Callable[[int, int], None] | None = None,
) -> DryRun:
    """Trials, shards and prompt tokens per batch size, and per batch size and filler length the token
    distances the design covers and how many reach past the model's sliding window. Tokens are counted with
    the model's tokenizer when it is on this machine, or the endpoint's (a few trials per batch size,
    rendered exactly), else estimated; a served job also shows its endpoint's capabilities and its token
    bound. `on_progress(prompts counted, prompts to count)` is called as the sample is counted (one prompt
    at least per filler length and batch size: 5,000 filler lengths are 5,000 prompts a batch size).

    With a tokenizer each prompt is counted from its pieces (`workers/prompt_tokens.py`): the same numbers
    as tokenizing it whole, at a fraction of the cost. Where the tokenizer does not state how far text
    shapes a token (a model's tokenizer), the last prompt counted of each batch size (its longest filler's)
    is also tokenized whole, and on any difference every prompt is; `DryRun.counting` says which was done."""
    return _dry_run(prepared, settings=settings, sample=sample, on_progress=on_progress, whole=False)


def _dry_run(
    prepared: Prepared,
    *,
    settings: Settings,
    sample: int,
    on_progress: Callable[[int, int], None] | None,
    whole: bool,
    counting: str | None = None,
) -> DryRun:
    """`dry_run`, its prompts tokenized `whole` (the reference its counts from pieces equal) or counted from
    their pieces; `counting` overrides what the result says of how."""
    from posbias.workers.prompt_tokens import PromptCounter, PromptTokens
    from posbias.workers.prompts import render, sheet_answer_tokens

    spec, plan = prepared.spec, prepared.plan
    tokenizer, how = prepared.tokenizer, prepared.tokenizer_source
    if prepared.prompt_tokens is not None:
        how = prepared.counted_with or "an estimate"
    counter = (
        PromptCounter.for_spec(spec, questions=plan.questions, tokenizer=tokenizer)
        if tokenizer is not None
        else None
    )
    window = _sliding_window(spec, settings=settings)
    shards_per_size = Counter(plan.trials[s.trial_indices[0]].batch_size for s in plan.shards)
    trials_per_size = Counter(t.batch_size for t in plan.trials)
    groups: dict[tuple[int, int], list[Trial]] = {}
    for t in plan.trials:  # grouped once: 5,000 filler lengths would scan the trials 5,000 times
        groups.setdefault((t.batch_size, t.filler_tokens), []).append(t)
    per_level = max(1, sample // len(spec.filler_lengths))  # a sample per filler length: its first sets
    to_render = sum(
        min(per_level, len(groups.get((n, level), [])))
        for n in spec.batch_sizes
        for level in spec.filler_lengths
    )
    sheets: dict[tuple[int, ...], dict[int, int]] = {}
    rendered_count = 0
    estimates = []
    designs = []
    checked: list[tuple[Trial, PromptTokens]] = []  # per batch size, its last prompt counted
    for n in spec.batch_sizes:
        lengths: dict[int, list[int]] = {}
        distances: dict[int, list[int]] = {}
        last: tuple[Trial, PromptTokens] | None = None
        for level in spec.filler_lengths:
            for trial in groups.get((n, level), [])[:per_level]:
                if on_progress is not None and rendered_count % 50 == 0:
                    on_progress(rendered_count, to_render)
                rendered_count += 1
                if tokenizer is None or counter is None:
                    rendered = render(
                        trial,
                        questions=plan.questions,
                        template=spec.prompt,
                        chat_template=spec.chat_template,
                        tokenizer=None,
                        filler=spec.filler,
                        seed=spec.seed,
                    )
                    # Without the tokenizer, ~4 characters a token is the usual rule for English text.
                    lengths.setdefault(level, []).append(round(len(rendered.text) / 4))
                    continue
                counted = counter.whole(trial) if whole else counter.count(trial)
                last = (trial, counted)
                length = counted.prompt_tokens
                lengths.setdefault(level, []).append(length)
                sheet = sheets.get(counted.asked)
                if sheet is None:
                    sheet = sheets[counted.asked] = sheet_answer_tokens(counted.asked, tokenizer=tokenizer)
                distances.setdefault(level, []).extend(
                    length - counted.question_ends[k - 1] + sheet[k] for k in counted.asked
                )
        if last is not None:
            checked.append(last)
        every = [length for found in lengths.values() for length in found]
        if prepared.prompt_tokens is not None:  # a served job: counted by the endpoint's tokenizer
            every = prepared.prompt_tokens.get(n, every)
        estimates.append(
            BatchSizeEstimate(
                batch_size=n,
                trials=trials_per_size[n],
                shards=shards_per_size[n],
                mean_prompt_tokens=statistics.fmean(every) if every else 0.0,
                max_prompt_tokens=max(every, default=0),
            )
        )
        for level, found in sorted(lengths.items()):
            near = distances.get(level, [])
            designs.append(
                DesignEstimate(
                    batch_size=n,
                    filler_tokens=level,
                    trials=len(groups.get((n, level), [])),
                    mean_prompt_tokens=statistics.fmean(found),
                    max_prompt_tokens=max(found),
                    min_distance=min(near, default=None),
                    max_distance=max(near, default=None),
                    past_window=sum(d >= window for d in near) / len(near) if window and near else None,
                )
            )
    if on_progress is not None and to_render:
        on_progress(to_render, to_render)
    if (
        counter is not None
        and not (whole or counter.exact)
        and any(counter.whole(trial) != counted for trial, counted in checked)
    ):
        return _dry_run(
            prepared,
            settings=settings,
            sample=sample,
            on_progress=on_progress,
            whole=True,
            counting="each prompt tokenized whole: counted from its pieces, a prompt came out different",
        )
    if counting is None:
        counting = _counting(counter, whole=whole, checked=len(checked))
    return DryRun(
        spec=spec,
        spec_hash=spec.spec_hash(),
        model_key=spec.model_key(),
        questions_in_pool=len(prepared.pool),
        source=prepared.pool.source,
        tokenizer=how,
        counting=counting,
        batch_sizes=tuple(estimates),
        max_model_len=spec.engine.max_model_len if declared(spec.engine.name).chooses_context else None,
        model_context=prepared.context.model_limit if prepared.context else None,
        context=prepared.engine_context,
        endpoint=prepared.endpoint,
        max_job_tokens=spec.engine.max_job_tokens,
        design=spec.describe_design(),
        sliding_window=window,
        designs=tuple(designs),
    )


def _counting(counter: PromptCounter | None, *, whole: bool, checked: int) -> str:
    """How a dry run's prompts were counted, in words (`DryRun.counting`)."""
    if counter is None:
        return ""
    if whole:
        return "each prompt tokenized whole"
    if counter.exact:
        return "exactly, from each prompt's pieces"
    prompts = "prompt" if checked == 1 else "prompts"
    return (
        f"from each prompt's pieces: exact unless the tokenizer shapes a token from text over "
        f"{counter.reach} characters away; {checked} {prompts} tokenized whole agreed"
    )


def _sliding_window(spec: JobSpec, *, settings: Settings) -> int | None:
    """The model's sliding window when it is known here: the one its spec sets (the fake engine's), or from
    a config on this machine."""
    own = declared(spec.engine.name).sliding_window
    if own is not None:
        return own(spec)
    from posbias.workers.models import local_model_info

    info = local_model_info(spec.model, revision=spec.revision, cache_dir=settings.cache_dir)
    return info.sliding_window if info is not None else None


def _local_tokenizer(spec: JobSpec, *, settings: Settings) -> tuple[Tokenizer | None, str]:
    engine = declared(spec.engine.name)
    if engine.tokenizer is not None:
        return engine.tokenizer(spec), f"the {spec.engine.name} engine's tokenizer"
    from posbias.workers.models import local_tokenizer

    try:
        tokenizer: Tokenizer | None = local_tokenizer(
            spec.model, tokenizer=spec.tokenizer, cache_dir=settings.cache_dir
        )
    except Exception as exc:  # a model folder whose tokenizer transformers cannot read; its load will say so
        why = f"the model's tokenizer cannot be read here: {one_line(exc, typed=True)}"
        return None, f"an estimate of 4 characters a token ({why})"
    if tokenizer is None:
        return None, "an estimate of 4 characters a token (the model's tokenizer is not on this machine)"
    return tokenizer, "the model's tokenizer"
