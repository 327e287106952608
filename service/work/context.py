"""The context length a job's engine starts with: its longest prompt plus that prompt's answer budget, from
the plan, rounded up to a power of two, and checked at submit against the model's own limit.

vLLM starts an engine with the model's full context unless told otherwise (131,072 tokens for Llama 3.x and
Gemma 3 4B+) and refuses to start when one sequence that long does not fit the KV cache (a 70B model on
4 x L40S); posbias needs only its longest prompt plus its answers, about 6.5k tokens at N = 50.

Counting every prompt of a job exactly would tokenize it whole (a million tokens for the default job: seconds
here, minutes for big jobs), so each question's block is tokenized once and a prompt is bounded by its
blocks, `SLACK` tokens a block for its number and its joins, and the text around them (measured on the
prompt with the largest bound, counted from its pieces as `longest_prompt` says). The text around the
questions is measured per batch size and filler length (filler is part of it, in the model's tokens), so a
job that sweeps filler lengths is sized by its longest filler. Only a group whose bound does not fit the
model is counted prompt by prompt, and whole, so a refusal is always for a prompt that really is too long.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from posbias.schemas import EngineContext, JobSpec, Plan, PosbiasError, Trial
from posbias.workers.engine import Tokenizer
from posbias.workers.prompt_tokens import PromptCounter
from posbias.workers.prompts import RenderedPrompt, question_block, render

MIN_CONTEXT = 1024
"""The smallest context length chosen. Chosen lengths are powers of two, so that jobs of one model with
similar prompts share an engine (the context length is part of the engine's identity, its model key), at
the cost of at most twice the KV cache one sequence needs."""
SLACK = 4
"""Tokens a question block may gain inside a prompt over its count alone: a longer position number (up to
three digits where the tokenizer splits digits) and merges at its joins."""
CHARS_PER_TOKEN = 2.0
"""Without the model's tokenizer: a bound on English text (BPE tokenizers average 3 to 4 characters)."""


class ContextError(PosbiasError):
    """A job's prompts plus their answers do not fit the model's own context (not a setting to change): a
    caller that chooses the batch size (`posbias diagnose`) tries a smaller one."""


@dataclass(frozen=True)
class Longest:
    """The longest prompt of a job plus its answer budget."""

    batch_size: int
    prompt_tokens: int
    answer_tokens: int
    counted: bool
    """True when counted with the model's tokenizer; False for the characters estimate."""
    filler_tokens: int = 0
    """The filler length of that prompt."""

    @property
    def tokens(self) -> int:
        """Prompt plus answers."""
        return self.prompt_tokens + self.answer_tokens


@dataclass(frozen=True)
class Context:
    """The context length a job's engine starts with, and why."""

    max_model_len: int | None
    """What the engine is started with: the spec's, the plan's rounded up, or None (the model's own)."""
    longest: Longest | None
    model_limit: int | None
    """The model's own context, from its config; None when it could not be had."""
    source: str = ""
    """Where `max_model_len` came from, in words (`(the longest prompt 5,120 + its answer budget ...)`)."""

    def record(self) -> EngineContext:
        """As it is stored with the job and shown by the dry run and `posbias status`."""
        return EngineContext(tokens=self.max_model_len, source=self.source)


def longest_prompt(
    spec: JobSpec,
    plan: Plan,
    *,
    tokenizer: Tokenizer | None,
    budget: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Longest | None:
    """The longest prompt of `plan` plus its answer budget, over all batch sizes; None for a plan with no
    trials. A bound (see the module's docstring), except where the bound exceeds `budget` (the context
    there is to fit in): there every prompt of the batch size is counted exactly, so that a job is refused
    only for a prompt that really does not fit. `on_progress(groups measured, groups)` is called as it
    goes, a group being one batch size at one filler length (5,000 filler lengths take a while).

    The prompt each group's bound is measured on is counted from its pieces (`workers/prompt_tokens.py`),
    not tokenized whole (a sweep of 5,000 filler lengths took minutes so); where that is not proven exact
    (a model's tokenizer), the longest is tokenized whole to check, and on a difference every group is."""
    found = _longest(spec, plan, tokenizer=tokenizer, budget=budget, on_progress=on_progress, whole=False)
    if found.prompt is None or found.counter is None or found.counter.exact:
        return found.longest
    if found.counter.whole(found.prompt).prompt_tokens == found.counted:
        return found.longest
    return _longest(
        spec, plan, tokenizer=tokenizer, budget=budget, on_progress=on_progress, whole=True
    ).longest


@dataclass(frozen=True)
class _Found:
    """What `_longest` found: the longest prompt, and the trial its bound was counted on, with that count."""

    longest: Longest | None
    prompt: Trial | None = None
    counted: int = 0
    counter: PromptCounter | None = None


def _longest(
    spec: JobSpec,
    plan: Plan,
    *,
    tokenizer: Tokenizer | None,
    budget: int | None,
    on_progress: Callable[[int, int], None] | None,
    whole: bool,
) -> _Found:
    """`longest_prompt`, its bounds measured on prompts tokenized `whole` or counted from their pieces."""
    groups: dict[tuple[int, int], list[Trial]] = {}
    for trial in plan.trials:
        groups.setdefault((trial.batch_size, trial.filler_tokens), []).append(trial)
    blocks = _block_tokens(spec, plan, tokenizer=tokenizer) if tokenizer is not None else {}
    counter = (
        PromptCounter.for_spec(spec, questions=plan.questions, tokenizer=tokenizer)
        if tokenizer is not None
        else None
    )
    found = _Found(longest=None, counter=counter)
    for done, ((batch_size, filler), trials) in enumerate(sorted(groups.items())):
        if on_progress is not None and done % 20 == 0:
            on_progress(done, len(groups))
        answers = spec.sampling.max_tokens_for(len(trials[0].asked()), answer_mode=spec.answer_mode)
        top: Trial | None = None
        counted = 0
        if counter is None:
            chars = max(len(_render(spec, plan, trial, tokenizer=None).text) for trial in trials)
            group = Longest(batch_size, math.ceil(chars / CHARS_PER_TOKEN), answers, False, filler)
        else:
            top = max(trials, key=lambda trial: _bound(trial, blocks))
            counted = (counter.whole(top) if whole else counter.count(top)).prompt_tokens
            prompt = _bounded(top, counted, blocks)
            if budget is not None and prompt + answers > budget:
                # A refusal counts every prompt of the group whole: it is for a prompt really too long.
                prompt = max(counter.whole(t).prompt_tokens for t in trials)
                top = None
            group = Longest(batch_size, prompt, answers, True, filler)
        if found.longest is None or group.tokens > found.longest.tokens:
            found = _Found(longest=group, prompt=top, counted=counted, counter=counter)
    if on_progress is not None and groups:
        on_progress(len(groups), len(groups))
    return found


def context_for(
    spec: JobSpec, *, longest: Longest | None, model_limit: int | None, limit_source: str = "its config"
) -> Context:
    """The context length for `spec`'s engine, and where it came from (`limit_source`: where the model's
    limit was read). Without the tokenizer or the model's config the estimate alone, rounded up, is the
    bound: starting with the model's own context (131,072 tokens for Llama 3.x) can fail on a KV cache that
    holds the job's prompts many times over. Raises `PosbiasError` when the prompts do not fit the model's
    limit, or the spec's `max_model_len` exceeds that limit or (counted exactly) is too short for them."""
    chosen = spec.engine.max_model_len
    if model_limit is not None and chosen is not None and chosen > model_limit:
        raise PosbiasError(
            f"engine.max_model_len {chosen:,} is more than the model's context of {model_limit:,} tokens; "
            "lower it or leave it unset"
        )
    if longest is not None and longest.counted:
        filler = f" with {longest.filler_tokens:,} filler tokens" if longest.filler_tokens else ""
        where = (
            f"the longest prompt at batch size {longest.batch_size}{filler} is {longest.prompt_tokens:,} "
            f"tokens plus {longest.answer_tokens:,} for the answers"
        )
        if model_limit is not None and longest.tokens > model_limit:
            raise ContextError(
                f"{where}, more than the model's context of {model_limit:,} tokens; use smaller batch sizes "
                f"(the largest is {longest.batch_size}), less filler, fewer answer tokens or a model with a "
                "longer context"
            )
        if chosen is not None and longest.tokens > chosen:
            raise PosbiasError(
                f"{where}, more than engine.max_model_len {chosen:,}; raise it, or leave it unset to have it "
                "chosen from the prompts"
            )
    source = _source(spec, longest=longest, model_limit=model_limit, limit_source=limit_source)
    if chosen is None and longest is not None:
        chosen = max(MIN_CONTEXT, 1 << (longest.tokens - 1).bit_length())
        if model_limit is not None:
            chosen = min(chosen, model_limit)
    return Context(max_model_len=chosen, longest=longest, model_limit=model_limit, source=source)


def _source(spec: JobSpec, *, longest: Longest | None, model_limit: int | None, limit_source: str) -> str:
    if spec.engine.max_model_len is not None:
        return "set in the spec"
    if longest is None:
        return "the model's own: the plan has no prompts"
    how = (
        "counted with the tokenizer"
        if longest.counted
        else f"estimated at {CHARS_PER_TOKEN:g} characters a token"
    )
    said = (
        f"the longest prompt {longest.prompt_tokens:,} + its answer budget {longest.answer_tokens:,}, {how}, "
        "rounded up to a power of two"
    )
    if model_limit is not None:
        return f"{said}, within the model's {model_limit:,} from {limit_source}"
    if longest.counted:
        return f"{said}; the model's own limit is not known here"
    return f"{said}: a default, no tokenizer or config could be had"


def _render(spec: JobSpec, plan: Plan, trial: Trial, *, tokenizer: Tokenizer | None) -> RenderedPrompt:
    return render(
        trial,
        questions=plan.questions,
        template=spec.prompt,
        chat_template=spec.chat_template,
        tokenizer=tokenizer,
        filler=spec.filler,
        seed=spec.seed,
    )


def _block_tokens(spec: JobSpec, plan: Plan, *, tokenizer: Tokenizer) -> dict[str, int]:
    """Tokens of each question's block alone (at position 1, options in the dataset's order)."""
    ids = sorted(plan.questions)
    texts = [
        question_block(
            spec.prompt,
            position=1,
            question=plan.questions[qid],
            order=tuple(range(len(plan.questions[qid].choices))),
        )
        for qid in ids
    ]
    return dict(zip(ids, _count(texts, tokenizer=tokenizer), strict=True))


def _count(texts: Sequence[str], *, tokenizer: Tokenizer) -> list[int]:
    hf = getattr(tokenizer, "hf", None)
    if hf is not None:  # a Hugging Face fast tokenizer encodes a batch in parallel, without offsets
        return [len(ids) for ids in hf(list(texts), add_special_tokens=False)["input_ids"]]
    return [len(tokenizer.encode(text, add_special_tokens=False).ids) for text in texts]


def _bound(trial: Trial, blocks: dict[str, int]) -> int:
    return sum(blocks[qid] + SLACK for qid in trial.question_ids)


def _bounded(top: Trial, exact: int, blocks: dict[str, int]) -> int:
    """A bound on every prompt of `top`'s group, `top` being the one with the largest bound on its questions:
    the text around the questions (instructions, answer request, chat template), from `top`'s `exact` count,
    plus that bound."""
    around = max(0, exact - sum(blocks[qid] for qid in top.question_ids))
    return around + _bound(top, blocks)
