"""The engine's context length from the plan: a bound that holds for every prompt, rounded up to a power of
two, and the refusals at submit (the prompts do not fit the model, or the spec's own context)."""

from __future__ import annotations

import pytest

from posbias.schemas import JobSpec, PosbiasError, QuestionPool
from posbias.service.work.context import MIN_CONTEXT, context_for, longest_prompt
from posbias.service.work.planner import plan
from posbias.workers.fake_engine import FakeTokenizer
from posbias.workers.prompts import render_trial


def _spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"model": "m", **fields})


def test_the_longest_prompt_bounds_every_prompt_and_is_near_the_real_one(mmlu_pool: QuestionPool) -> None:
    spec = _spec(batch_sizes=[1, 10, 30], iterations=40, seed=3, shuffle_choices=True)
    planned = plan(spec, pool=mmlu_pool)
    tokenizer = FakeTokenizer()
    longest = longest_prompt(spec, planned, tokenizer=tokenizer)
    assert longest is not None and longest.counted
    exact = {
        trial.index: len(
            render_trial(trial, spec=spec, questions=planned.questions, tokenizer=tokenizer).token_ids or ()
        )
        for trial in planned.trials
    }
    real = max(exact[t.index] for t in planned.trials if t.batch_size == 30)
    assert longest.batch_size == 30
    assert real <= longest.prompt_tokens <= real + 4 * 30
    assert longest.answer_tokens == spec.sampling.max_tokens_for(30, answer_mode=spec.answer_mode)


def test_the_context_is_the_longest_prompt_plus_answers_rounded_up_to_a_power_of_two(
    mmlu_pool: QuestionPool,
) -> None:
    spec = _spec(batch_sizes=[5, 20], iterations=10)
    longest = longest_prompt(spec, plan(spec, pool=mmlu_pool), tokenizer=FakeTokenizer())
    assert longest is not None
    chosen = context_for(spec, longest=longest, model_limit=131_072)
    assert chosen.max_model_len is not None
    assert chosen.max_model_len >= longest.tokens > chosen.max_model_len // 2
    assert chosen.max_model_len & (chosen.max_model_len - 1) == 0
    # Never above the model's own limit, and never below the floor.
    assert context_for(spec, longest=longest, model_limit=longest.tokens).max_model_len == longest.tokens
    small = _spec(batch_sizes=[1], iterations=2)
    tiny = longest_prompt(small, plan(small, pool=mmlu_pool), tokenizer=FakeTokenizer())
    assert context_for(small, longest=tiny, model_limit=None).max_model_len == MIN_CONTEXT


def test_prompts_longer_than_the_model_are_refused_in_one_line(mmlu_pool: QuestionPool) -> None:
    spec = _spec(batch_sizes=[1, 40], iterations=5)
    longest = longest_prompt(spec, plan(spec, pool=mmlu_pool), tokenizer=FakeTokenizer(), budget=2048)
    assert longest is not None and longest.tokens > 2048
    with pytest.raises(PosbiasError) as refused:
        context_for(spec, longest=longest, model_limit=2048)
    message = str(refused.value)
    assert "\n" not in message
    assert f"the longest prompt at batch size 40 is {longest.prompt_tokens:,} tokens" in message
    assert "more than the model's context of 2,048 tokens; use smaller batch sizes" in message


def test_the_specs_own_context_is_kept_and_checked(mmlu_pool: QuestionPool) -> None:
    spec = _spec(batch_sizes=[20], iterations=5, engine={"max_model_len": 60_000})
    longest = longest_prompt(spec, plan(spec, pool=mmlu_pool), tokenizer=FakeTokenizer())
    assert context_for(spec, longest=longest, model_limit=None).max_model_len == 60_000
    with pytest.raises(PosbiasError, match=r"engine\.max_model_len 60,000 is more than the model's context"):
        context_for(spec, longest=longest, model_limit=32_768)
    short = _spec(batch_sizes=[20], iterations=5, engine={"max_model_len": 512})
    with pytest.raises(PosbiasError, match=r"more than engine\.max_model_len 512; raise it"):
        context_for(short, longest=longest, model_limit=None)


def test_without_the_tokenizer_an_estimate_bounds_the_context_and_says_so(mmlu_pool: QuestionPool) -> None:
    spec = _spec(batch_sizes=[10], iterations=5)
    estimate = longest_prompt(spec, plan(spec, pool=mmlu_pool), tokenizer=None)
    assert estimate is not None and not estimate.counted
    # Neither tokenizer nor config: a bounded default, never the model's own (131,072 tokens for Llama 3.x).
    alone = context_for(spec, longest=estimate, model_limit=None)
    assert alone.max_model_len is not None and estimate.tokens <= alone.max_model_len < 2 * estimate.tokens
    assert "estimated at 2 characters a token" in alone.source
    assert alone.source.endswith("a default, no tokenizer or config could be had")
    capped = context_for(spec, longest=estimate, model_limit=2048)
    assert capped.max_model_len == 2048  # an estimate never refuses a job


@pytest.mark.parametrize("where", ["before", "end"])
def test_the_longest_prompt_counted_from_pieces_is_the_one_counted_whole(
    where: str, mmlu_pool: QuestionPool
) -> None:
    """Over a sweep of filler lengths, with the fake tokenizer (exact) and a tiny BPE one (checked on the
    longest), each group's bound measured on prompts counted from their pieces, as on prompts tokenized
    whole: the same longest prompt; and a tokenizer whose pieces count wrong is measured whole."""
    from support.odd_tokenizers import ChunkTokenizer

    from posbias.service.work.context import _longest
    from posbias.workers.tiny_models import _LLAMA_STYLE, _build_tokenizer
    from posbias.workers.tokenizer import HfTokenizer

    spec = _spec(batch_sizes=[2, 6], iterations=3, filler={"tokens": [0, 5, 60, 700, 1500], "where": where})
    planned = plan(spec, pool=mmlu_pool)
    bpe = HfTokenizer(_build_tokenizer(_LLAMA_STYLE, vocab_size=512, seed=0))
    for tokenizer in (FakeTokenizer(), bpe, ChunkTokenizer()):
        whole = _longest(spec, planned, tokenizer=tokenizer, budget=None, on_progress=None, whole=True)
        assert longest_prompt(spec, planned, tokenizer=tokenizer) == whole.longest
        assert whole.longest is not None and whole.longest.filler_tokens == 1500
