"""Designs that pull position, answer slot and token distance apart: the spec, the planner, the prompt and
the constrained pattern of each design position by position, the parser's slots, filler measured in tokens,
and the fake engine driven by each cause."""

from __future__ import annotations

import re
from pathlib import Path

import llguidance
import numpy as np
import pytest
import xgrammar
from scipy.stats import binom

from posbias.schemas import (
    ChatTemplateUse,
    FakeSpec,
    JobSpec,
    ModelInfo,
    ParseStatus,
    PosbiasError,
    PromptTemplate,
    QuestionPool,
    Trial,
)
from posbias.service.work import planner, submission
from posbias.workers.engine import GenerationRequest
from posbias.workers.fake_engine import FakeEngine, FakeTokenizer
from posbias.workers.filler import BUILTIN_TEXT, filler_text
from posbias.workers.parsing import parse_answers
from posbias.workers.prompts import (
    RenderedPrompt,
    answer_regex,
    option_labels,
    render_trial,
    sheet_answer_tokens,
)
from posbias.workers.shard import run_shard, window_view

TEMPLATE = PromptTemplate()
HEAD = TEMPLATE.instructions.replace("{options}", "1, 2, 3, or 4")
PROBE_HEAD = TEMPLATE.probe_instructions.replace("{options}", "1, 2, 3, or 4")


def _spec(**fields: object) -> JobSpec:
    values: dict[str, object] = {
        "model": "fake",
        "engine": {"name": "fake"},
        "batch_sizes": [6],
        "iterations": 12,
    }
    values.update(fields)
    return JobSpec.model_validate(values)


def _render(
    spec: JobSpec, trial: Trial, pool: QuestionPool, *, tokenizer: FakeTokenizer | None = None
) -> RenderedPrompt:
    return render_trial(
        trial, spec=spec, questions=pool.by_id(), tokenizer=tokenizer, chat_template=ChatTemplateUse.off
    )


def _block(pool: QuestionPool, qid: str, position: int) -> str:
    question = pool.by_id()[qid]
    choices = "\n".join(f"   {i}. {text}" for i, text in enumerate(question.choices, start=1))
    return f"{position}. Question: {question.question}\n   Choices:\n{choices}"


# --- the spec -----------------------------------------------------------------------------------------


def test_a_spec_without_designs_keeps_the_hash_jobs_were_stored_with() -> None:
    # The hash of this spec before designs existed: stored jobs' idempotency keys still name them.
    assert JobSpec(model="m").spec_hash() == "9d1e46eb8d348630"
    assert JobSpec(model="m", answer_order="reverse").spec_hash() != "9d1e46eb8d348630"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"design": "probe", "answer_order": "reverse"}, "leave answer_order forward"),
        ({"filler": {"tokens": [10], "where": "after"}}, "needs the question it follows"),
        (
            {"filler": {"tokens": [10], "where": "after", "position": 6}, "batch_sizes": [6, 8]},
            "batch sizes [6] have no question",
        ),
        ({"filler": {"tokens": "10,x"}}, "comma-separated integers"),
        ({"filler": {"tokens": [10], "position": 2}}, "only for `where: after`"),
    ],
)
def test_designs_that_cannot_run_are_refused_in_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PosbiasError) as caught:
        JobSpec.build({"model": "m", **fields})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_filler_sweep_shows_every_set_at_every_length() -> None:
    spec = _spec(filler={"tokens": "300,0,100,100"}, design="rotation")
    assert spec.filler is not None and spec.filler.tokens == (0, 100, 300)
    assert spec.trials_per_batch_size(6) == 12 * 6 * 3


# --- the planner --------------------------------------------------------------------------------------


def test_answer_orders_and_filler_keep_the_seeds_questions(make_pool) -> None:  # type: ignore[no-untyped-def]
    pool = make_pool(80)
    base = planner.plan(_spec(), pool=pool)
    for fields in (
        {"answer_order": "reverse"},
        {"answer_order": "random"},
        {"filler": {"tokens": [0, 50]}},
        {"design": "probe"},
    ):
        designed = planner.plan(_spec(**fields), pool=pool)
        sets = [t.question_ids for t in designed.trials]
        assert sorted(set(sets)) == sorted({t.question_ids for t in base.trials}), fields
    reverse = planner.plan(_spec(answer_order="reverse"), pool=pool)
    assert all(t.answer_order == (6, 5, 4, 3, 2, 1) for t in reverse.trials)
    assert all(t.answer_order is None for t in base.trials)


def test_a_random_order_is_drawn_per_set_and_shared_by_its_filler_lengths(make_pool) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(answer_order="random", filler={"tokens": [0, 40, 80]}, iterations=30)
    trials = planner.plan(spec, pool=make_pool(80)).trials
    assert len(trials) == 90 and [t.filler_tokens for t in trials[:3]] == [0, 40, 80]
    orders = []
    for first in range(0, 90, 3):
        same_set = trials[first : first + 3]
        assert len({(t.question_ids, t.answer_order) for t in same_set}) == 1
        order = same_set[0].answer_order
        assert order is not None and sorted(order) == [1, 2, 3, 4, 5, 6]
        orders.append(order)
    assert len(set(orders)) > 20  # drawn, not fixed
    assert planner.plan(spec, pool=make_pool(80)).trials == trials  # from the seed


def test_the_probe_design_asks_every_position_of_every_set_once(make_pool) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(
        design="probe", batch_sizes=[1, 4, 6], iterations=5, filler={"tokens": [0, 30]}, shuffle_choices=True
    )
    trials = planner.plan(spec, pool=make_pool(80)).trials
    for n in (1, 4, 6):
        mine = [t for t in trials if t.batch_size == n]
        assert len(mine) == spec.trials_per_batch_size(n) == 5 * n * 2, n
        for iteration in range(5):
            one_set = [t for t in mine if t.iteration == iteration]
            # One prompt per position and filler length; they differ only in the position asked.
            assert sorted((t.probe, t.filler_tokens) for t in one_set) == [
                (p, f) for p in range(1, n + 1) for f in (0, 30)
            ], (n, iteration)
            assert len({(t.question_ids, t.choice_orders) for t in one_set}) == 1
    assert all(t.asked() == (t.probe,) for t in trials)
    # A shard holds whole sets, so the prompts that share a prefix reach one engine call.
    plan = planner.plan(_spec(design="probe", batch_sizes=[50], iterations=4), pool=make_pool(80))
    assert {len(shard.trial_indices) for shard in plan.shards} == {50}


# --- prompts and patterns, position by position --------------------------------------------------------


def test_reverse_order_states_the_order_and_the_pattern_follows_it(mmlu_pool: QuestionPool) -> None:
    spec = _spec(answer_order="reverse", batch_sizes=[5], iterations=1)
    trial = planner.plan(spec, pool=mmlu_pool).trials[0]
    prompt = _render(spec, trial, mmlu_pool)
    blocks = [_block(mmlu_pool, qid, p) for p, qid in enumerate(trial.question_ids, start=1)]
    assert prompt.text == "\n\n".join(
        [HEAD, "Answer the questions in this order: 5, 4, 3, 2, 1.", *blocks, TEMPLATE.answer_intro]
    )
    for placed, block in zip(prompt.questions, blocks, strict=True):
        assert prompt.text[placed.char_start : placed.char_end] == block
    regex = answer_regex(prompt.n_options, asked=prompt.asked)
    assert regex == "5\\. [1-4]\\n4\\. [1-4]\\n3\\. [1-4]\\n2\\. [1-4]\\n1\\. [1-4]\\n?"
    assert re.fullmatch(regex, "5. 2\n4. 1\n3. 4\n2. 3\n1. 1")
    assert not re.fullmatch(regex, "1. 1\n2. 3\n3. 4\n4. 1\n5. 2")
    # vLLM's structured-output backends accept it.
    xgrammar.Grammar.from_regex(regex)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("regex", regex)) == ""


def test_a_random_order_is_stated_and_constrained_line_by_line(mmlu_pool: QuestionPool) -> None:
    spec = _spec(answer_order="random", batch_sizes=[8], iterations=1, seed=4)
    trial = planner.plan(spec, pool=mmlu_pool).trials[0]
    assert trial.answer_order is not None
    prompt = _render(spec, trial, mmlu_pool)
    paragraphs = prompt.text.split("\n\n")
    assert paragraphs[0] == HEAD
    assert (
        paragraphs[1]
        == "Answer the questions in this order: " + ", ".join(map(str, trial.answer_order)) + "."
    )
    regex = answer_regex(prompt.n_options, asked=prompt.asked)
    lines = regex.removesuffix("\\n?").split("\\n")
    assert [int(line.split("\\.")[0]) for line in lines] == list(trial.answer_order)


@pytest.mark.parametrize("where", ["before", "after", "end"])
def test_filler_sits_where_asked_without_moving_a_question_or_splitting_one(
    where: str, mmlu_pool: QuestionPool
) -> None:
    filler = {"tokens": [0, 120], "where": where, **({"position": 2} if where == "after" else {})}
    spec = _spec(filler=filler, batch_sizes=[4], iterations=1)
    plain, padded = planner.plan(spec, pool=mmlu_pool).trials
    assert (plain.filler_tokens, padded.filler_tokens) == (0, 120)
    tokenizer = FakeTokenizer(chat_template=False)
    without = _render(spec, plain, mmlu_pool, tokenizer=tokenizer)
    with_filler = _render(spec, padded, mmlu_pool, tokenizer=tokenizer)
    assert without.filler_chars is None and without.filler_tokens is None

    text = filler_text(spec.filler, padded, seed=spec.seed, tokenizer=tokenizer, separator="\n\n")  # type: ignore[arg-type]
    blocks = [_block(mmlu_pool, qid, p) for p, qid in enumerate(padded.question_ids, start=1)]
    order = {
        "before": [HEAD, text, *blocks],
        "after": [HEAD, *blocks[:2], text, *blocks[2:]],
        "end": [HEAD, *blocks, text],
    }[where]
    assert with_filler.text == "\n\n".join([*order, TEMPLATE.answer_intro])
    assert without.text == "\n\n".join([HEAD, *blocks, TEMPLATE.answer_intro])
    # Exactly the asked length in the model's tokens, inside the prompt; cut from the built-in sentences.
    assert with_filler.filler_chars is not None and with_filler.filler_tokens is not None
    start, end = with_filler.filler_tokens
    assert end - start == 120
    assert with_filler.text[slice(*with_filler.filler_chars)] == text
    assert " ".join(text.split()) in " ".join((BUILTIN_TEXT + " " + BUILTIN_TEXT).split())
    # Every question keeps its position and its text; the ones the filler follows move as far from their
    # answers as the prompt grew (the filler and its separator: 120 or 121 tokens, as the separator's
    # whitespace merges with the filler's or not), the others not at all.
    moved = {"before": set(), "after": {1, 2}, "end": {1, 2, 3, 4}}[where]
    grew = (with_filler.prompt_tokens or 0) - (without.prompt_tokens or 0)
    assert grew in (120, 121)
    for a, b in zip(without.questions, with_filler.questions, strict=True):
        assert with_filler.text[b.char_start : b.char_end] == without.text[a.char_start : a.char_end]
        assert b.token_start is not None and b.token_end is not None
        assert a.token_start is not None and a.token_end is not None
        to_end_a = (without.prompt_tokens or 0) - a.token_end
        to_end_b = (with_filler.prompt_tokens or 0) - b.token_end
        assert to_end_b - to_end_a == (grew if a.position in moved else 0), (where, a.position)
        assert not (b.token_start < end and start < b.token_end), "the filler overlaps a question"


def test_filler_is_the_same_text_for_one_set_and_grows_with_its_length(mmlu_pool: QuestionPool) -> None:
    spec = _spec(filler={"tokens": [50, 400]}, batch_sizes=[3], iterations=6)
    trials = planner.plan(spec, pool=mmlu_pool).trials
    tokenizer = FakeTokenizer()
    texts = [
        filler_text(spec.filler, t, seed=spec.seed, tokenizer=tokenizer, separator="\n\n") for t in trials
    ]  # type: ignore[arg-type]
    for short, long in zip(texts[::2], texts[1::2], strict=True):
        assert long.startswith(short.rstrip())
    assert len(set(texts[::2])) > 1  # sets start at different sentences
    again = [
        filler_text(spec.filler, t, seed=spec.seed, tokenizer=tokenizer, separator="\n\n") for t in trials
    ]  # type: ignore[arg-type]
    assert again == texts
    assert texts != [
        filler_text(spec.filler, t, seed=9, tokenizer=tokenizer, separator="\n\n") for t in trials
    ]  # type: ignore[arg-type]


def test_a_probe_asks_one_question_at_the_end_and_constrains_one_line(mmlu_pool: QuestionPool) -> None:
    spec = _spec(design="probe", batch_sizes=[5], iterations=5)
    for trial in planner.plan(spec, pool=mmlu_pool).trials:
        prompt = _render(spec, trial, mmlu_pool)
        blocks = [_block(mmlu_pool, qid, p) for p, qid in enumerate(trial.question_ids, start=1)]
        request = f"Answer question {trial.probe} only, on one line:"
        assert prompt.text == "\n\n".join([PROBE_HEAD, *blocks, request])
        assert prompt.asked == (trial.probe,)
        regex = answer_regex(prompt.n_options, asked=prompt.asked)
        assert regex == f"{trial.probe}\\. [1-4]\\n?"


def test_a_users_filler_file_is_read_once_and_stored(tmp_path: Path, mmlu_pool: QuestionPool) -> None:
    source = tmp_path / "haystack.txt"
    source.write_text("Waves roll in. Gulls call overhead. The tide turns.\n")
    spec = _spec(filler={"tokens": [30], "source": str(source)}, batch_sizes=[2], iterations=1)
    prepared = submission.read_filler(spec)
    assert prepared.filler is not None and prepared.filler.text == source.read_text()
    source.unlink()  # rendering needs the stored text only
    trial = planner.plan(prepared, pool=mmlu_pool).trials[0]
    prompt = _render(prepared, trial, mmlu_pool, tokenizer=FakeTokenizer())
    assert prompt.filler_chars is not None and prompt.filler_tokens is not None
    assert prompt.filler_tokens[1] - prompt.filler_tokens[0] == 30
    words = {"Waves", "roll", "in.", "Gulls", "call", "overhead.", "The", "tide", "turns."}
    assert set(prompt.text[slice(*prompt.filler_chars)].split()) <= words
    with pytest.raises(PosbiasError, match="cannot read the filler file"):
        submission.read_filler(spec)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PosbiasError, match="not UTF-8"):
        submission.read_filler(_spec(filler={"tokens": [30], "source": str(tmp_path / "binary.txt")}))


# --- parsing ------------------------------------------------------------------------------------------


def test_slots_are_the_answer_lines_in_the_order_written() -> None:
    text = "Sure.\n3. 2\n1. 4\nsome chatter\n2. 1\n3. 3"
    parsed = parse_answers(text, n_options=[4, 4, 4])
    assert [(a.position, a.slot, a.status) for a in parsed] == [
        (1, 2, ParseStatus.ok),
        (2, 3, ParseStatus.ok),
        (3, 1, ParseStatus.duplicate),
    ]
    probe = parse_answers("2. 3\n", n_options=[4, 4, 4], asked=[2])
    assert [(a.position, a.slot, a.predicted) for a in probe] == [(2, 1, 2)]
    assert parse_answers("", n_options=[4, 4], asked=[2])[0].slot is None


def test_window_view_counts_the_layers_that_see_a_question() -> None:
    gemma = ModelInfo(
        name="g", num_layers=26, sliding_window=4096, sliding_window_layers=tuple(range(0, 26, 2))
    )
    assert window_view(4095, model=gemma) == (True, 26)
    assert window_view(4096, model=gemma) == (False, 13)
    assert window_view(None, model=gemma) == (None, None)
    assert window_view(10_000, model=ModelInfo(name="llama", num_layers=16)) == (None, 16)
    assert window_view(10, model=ModelInfo(name="unknown")) == (None, None)


# --- the fake engine, driven by each cause ------------------------------------------------------------


def test_the_fake_follows_the_answer_slot_with_its_marginal_exactly(make_pool) -> None:  # type: ignore[no-untyped-def]
    fake = FakeSpec(first=0.2, last=0.8, depends_on="answer-slot", question_effect=0.3, prompt_effect=0.1)
    spec = _spec(answer_order="random", batch_sizes=[5], iterations=400, fake=fake, answer_mode="constrained")
    found = _run(spec, make_pool(300))
    for slot in range(1, 6):
        right = [r.correct for r in found if r.answer_slot == slot]
        _within_binomial(
            sum(right), len(right), fake.accuracy_of(position=1, batch_size=5, slot=slot, answers=5)
        )
    # Positions are answered on every slot, so by position the fake is flat.
    by_position = [np.mean([r.correct for r in found if r.position == p]) for p in range(1, 6)]
    assert max(by_position) - min(by_position) < 0.15


def test_the_fake_steps_at_its_window_on_token_distance(make_pool) -> None:  # type: ignore[no-untyped-def]
    fake = FakeSpec(first=0.8, last=0.2, depends_on="token-distance", window=250, question_effect=0.3)
    spec = _spec(
        batch_sizes=[6], iterations=300, fake=fake, filler={"tokens": [0, 100]}, answer_mode="constrained"
    )
    found = _run(spec, make_pool(300))
    inside = [r.correct for r in found if r.token_distance is not None and r.token_distance < 250]
    beyond = [r.correct for r in found if r.token_distance is not None and r.token_distance >= 250]
    assert len(inside) > 300 and len(beyond) > 300
    _within_binomial(sum(inside), len(inside), 0.8)
    _within_binomial(sum(beyond), len(beyond), 0.2)
    assert all(r.in_window == (r.token_distance < 250) for r in found if r.token_distance is not None)
    assert {r.visible_layers for r in found if r.in_window} == {4}
    assert {r.visible_layers for r in found if r.in_window is False} == {2}


def test_the_fake_answers_in_the_order_asked_and_a_probe_once(make_pool) -> None:  # type: ignore[no-untyped-def]
    pool = make_pool(60)
    for fields, lines in (({"answer_order": "random"}, 5), ({"design": "probe"}, 1)):
        spec = _spec(batch_sizes=[5], iterations=5, answer_mode="free", **fields)
        plan = planner.plan(spec, pool=pool)
        engine = FakeEngine(spec.fake, seed=spec.seed)
        shard = _shard(spec, plan)
        result = run_shard(shard, engine=engine)
        for trial, done in zip(plan.trials, result.trials, strict=True):
            written = [int(line.split(".")[0]) for line in (done.output_text or "").splitlines()]
            assert written == list(trial.asked()) and len(written) == lines
        assert len(result.results) == len(plan.trials) * lines == 25  # 5 sets: 5 prompts or 5 x 5 probes


def _shard(spec: JobSpec, plan):  # type: ignore[no-untyped-def]
    from posbias.service.work.shards import shard_spec

    return shard_spec(spec, job_id=1, shard_id=1, trials=plan.trials, questions=plan.questions)


def _run(spec: JobSpec, pool: QuestionPool):  # type: ignore[no-untyped-def]
    plan = planner.plan(spec, pool=pool)
    result = run_shard(_shard(spec, plan), engine=FakeEngine(spec.fake, seed=spec.seed))
    assert all(r.parse_status is ParseStatus.ok for r in result.results)
    return result.results


def _within_binomial(hits: int, n: int, p: float) -> None:
    low, high = binom.ppf(0.0005, n, p), binom.ppf(0.9995, n, p)
    assert low <= hits <= high, f"{hits}/{n} against {p}"


def test_sheet_answer_tokens_are_where_a_constrained_answer_lands() -> None:
    tokenizer = FakeTokenizer()
    found = sheet_answer_tokens((3, 1, 2), tokenizer=tokenizer)
    text = "3. 1\n1. 1\n2. 1"
    spans = tokenizer.encode(text, add_special_tokens=False).offsets
    assert {k: text[slice(*spans[i])] for k, i in found.items()} == {3: "1", 1: "1", 2: "1"}
    assert found == {3: 3, 1: 8, 2: 13}
    assert option_labels(4) == ("1", "2", "3", "4")
    assert GenerationRequest([], max_tokens=1, regex=None, option_labels=()).asked is None
