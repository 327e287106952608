"""Rendering a trial into the prompt the model sees, with where each question sits in it.

The default `PromptTemplate` reproduces the seed experiment's format word for word:

    Read the following multiple choice questions and answer them one by one. Your answer for each question
    should be in following format: <question number>. <the index of the correct option (1, 2, 3, or 4)>

    1. Question: <question>
       Choices:
       1. <choice>
       ...

    2. Question: ...

    Here are the answers to the multiple-choice questions, one index per line:

Options are labelled 1, 2, 3, ... (`option_labels`); the expected answer sheet is one line `k. i` per
position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from posbias.schemas import ChatTemplateUse, PosbiasError, PromptTemplate, Question, Trial
from posbias.workers.engine import Tokenizer

_QUESTION_FIELDS = re.compile(r"\{(number|question|choices)\}")
_CHOICE_FIELDS = re.compile(r"\{(index|text)\}")


@dataclass(frozen=True)
class RenderedQuestion:
    """One question's place in a rendered prompt."""

    position: int
    """1-based position in the prompt."""
    question_id: str
    char_start: int
    """Offset in `RenderedPrompt.text` of the question block's first character (its number)."""
    char_end: int
    """Offset one past the block's last character (the end of its last option)."""
    token_start: int | None
    """Index of the first prompt token that overlaps the block; None without a tokenizer."""
    token_end: int | None
    """One past the last prompt token that overlaps the block; None without a tokenizer."""
    gold: int
    """0-based index of the correct option as shown (after any shuffling of the options)."""
    n_options: int
    """Number of options shown."""


@dataclass(frozen=True)
class RenderedPrompt:
    """A trial as the model sees it."""

    user_text: str
    """The prompt before any chat template."""
    text: str
    """The final prompt: `user_text` wrapped in the chat template when one is used."""
    chat_template_used: bool
    questions: tuple[RenderedQuestion, ...]
    """One entry per position, in order."""
    token_ids: tuple[int, ...] | None
    """The exact tokens to feed the model; None without a tokenizer."""

    @property
    def prompt_tokens(self) -> int | None:
        """Prompt length in tokens; None without a tokenizer."""
        return None if self.token_ids is None else len(self.token_ids)

    @property
    def n_options(self) -> tuple[int, ...]:
        """Number of options per position."""
        return tuple(q.n_options for q in self.questions)

    @property
    def answer_key(self) -> tuple[int, ...]:
        """Gold option (0-based, as shown) per position."""
        return tuple(q.gold for q in self.questions)


def option_labels(n: int) -> tuple[str, ...]:
    """The labels of `n` options as the prompt shows them: ("1", "2", ...)."""
    return tuple(str(i) for i in range(1, n + 1))


def options_phrase(n: int) -> str:
    """The labels as the instructions list them: `1, 2, 3, or 4`; `1 or 2`; `1`."""
    labels = option_labels(n)
    if len(labels) <= 2:
        return " or ".join(labels)
    return ", ".join(labels[:-1]) + ", or " + labels[-1]


def uses_chat_template(choice: ChatTemplateUse, *, tokenizer: Tokenizer | None) -> bool:
    """Whether to wrap the prompt in the model's chat template; `on` without one is the user's to fix."""
    has_template = tokenizer is not None and tokenizer.has_chat_template()
    if choice is ChatTemplateUse.on and not has_template:
        raise PosbiasError("the model has no chat template; set chat_template to auto or off")
    return choice is not ChatTemplateUse.off and has_template


def render(
    trial: Trial,
    *,
    questions: Mapping[str, Question],
    template: PromptTemplate,
    chat_template: ChatTemplateUse,
    tokenizer: Tokenizer | None,
) -> RenderedPrompt:
    """Render `trial` with `template`, locating every question block in characters and (with a tokenizer)
    in tokens.

    With a chat template the prompt is one user turn (Gemma has no system role) and is encoded without
    special tokens, since the template already carries BOS; without one the tokenizer adds them.
    """
    shown: list[tuple[Question, tuple[int, ...]]] = []
    for position, qid in enumerate(trial.question_ids, start=1):
        question = questions[qid]
        order = (
            trial.choice_orders[position - 1]
            if trial.choice_orders is not None
            else tuple(range(len(question.choices)))
        )
        if sorted(order) != list(range(len(question.choices))):
            raise ValueError(f"trial {trial.index}: option order {order} does not permute question {qid}")
        shown.append((question, order))

    most_options = max((len(order) for _, order in shown), default=0)
    head = template.instructions.replace("{options}", options_phrase(most_options))
    parts = [head]
    spans: list[tuple[int, int]] = []
    offset = len(head)
    for position, (question, order) in enumerate(shown, start=1):
        block = question_block(template, position=position, question=question, order=order)
        offset += len(template.separator)
        spans.append((offset, offset + len(block)))
        offset += len(block)
        parts.append(block)
    parts.append(template.answer_intro)
    user_text = template.separator.join(parts)

    use_template = uses_chat_template(chat_template, tokenizer=tokenizer)
    text = user_text
    shift = 0
    if use_template:
        assert tokenizer is not None
        text = tokenizer.apply_chat_template(user_text)
        shift = text.find(user_text)
        if shift < 0:
            raise PosbiasError(
                "the model's chat template rewrites the prompt text, so questions cannot be located in it; "
                "set chat_template to off"
            )

    token_ids: tuple[int, ...] | None = None
    token_spans: list[tuple[int | None, int | None]] = [(None, None)] * len(spans)
    if tokenizer is not None:
        encoding = tokenizer.encode(text, add_special_tokens=not use_template)
        token_ids = tuple(encoding.ids)
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        starts, ends = offsets[:, 0], offsets[:, 1]
        token_spans = [_token_span(starts, ends, start + shift, end + shift) for start, end in spans]

    rendered = tuple(
        RenderedQuestion(
            position=position,
            question_id=question.id,
            char_start=start + shift,
            char_end=end + shift,
            token_start=token_start,
            token_end=token_end,
            gold=order.index(question.answer),
            n_options=len(order),
        )
        for position, ((question, order), (start, end), (token_start, token_end)) in enumerate(
            zip(shown, spans, token_spans, strict=True), start=1
        )
    )
    return RenderedPrompt(
        user_text=user_text,
        text=text,
        chat_template_used=use_template,
        questions=rendered,
        token_ids=token_ids,
    )


def answer_regex(n_options: Sequence[int]) -> str:
    """A regular expression admitting exactly the answer sheet `1. i`, `2. i`, ... `N. i`, one per line.

    Position k admits options 1..n_options[k-1]. Only literals, character classes, plain groups and `\\n`,
    so vLLM's structured-output backends (xgrammar, guidance, outlines) all accept it.
    """
    lines = [f"{k}\\. {_option_pattern(n)}" for k, n in enumerate(n_options, start=1)]
    return "\\n".join(lines) + "\\n?"


def _option_pattern(n: int) -> str:
    if n < 1:
        raise ValueError(f"a question needs at least one option, got {n}")
    if n <= 9:
        return "1" if n == 1 else f"[1-{n}]"
    # Longest first, so that e.g. `12` is not read as `1` followed by junk.
    return "(" + "|".join(str(i) for i in range(n, 9, -1)) + "|[1-9])"


def question_block(
    template: PromptTemplate, *, position: int, question: Question, order: Sequence[int]
) -> str:
    """One question's text as it appears at `position`, its options in `order`."""
    choice_lines = [
        _fill(_CHOICE_FIELDS, template.choice, {"index": str(shown), "text": question.choices[index]})
        for shown, index in enumerate(order, start=1)
    ]
    values = {"number": str(position), "question": question.question, "choices": "\n".join(choice_lines)}
    return _fill(_QUESTION_FIELDS, template.question, values)


def _fill(fields: re.Pattern[str], template: str, values: Mapping[str, str]) -> str:
    """Substitute placeholders in one pass, so braces inside question text are never read as fields."""
    return fields.sub(lambda match: values[match.group(1)], template)


def _token_span(starts: np.ndarray, ends: np.ndarray, char_start: int, char_end: int) -> tuple[int, int]:
    """First token whose end is past `char_start`; one past the last token that starts before `char_end`.

    A linear scan rather than a binary search: special tokens sit at (0, 0) wherever the tokenizer puts
    them, so the offsets need not be sorted.
    """
    after = np.flatnonzero(ends > char_start)
    before = np.flatnonzero(starts < char_end)
    first = int(after[0]) if after.size else len(ends)
    last = int(before[-1]) + 1 if before.size else 0
    return first, last
