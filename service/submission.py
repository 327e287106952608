"""From a job spec to work ready to enqueue: check the model and the data, plan the trials; or say what a job
would do (`--dry-run`) without enqueueing it.

`posbias submit`, `posbias run` and the regression scheduler all prepare through here, then enqueue with
`service.jobs.submit`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from posbias.schemas import (
    BatchSizeEstimate,
    DesignEstimate,
    DryRun,
    EngineName,
    JobSpec,
    Plan,
    PosbiasError,
    QuestionPool,
    one_line,
)
from posbias.schemas.job import MAX_FILLER_FILE_BYTES
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
    """Check the model source and the dataset, read a filler file into the spec, plan, and (for vLLM) choose
    the engine's context length from the plan and check it against the model's own. Raises `PosbiasError`
    naming the fix."""
    if spec.engine.name is EngineName.vllm:
        check_model_source(spec.model)
    spec = read_filler(spec)
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
    longest = context.longest_prompt(spec, plan, tokenizer=tokenizer, budget=min(budgets, default=None))
    chosen = context.context_for(spec, longest=longest, model_limit=limit)
    if chosen.max_model_len != spec.engine.max_model_len:
        engine = spec.engine.model_copy(update={"max_model_len": chosen.max_model_len})
        spec = spec.model_copy(update={"engine": engine})
    return Prepared(
        spec=spec, pool=pool, plan=plan, context=chosen, tokenizer=tokenizer, tokenizer_source=how
    )


def read_filler(spec: JobSpec) -> JobSpec:
    """`spec` with its filler file's text in `filler.text` (stored with the job, so its prompts can be
    rendered anywhere, again). Raises `PosbiasError` naming the fix when the file cannot be used."""
    filler = spec.filler
    if filler is None or filler.builtin or filler.text is not None:
        return spec
    path = Path(filler.source).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PosbiasError(
            f"cannot read the filler file {path}: {exc.strerror}; give a text file, or filler source builtin"
        ) from None
    if len(data) > MAX_FILLER_FILE_BYTES:
        raise PosbiasError(
            f"the filler file {path} is {len(data):,} bytes; posbias stores it with the job, so keep it "
            f"under {MAX_FILLER_FILE_BYTES:,}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PosbiasError(f"the filler file {path} is not UTF-8 text; save it as UTF-8") from None
    if len(text.split()) < 2:
        raise PosbiasError(f"the filler file {path} has no text to cut filler from; give one with sentences")
    return spec.model_copy(update={"filler": filler.model_copy(update={"text": text})})


def dry_run(prepared: Prepared, *, settings: Settings, sample: int = 20) -> DryRun:
    """Trials, shards and prompt tokens per batch size, and per batch size and filler length the token
    distances the design covers and how many reach past the model's sliding window. Tokens are counted with
    the model's tokenizer when it is on this machine (a few trials per batch size, rendered exactly), else
    estimated."""
    from posbias.workers.prompts import render, sheet_answer_tokens

    spec, plan = prepared.spec, prepared.plan
    tokenizer, how = prepared.tokenizer, prepared.tokenizer_source
    window = _sliding_window(spec, settings=settings)
    shards_per_size = Counter(plan.trials[s.trial_indices[0]].batch_size for s in plan.shards)
    estimates = []
    designs = []
    for n in spec.batch_sizes:
        trials = [t for t in plan.trials if t.batch_size == n]
        lengths: dict[int, list[int]] = {}
        distances: dict[int, list[int]] = {}
        for level in spec.filler_lengths:
            # A sample per filler length: the first sets, at this length.
            for trial in [t for t in trials if t.filler_tokens == level][
                : max(1, sample // len(spec.filler_lengths))
            ]:
                rendered = render(
                    trial,
                    questions=plan.questions,
                    template=spec.prompt,
                    chat_template=spec.chat_template,
                    tokenizer=tokenizer,
                    filler=spec.filler,
                    seed=spec.seed,
                )
                # Without the tokenizer, ~4 characters a token is the usual rule for English text.
                length = rendered.prompt_tokens or round(len(rendered.text) / 4)
                lengths.setdefault(level, []).append(length)
                if tokenizer is not None:
                    sheet = sheet_answer_tokens(rendered.asked, tokenizer=tokenizer)
                    distances.setdefault(level, []).extend(
                        length - (rendered.questions[k - 1].token_end or 0) + sheet[k] for k in rendered.asked
                    )
        every = [length for found in lengths.values() for length in found]
        estimates.append(
            BatchSizeEstimate(
                batch_size=n,
                trials=len(trials),
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
                    trials=sum(1 for t in trials if t.filler_tokens == level),
                    mean_prompt_tokens=statistics.fmean(found),
                    max_prompt_tokens=max(found),
                    min_distance=min(near, default=None),
                    max_distance=max(near, default=None),
                    past_window=sum(d >= window for d in near) / len(near) if window and near else None,
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
        design=spec.describe_design(),
        sliding_window=window,
        designs=tuple(designs),
    )


def _sliding_window(spec: JobSpec, *, settings: Settings) -> int | None:
    """The model's sliding window when it is known here: the fake's, or from a config on this machine."""
    if spec.engine.name is EngineName.fake:
        return spec.fake.window
    from posbias.workers.models import local_model_info

    info = local_model_info(spec.model, revision=spec.revision, cache_dir=settings.cache_dir)
    return info.sliding_window if info is not None else None


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
