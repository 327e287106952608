"""Running shards on an engine: render, generate in one call, parse, and record every answer."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from posbias.schemas import (
    AnswerMode,
    ChatTemplateUse,
    ModelInfo,
    ParseStatus,
    QuestionResult,
    ResultColumns,
    ShardResult,
    ShardSpec,
    Trial,
    TrialResult,
    TrialStatus,
)
from posbias.workers.engine import Engine, Generation, GenerationRequest, TokenBudget
from posbias.workers.parsing import ParsedAnswer, parse_answers
from posbias.workers.prompts import RenderedPrompt, answer_regex, option_labels, render_trial


def run_shard(shard: ShardSpec, *, engine: Engine) -> ShardResult:
    """Answer every trial of `shard` with `engine` in one `generate` call and return all results.

    A trial whose prompt plus output budget does not fit the engine's context is skipped with its reason,
    not sent. A failed parse is recorded as not correct, with the parse status saying why.
    """
    return run_shards([shard], engine=engine)[0]


def run_shards(shards: Sequence[ShardSpec], *, engine: Engine) -> list[ShardResult]:
    """Answer the trials of several shards of one model in as few `generate` calls as their sampling
    settings allow (one, for greedy decoding), and return one result per shard, in order.

    vLLM batches only the prompts of one call, and each call ends with a tail of decode steps over ever fewer
    sequences, so a few shards in one call answer faster than one call each (benchmarks/throughput.py). A
    shard with a sampling seed gets a call of its own, since request i of a call samples with seed + i.
    Each result's `generate_seconds` is its share of its call's time, by prompt count.
    """
    prepared = [_prepare(shard, engine=engine) for shard in shards]
    calls: dict[tuple[float, float, int | None, int], list[_Prepared]] = {}
    for number, work in enumerate(prepared):
        sampling = work.shard.sampling
        alone = number if sampling.seed is not None else -1
        calls.setdefault((sampling.temperature, sampling.top_p, sampling.seed, alone), []).append(work)
    for (temperature, top_p, seed, _), members in calls.items():
        requests = [request for work in members for _, _, request in work.to_run]
        if not requests:
            continue
        started = time.perf_counter()
        generations = engine.generate(requests, temperature=temperature, top_p=top_p, seed=seed)
        seconds = time.perf_counter() - started
        if len(generations) != len(requests):
            raise RuntimeError(f"the engine answered {len(generations)} of {len(requests)} prompts")
        offset = 0
        for work in members:
            count = len(work.to_run)
            work.generations = generations[offset : offset + count]
            work.generate_seconds = seconds * count / len(requests)
            offset += count
    return [_finish(work, engine=engine) for work in prepared]


@dataclass
class _Prepared:
    """One shard's rendered prompts, before and after the engine call."""

    shard: ShardSpec
    to_run: list[tuple[Trial, RenderedPrompt, GenerationRequest]]
    skipped: dict[int, TrialResult]
    generations: list[Generation] = field(default_factory=list)
    generate_seconds: float = 0.0


def _prepare(shard: ShardSpec, *, engine: Engine) -> _Prepared:
    constrained = shard.answer_mode is AnswerMode.constrained
    to_run: list[tuple[Trial, RenderedPrompt, GenerationRequest]] = []
    skipped: dict[int, TrialResult] = {}
    budget = None
    if shard.token_budget is not None:
        budget = TokenBudget(limit=shard.token_budget, label=f"shard {shard.shard_id} of job {shard.job_id}")
    # Random, unseeded sampling: two trials' answers must never come from one cache entry of an endpoint.
    random_draws = shard.sampling.temperature > 0 and shard.sampling.seed is None
    for trial in shard.trials:
        rendered = render_trial(trial, spec=shard, questions=shard.questions, tokenizer=engine.tokenizer)
        prompt_tokens = len(rendered.token_ids or ())
        max_tokens = shard.sampling.max_tokens_for(len(rendered.asked), answer_mode=shard.answer_mode)
        if prompt_tokens + max_tokens > engine.max_model_len:
            skipped[trial.index] = TrialResult(
                trial_index=trial.index,
                status=TrialStatus.skipped,
                skip_reason=f"prompt is {prompt_tokens} tokens (+{max_tokens} for the answers); "
                f"the model's context is {engine.max_model_len}",
                prompt_tokens=prompt_tokens,
                **_filler_span(rendered),
            )
            continue
        ends = tuple(placed.token_end for placed in rendered.questions if placed.token_end is not None)
        request = GenerationRequest(
            prompt_token_ids=list(rendered.token_ids or ()),
            max_tokens=max_tokens,
            regex=answer_regex(rendered.n_options, asked=rendered.asked) if constrained else None,
            option_labels=option_labels(max(rendered.n_options)),
            answer_key=rendered.answer_key,
            question_ids=tuple(placed.question_id for placed in rendered.questions),
            prompt_text=rendered.text,
            user_text=rendered.user_text,
            chat_template_used=rendered.chat_template_used,
            chat_template_off=shard.chat_template is ChatTemplateUse.off,
            n_options=rendered.n_options,
            budget=budget,
            cache_salt=f"job {shard.job_id} trial {trial.index}" if random_draws else None,
            asked=rendered.asked,
            question_token_ends=ends if len(ends) == len(rendered.questions) else None,
        )
        to_run.append((trial, rendered, request))
    return _Prepared(shard=shard, to_run=to_run, skipped=skipped)


def _finish(work: _Prepared, *, engine: Engine) -> ShardResult:
    shard = work.shard
    constrained = shard.answer_mode is AnswerMode.constrained
    trial_results = dict(work.skipped)
    columns: dict[str, list[Any]] = {name: [] for name in QuestionResult.model_fields}
    model = engine.model_info
    for (trial, rendered, _), generation in zip(work.to_run, work.generations, strict=True):
        trial_results[trial.index] = TrialResult(
            trial_index=trial.index,
            status=TrialStatus.done,
            prompt_tokens=rendered.prompt_tokens
            if rendered.prompt_tokens is not None
            else generation.prompt_tokens,
            output_tokens=len(generation.token_ids)
            if generation.token_ids or generation.output_tokens is None
            else generation.output_tokens,
            output_text=generation.text if generation.failure is None else None,
            skip_reason=generation.failure,
            **_filler_span(rendered),
        )
        parsed = parse_answers(generation.text, n_options=rendered.n_options, asked=rendered.asked)
        if generation.failure is not None:  # no answer to read: every position asked is unparseable
            parsed = tuple(replace(a, status=ParseStatus.unparseable) for a in parsed)
        for answer in parsed:
            fields = _result(shard, trial, rendered, generation, answer, model=model, constrained=constrained)
            for name, value in fields.items():
                columns[name].append(value)

    return ShardResult(
        job_id=shard.job_id,
        shard_id=shard.shard_id,
        trials=tuple(trial_results[trial.index] for trial in shard.trials),
        answers=ResultColumns.model_validate(columns),
        model=engine.model_info,
        engine=engine.info,
        generate_seconds=work.generate_seconds,
    )


def _result(
    shard: ShardSpec,
    trial: Trial,
    rendered: RenderedPrompt,
    generation: Generation,
    answer: ParsedAnswer,
    *,
    model: ModelInfo,
    constrained: bool,
) -> dict[str, Any]:
    """One answer's `QuestionResult` fields (validated with the shard's other answers, as columns)."""
    placed = rendered.questions[answer.position - 1]
    question = shard.questions[placed.question_id]
    answer_token = _token_at(generation, answer.span[0]) if answer.span is not None else None
    distance = None
    if answer_token is not None and placed.token_end is not None and rendered.prompt_tokens is not None:
        distance = (rendered.prompt_tokens - placed.token_end) + answer_token
    in_window, visible = window_view(distance, model=model)
    probs = _option_probs(generation, answer_token, n_options=placed.n_options, renormalise=constrained)
    return {
        "trial_index": trial.index,
        "position": answer.position,
        "question_id": question.id,
        "subject": question.subject,
        "gold": placed.gold,
        "predicted": answer.predicted,
        "correct": answer.status is ParseStatus.ok and answer.predicted == placed.gold,
        "parse_status": answer.status,
        "question_token_start": placed.token_start,
        "question_token_end": placed.token_end,
        "answer_slot": answer.slot,
        "answer_token_index": answer_token,
        "token_distance": distance,
        "rope_distance": None if distance is None else distance + (shard.engine.position_gap or 0),
        "in_window": in_window,
        "visible_layers": visible,
        "option_probs": probs,
        "gold_prob": probs[placed.gold] if probs is not None else None,
    }


def window_view(distance: int | None, *, model: ModelInfo) -> tuple[bool | None, int | None]:
    """Whether a question `distance` tokens before its answer is inside `model`'s sliding window, and how
    many of its layers can attend to it from the position that produced the answer token.

    That position is one before the answer token, so the question's last token is `distance` positions
    back, and a sliding layer sees it when `distance < window` (a query attends to the `window` positions up
    to and including itself, as in transformers' and vLLM's Gemma 2). Global layers always see it. A model
    without a window has every layer global.
    """
    if distance is None:
        return None, None
    if model.sliding_window is None:
        return None, model.num_layers
    inside = distance < model.sliding_window
    if model.num_layers is None:
        return inside, None
    sliding = (
        len(model.sliding_window_layers) if model.sliding_window_layers is not None else model.num_layers
    )
    return inside, model.num_layers - sliding + (sliding if inside else 0)


def _filler_span(rendered: RenderedPrompt) -> dict[str, int | None]:
    span = rendered.filler_tokens
    return {"filler_token_start": span[0] if span else None, "filler_token_end": span[1] if span else None}


def _token_at(generation: Generation, char: int) -> int | None:
    """The output token whose span holds character `char` (offsets are where each token starts)."""
    index = bisect.bisect_right(generation.token_offsets, char) - 1
    return index if index >= 0 else None


def _option_probs(
    generation: Generation, token: int | None, *, n_options: int, renormalise: bool
) -> tuple[float, ...] | None:
    """Probabilities of the option labels at `token`; a label outside the top candidates counts as 0.

    Constrained decoding masks every other token, so there the probabilities are renormalised over the
    options (a no-op when the engine already reports them after the mask).
    """
    if token is None or generation.top_logprobs is None or token >= len(generation.top_logprobs):
        return None
    candidates = generation.top_logprobs[token]
    probs = [
        math.exp(candidates[label]) if label in candidates else 0.0 for label in option_labels(n_options)
    ]
    total = sum(probs)
    if renormalise and total > 0:
        probs = [p / total for p in probs]
    return tuple(probs)
