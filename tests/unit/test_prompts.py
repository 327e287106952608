"""Prompt rendering: the seed's format word for word, question locations, chat templates, the answer regex."""

from __future__ import annotations

import re

import llguidance
import pytest
import xgrammar
from hypothesis import given
from hypothesis import strategies as st

from posbias.schemas import (
    ChatTemplateUse,
    JobSpec,
    PosbiasError,
    PromptTemplate,
    Question,
    QuestionPool,
    Trial,
)
from posbias.service.work.datasets import question_id
from posbias.service.work.planner import plan
from posbias.workers.fake_engine import CHAT_TEMPLATE, FakeTokenizer
from posbias.workers.prompts import (
    _SpanLocator,
    answer_regex,
    option_labels,
    options_phrase,
    render,
    render_trial,
)

HEADER = (
    "Read the following multiple choice questions and answer them one by one. Your answer for each question "
    "should be in following format: <question number>. <the index of the correct option (1, 2, 3, or 4)>"
)
FOOTER = "Here are the answers to the multiple-choice questions, one index per line:"


def _mmlu_trial(pool: QuestionPool, batch_size: int = 50) -> Trial:
    return plan(JobSpec(model="m", batch_sizes=[batch_size], iterations=1, seed=3), pool=pool).trials[0]


def test_fifty_mmlu_questions_render_in_the_seed_format(mmlu_pool: QuestionPool) -> None:
    trial = _mmlu_trial(mmlu_pool)
    questions = mmlu_pool.by_id()
    prompt = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.off,
        tokenizer=None,
    )

    text = prompt.text
    assert text == prompt.user_text
    assert not prompt.chat_template_used
    assert len(prompt.questions) == 50
    assert text.startswith(HEADER + "\n\n1. Question: ")
    assert text[: prompt.questions[0].char_start] == HEADER + "\n\n"
    assert text[prompt.questions[-1].char_end :] == "\n\n" + FOOTER
    for placed, next_placed in zip(prompt.questions, prompt.questions[1:], strict=False):
        assert text[placed.char_end : next_placed.char_start] == "\n\n"
    for position, (placed, qid) in enumerate(zip(prompt.questions, trial.question_ids, strict=True), start=1):
        question = questions[qid]
        expected = (
            f"{position}. Question: {question.question}\n"
            "   Choices:\n"
            f"   1. {question.choices[0]}\n"
            f"   2. {question.choices[1]}\n"
            f"   3. {question.choices[2]}\n"
            f"   4. {question.choices[3]}"
        )
        assert placed.position == position
        assert placed.question_id == qid
        assert text[placed.char_start : placed.char_end] == expected
        assert placed.gold == question.answer
        assert placed.n_options == 4
    assert prompt.token_ids is None
    assert prompt.prompt_tokens is None


def test_question_tokens_cover_each_block_in_the_chat_prompt(mmlu_pool: QuestionPool) -> None:
    trial = _mmlu_trial(mmlu_pool, batch_size=20)
    tokenizer = FakeTokenizer()
    prompt = render(
        trial,
        questions=mmlu_pool.by_id(),
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.auto,
        tokenizer=tokenizer,
    )
    assert prompt.chat_template_used
    assert prompt.text == CHAT_TEMPLATE.format(text=prompt.user_text)
    encoding = tokenizer.encode(prompt.text, add_special_tokens=False)
    assert prompt.token_ids == tuple(encoding.ids)
    assert prompt.prompt_tokens == len(encoding.ids)
    assert prompt.token_ids.count(2) == 1  # one BOS: the template's

    previous_end = 0
    for placed in prompt.questions:
        assert placed.token_start is not None and placed.token_end is not None
        first = encoding.offsets[placed.token_start]
        last = encoding.offsets[placed.token_end - 1]
        # The tokens start at the block's number and end with its last option's text.
        assert first[0] == placed.char_start
        assert last[1] == placed.char_end
        assert prompt.text[first[0] : last[1]].startswith(f"{placed.position}. Question: ")
        assert placed.token_start > previous_end
        previous_end = placed.token_end


def test_token_span_includes_tokens_that_straddle_the_block() -> None:
    class Chunky(FakeTokenizer):
        """Fixed 7-character tokens, so token edges fall inside question blocks."""

        def encode(self, text: str, *, add_special_tokens: bool) -> object:  # type: ignore[override]
            from posbias.workers.engine import Encoding

            offsets = [(i, min(i + 7, len(text))) for i in range(0, len(text), 7)]
            return Encoding(ids=list(range(len(offsets))), offsets=offsets)

    questions = _questions(2)
    trial = Trial(index=0, batch_size=2, iteration=0, question_ids=tuple(questions))
    prompt = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.off,
        tokenizer=Chunky(),
    )
    for placed in prompt.questions:
        assert placed.token_start == placed.char_start // 7
        assert placed.token_end == -(-placed.char_end // 7)


def test_without_a_chat_template_the_tokenizer_adds_bos() -> None:
    questions = _questions(3)
    trial = Trial(index=0, batch_size=3, iteration=0, question_ids=tuple(questions))
    tokenizer = FakeTokenizer(chat_template=False)
    prompt = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.auto,
        tokenizer=tokenizer,
    )
    assert not prompt.chat_template_used
    assert prompt.text == prompt.user_text
    assert prompt.token_ids is not None
    assert prompt.token_ids[0] == 2
    assert prompt.questions[0].token_start == 1 + len(
        tokenizer.encode(HEADER + "\n\n", add_special_tokens=False).ids
    )


def test_chat_template_on_needs_one() -> None:
    questions = _questions(2)
    trial = Trial(index=0, batch_size=2, iteration=0, question_ids=tuple(questions))
    with pytest.raises(PosbiasError, match="no chat template; set chat_template to auto or off"):
        render(
            trial,
            questions=questions,
            template=PromptTemplate(),
            chat_template=ChatTemplateUse.on,
            tokenizer=FakeTokenizer(chat_template=False),
        )
    off = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.off,
        tokenizer=FakeTokenizer(),
    )
    assert not off.chat_template_used
    assert off.text == off.user_text


def test_shuffled_options_show_the_permutation_and_move_the_gold() -> None:
    questions = _questions(2)
    ids = tuple(questions)
    trial = Trial(
        index=0, batch_size=2, iteration=0, question_ids=ids, choice_orders=((3, 1, 0, 2), (0, 1, 2, 3))
    )
    prompt = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.off,
        tokenizer=None,
    )
    first = questions[ids[0]]
    block = prompt.text[prompt.questions[0].char_start : prompt.questions[0].char_end]
    assert block.splitlines()[2:] == [
        f"   {k}. {first.choices[j]}" for k, j in enumerate((3, 1, 0, 2), start=1)
    ]
    assert (3, 1, 0, 2)[prompt.questions[0].gold] == first.answer
    assert prompt.answer_key[1] == questions[ids[1]].answer


def test_options_phrase_follows_the_largest_question() -> None:
    assert options_phrase(4) == "1, 2, 3, or 4"
    assert options_phrase(3) == "1, 2, or 3"
    assert options_phrase(2) == "1 or 2"
    assert option_labels(5) == ("1", "2", "3", "4", "5")

    two = _question("Yes or no?", ("yes", "no"), 0)
    five = _question("Pick one", ("a", "b", "c", "d", "e"), 4)
    trial = Trial(index=0, batch_size=2, iteration=0, question_ids=(two.id, five.id))
    prompt = render(
        trial,
        questions={two.id: two, five.id: five},
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.off,
        tokenizer=None,
    )
    assert "(1, 2, 3, 4, or 5)>" in prompt.text
    assert prompt.n_options == (2, 5)


def test_braces_in_question_text_are_not_placeholders() -> None:
    tricky = _question("Is {number} or {choices} a field?", ("{text}", "{index}"), 1)
    trial = Trial(index=0, batch_size=1, iteration=0, question_ids=(tricky.id,))
    prompt = render(
        trial,
        questions={tricky.id: tricky},
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.off,
        tokenizer=None,
    )
    assert (
        "1. Question: Is {number} or {choices} a field?\n   Choices:\n   1. {text}\n   2. {index}"
        in prompt.text
    )
    assert "(1 or 2)>" in prompt.text


def test_render_trial_takes_the_specs_prompt_settings(mmlu_pool: QuestionPool) -> None:
    spec = JobSpec.model_validate(
        {
            "model": "m",
            "batch_sizes": [4],
            "iterations": 2,
            "seed": 7,
            "chat_template": "off",
            "filler": {"tokens": [30]},
            "prompt": {"answer_intro": "Answers:"},
        }
    )
    planned = plan(spec, pool=mmlu_pool)
    trial = planned.trials[0]
    tokenizer = FakeTokenizer()
    prompt = render_trial(trial, spec=spec, questions=planned.questions, tokenizer=tokenizer)
    assert prompt == render(
        trial,
        questions=planned.questions,
        template=spec.prompt,
        chat_template=ChatTemplateUse.off,
        tokenizer=tokenizer,
        filler=spec.filler,
        seed=7,
    )
    assert prompt.filler_tokens is not None and prompt.text.endswith("Answers:")
    assert not prompt.chat_template_used
    wrapped = render_trial(
        trial, spec=spec, questions=planned.questions, tokenizer=tokenizer, chat_template=ChatTemplateUse.auto
    )
    assert wrapped.chat_template_used and wrapped.text == CHAT_TEMPLATE.format(text=prompt.user_text)


def test_custom_template() -> None:
    questions = _questions(2)
    template = PromptTemplate(
        instructions="Answer with {options}.",
        question="Q{number}: {question}\n{choices}",
        choice="({index}) {text}",
        answer_intro="Answers:",
        separator="\n",
    )
    trial = Trial(index=0, batch_size=2, iteration=0, question_ids=tuple(questions))
    prompt = render(
        trial, questions=questions, template=template, chat_template=ChatTemplateUse.off, tokenizer=None
    )
    first = questions[trial.question_ids[0]]
    assert prompt.text.startswith(
        f"Answer with 1, 2, 3, or 4.\nQ1: {first.question}\n(1) {first.choices[0]}\n"
    )
    assert prompt.text.endswith("\nAnswers:")


def test_answer_regex_admits_exactly_the_answer_sheet() -> None:
    regex = answer_regex([4, 4, 4])
    assert re.fullmatch(regex, "1. 3\n2. 1\n3. 4")
    assert re.fullmatch(regex, "1. 3\n2. 1\n3. 4\n")
    for wrong in (
        "1. 3\n2. 1",
        "1. 3\n3. 1\n2. 4",
        "1. 5\n2. 1\n3. 4",
        "1. 3\n2. 1\n3. 4\n\n",
        "1.3\n2. 1\n3. 4",
        " 1. 3\n2. 1\n3. 4",
    ):
        assert not re.fullmatch(regex, wrong), wrong


def test_answer_regex_per_question_option_counts() -> None:
    regex = answer_regex([2, 12])
    assert re.fullmatch(regex, "1. 2\n2. 12")
    assert re.fullmatch(regex, "1. 1\n2. 9")
    assert not re.fullmatch(regex, "1. 3\n2. 1")
    assert not re.fullmatch(regex, "1. 1\n2. 13")
    assert not re.fullmatch(regex, "1. 1\n2. 0")


@given(st.lists(st.integers(min_value=2, max_value=15), min_size=1, max_size=60), st.data())
def test_answer_regex_round_trip(n_options: list[int], data: st.DataObject) -> None:
    answers = [data.draw(st.integers(min_value=1, max_value=n)) for n in n_options]
    sheet = "\n".join(f"{k}. {a}" for k, a in enumerate(answers, start=1))
    assert re.fullmatch(answer_regex(n_options), sheet)
    assert re.fullmatch(answer_regex(n_options), sheet + "\n")


def test_answer_regex_compiles_in_vllm_structured_output_backends() -> None:
    for n_options in ([4] * 50, [2, 3, 12], [4] * 200):
        regex = answer_regex(n_options)
        xgrammar.Grammar.from_regex(regex)
        assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("regex", regex)) == ""
    # The backend check does reject what it cannot compile.
    assert "look-around" in llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("regex", "1(?=2)"))


def _question(text: str, choices: tuple[str, ...], answer: int, subject: str = "misc") -> Question:
    return Question(
        id=question_id(subject, text, choices), subject=subject, question=text, choices=choices, answer=answer
    )


def _questions(n: int) -> dict[str, Question]:
    made = [_question(f"Question {i}?", (f"a{i}", f"b{i}", f"c{i}", f"d{i}"), i % 4) for i in range(n)]
    return {q.id: q for q in made}


offsets_strategy = st.lists(
    st.one_of(
        st.just((0, 0)),  # a special token, wherever the tokenizer puts it
        st.tuples(st.integers(0, 60), st.integers(0, 6)).map(lambda t: (t[0], t[0] + t[1])),
    ),
    max_size=40,
)


@given(offsets=offsets_strategy, start=st.integers(0, 70), width=st.integers(0, 30))
def test_a_blocks_tokens_are_those_a_scan_of_every_token_finds(
    offsets: list[tuple[int, int]], start: int, width: int
) -> None:
    # The definition the spans follow, token by token: the first token ending past the block's start, and
    # one past the last token starting before its end (offsets unsorted, as special tokens leave them).
    end = start + width
    first = next((i for i, (_, e) in enumerate(offsets) if e > start), len(offsets))
    last = max((i + 1 for i, (s, _) in enumerate(offsets) if s < end), default=0)
    assert _SpanLocator(offsets)(start, end) == (first, last)
