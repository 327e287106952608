"""Running a shard on the fake engine: statuses, token offsets, probabilities, skipped prompts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from posbias.schemas import (
    AnswerMode,
    ChatTemplateUse,
    JobSpec,
    ParseStatus,
    PosbiasError,
    QuestionPool,
    ShardResult,
    ShardSpec,
    TrialStatus,
)
from posbias.service.work.planner import plan
from posbias.service.work.shards import shard_spec
from posbias.workers.fake_engine import FakeEngine, FakeTokenizer
from posbias.workers.prompts import render_trial
from posbias.workers.shard import run_shard

PoolFactory = Callable[..., QuestionPool]


def _shard(pool: QuestionPool, **fields: object) -> ShardSpec:
    spec = JobSpec.model_validate({"model": "fake-model", "engine": {"name": "fake"}, **fields})
    planned = plan(spec, pool=pool)
    return shard_spec(spec, job_id=1, shard_id=2, trials=planned.trials, questions=planned.questions)


def test_free_mode_with_malformed_output_records_why(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(100), batch_sizes=[20], iterations=10, fake={"malformed": 0.3})
    engine = FakeEngine(shard.fake)
    result = run_shard(shard, engine=engine)

    assert engine.calls == 1
    assert len(result.results) == 10 * 20
    statuses = {r.parse_status for r in result.results}
    assert {ParseStatus.ok, ParseStatus.missing, ParseStatus.unparseable} <= statuses
    for r in result.results:
        if r.parse_status is not ParseStatus.ok:
            assert r.correct is False
            assert r.predicted is None
            assert r.answer_token_index is None
            assert r.token_distance is None
            assert r.option_probs is None
        else:
            assert r.correct == (r.predicted == r.gold)
    assert all(t.status is TrialStatus.done for t in result.trials)
    assert ShardResult.model_validate_json(result.model_dump_json()) == result


def test_token_offsets_agree_with_the_tokenizer(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(60), batch_sizes=[12], iterations=4, shuffle_choices=True)
    tokenizer = FakeTokenizer()
    result = run_shard(shard, engine=FakeEngine(shard.fake, tokenizer=tokenizer))

    for trial, trial_result in zip(shard.trials, result.trials, strict=True):
        prompt = render_trial(trial, spec=shard, questions=shard.questions, tokenizer=tokenizer)
        encoding = tokenizer.encode(prompt.text, add_special_tokens=False)
        assert trial_result.prompt_tokens == len(encoding.ids)
        assert trial_result.output_text is not None
        output = tokenizer.encode(trial_result.output_text, add_special_tokens=False)
        assert trial_result.output_tokens == len(output.ids)
        answers = [r for r in result.results if r.trial_index == trial.index]
        assert [r.position for r in answers] == list(range(1, 13))
        for r in answers:
            assert r.question_token_start is not None and r.question_token_end is not None
            start = encoding.offsets[r.question_token_start][0]
            end = encoding.offsets[r.question_token_end - 1][1]
            block = prompt.text[start:end]
            question = shard.questions[r.question_id]
            assert block.startswith(f"{r.position}. Question: {question.question}\n")
            assert block.endswith(question.choices[trial.choice_orders[r.position - 1][-1]])  # type: ignore[index]
            # The answer token is the option number written on this position's line.
            assert r.answer_token_index is not None and r.predicted is not None
            s, e = output.offsets[r.answer_token_index]
            assert trial_result.output_text[s:e] == str(r.predicted + 1)
            line_start = trial_result.output_text.rfind("\n", 0, s) + 1
            assert trial_result.output_text[line_start:s] == f"{r.position}. "
            assert (
                r.token_distance == (trial_result.prompt_tokens - r.question_token_end) + r.answer_token_index
            )
            assert r.gold == trial.choice_orders[r.position - 1].index(question.answer)  # type: ignore[index]


def test_option_probabilities_at_the_answer(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(40), batch_sizes=[10], iterations=3)
    result = run_shard(shard, engine=FakeEngine(shard.fake))
    for r in result.results:
        assert r.option_probs is not None and r.gold_prob is not None and r.predicted is not None
        assert len(r.option_probs) == 4
        assert sum(r.option_probs) == pytest.approx(1.0)
        assert max(range(4), key=lambda i: r.option_probs[i]) == r.predicted  # type: ignore[index]
        assert r.gold_prob == r.option_probs[r.gold]


def test_too_long_prompt_is_skipped_with_its_reason(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(60), batch_sizes=[1, 30], iterations=2)
    short = render_trial(shard.trials[0], spec=shard, questions=shard.questions, tokenizer=FakeTokenizer())
    assert short.prompt_tokens is not None
    # Room for the one-question prompts and their answers, not for the 30-question ones.
    context = short.prompt_tokens + shard.sampling.max_tokens_for(1, answer_mode=AnswerMode.free) + 10
    engine = FakeEngine(shard.fake, max_model_len=context)
    result = run_shard(shard, engine=engine)

    by_size = {
        n: [t for t, trial in zip(result.trials, shard.trials, strict=True) if trial.batch_size == n]
        for n in (1, 30)
    }
    assert all(t.status is TrialStatus.done for t in by_size[1])
    for skipped in by_size[30]:
        assert skipped.status is TrialStatus.skipped
        assert skipped.skip_reason == (
            f"prompt is {skipped.prompt_tokens} tokens (+{16 * 30 + 64} for the answers); "
            f"the model's context is {context}"
        )
        assert skipped.output_text is None
    assert {r.trial_index for r in result.results} == {t.trial_index for t in by_size[1]}
    assert engine.calls == 1


def test_all_skipped_makes_no_engine_call(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(20), batch_sizes=[10], iterations=2)
    engine = FakeEngine(shard.fake, max_model_len=50)
    result = run_shard(shard, engine=engine)
    assert engine.calls == 0
    assert result.results == ()
    assert result.generate_seconds == 0.0
    assert [t.status for t in result.trials] == [TrialStatus.skipped] * 2


def test_constrained_mode_answers_every_position(make_pool: PoolFactory) -> None:
    shard = _shard(
        make_pool(60), batch_sizes=[25], iterations=4, answer_mode="constrained", fake={"malformed": 0.5}
    )
    result = run_shard(shard, engine=FakeEngine(shard.fake))
    assert {r.parse_status for r in result.results} == {ParseStatus.ok}
    assert all(
        r.option_probs is not None and sum(r.option_probs) == pytest.approx(1.0) for r in result.results
    )


def test_chat_template_on_without_one_is_the_users_to_fix(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(10), batch_sizes=[2], iterations=1, chat_template=ChatTemplateUse.on)
    engine = FakeEngine(shard.fake, tokenizer=FakeTokenizer(chat_template=False))
    with pytest.raises(PosbiasError, match="no chat template"):
        run_shard(shard, engine=engine)


def test_result_identifies_the_shard_and_engine(make_pool: PoolFactory) -> None:
    shard = _shard(make_pool(10), batch_sizes=[2], iterations=1)
    result = run_shard(shard, engine=FakeEngine(shard.fake, model="fake-model"))
    assert (result.job_id, result.shard_id) == (1, 2)
    assert result.model.name == "fake-model"
    assert result.engine.name == "fake"
    assert result.generate_seconds >= 0.0
