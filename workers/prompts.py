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
position, in the trial's answer order. Designs change the prompt around the questions, never inside them:
an answer order other than forward adds the paragraph `Answer the questions in this order: 3, 1, 2.` after
the instructions; the probe design has its own instructions and asks for one question at the end
(`Answer question 2 only, on one line:`); filler (`workers/filler.py`) is one more paragraph, before the
first question, after question k, or before the answer request.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from posbias.schemas import (
    ChatTemplateUse,
    FillerPlace,
    FillerSpec,
    JobSpec,
    PosbiasError,
    PromptTemplate,
    Question,
    ShardSpec,
    Trial,
)
from posbias.workers.engine import Tokenizer
from posbias.workers.filler import filler_text

_QUESTION_FIELDS = re.compile(r"\{(number|question|choices)\}")
_CHOICE_FIELDS = re.compile(r"\{(index|text)\}")
_ORDER_FIELDS = re.compile(r"\{(order)\}")
_PROBE_FIELDS = re.compile(r"\{(number)\}")


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
    asked: tuple[int, ...] = ()
    """The positions whose answers the prompt asks for, in the order it asks them."""
    filler_chars: tuple[int, int] | None = None
    """Character span of the filler in `text`; None without filler."""
    filler_tokens: tuple[int, int] | None = None
    """Token span of the filler (start, one past the end); None without filler or tokenizer."""
    token_offsets: Sequence[tuple[int, int]] | None = None
    """Each token's character span in `text` (special tokens the tokenizer added span nothing); None
    without a tokenizer."""

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
    filler: FillerSpec | None = None,
    seed: int = 0,
) -> RenderedPrompt:
    """Render `trial` with `template`, locating every question block (and the filler) in characters and
    (with a tokenizer) in tokens.

    The trial's design shapes the text around the questions: its answer order (stated after the
    instructions unless forward), its probe (the probe design's instructions and request), and its filler
    (`filler` and the job's `seed` pick the text; `trial.filler_tokens` its length). With a chat template
    the prompt is one user turn (Gemma has no system role) and is encoded without special tokens, since the
    template already carries BOS; without one the tokenizer adds them.
    """
    held = trial_filler(trial, filler=filler)
    padding = (
        filler_text(held, trial, seed=seed, tokenizer=tokenizer, separator=template.separator)
        if held is not None
        else ""
    )
    laid = compose(trial, questions=questions, template=template, filler=filler, padding=padding)
    wrapped = wrap(laid.user_text, chat_template=chat_template, tokenizer=tokenizer)
    text, shift, use_template = wrapped.text, wrapped.shift, wrapped.chat_template_used
    spans, filler_span, shown, asked = laid.spans, laid.filler_span, laid.shown, laid.asked

    token_ids: tuple[int, ...] | None = None
    offsets: Sequence[tuple[int, int]] | None = None
    token_spans: list[tuple[int | None, int | None]] = [(None, None)] * len(spans)
    filler_tokens: tuple[int, int] | None = None
    if tokenizer is not None:
        encoding = tokenizer.encode(text, add_special_tokens=not use_template)
        token_ids = tuple(encoding.ids)
        _check_bos(token_ids, bos=tokenizer.prompt_bos_id, chat_template=use_template)
        offsets = encoding.offsets
        locate = _SpanLocator(offsets)
        token_spans = [locate(start + shift, end + shift) for start, end in spans]
        if filler_span is not None:
            filler_tokens = locate(filler_span[0] + shift, filler_span[1] + shift)

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
        user_text=laid.user_text,
        text=text,
        chat_template_used=use_template,
        questions=rendered,
        token_ids=token_ids,
        asked=asked,
        filler_chars=None if filler_span is None else (filler_span[0] + shift, filler_span[1] + shift),
        filler_tokens=filler_tokens,
        token_offsets=offsets,
    )


def _check_bos(ids: Sequence[int], *, bos: int | None, chat_template: bool) -> None:
    """Refuse a prompt that does not begin with the model's BOS exactly once, where the model expects one:
    a missing BOS puts the whole prompt out of distribution, a doubled one shifts every position by one."""
    if bos is None:
        return
    if not ids or ids[0] != bos:
        why = (
            "the model's chat template does not write it; set chat_template to off (the tokenizer adds it to "
            "a plain prompt)"
            if chat_template
            else "the tokenizer did not add it; give a `tokenizer` that adds it"
        )
        raise PosbiasError(f"the rendered prompt does not begin with the model's BOS token (id {bos}): {why}")
    if len(ids) > 1 and ids[1] == bos:
        where = "the chat template writes it and the prompt's text" if chat_template else "the prompt's text"
        raise PosbiasError(
            f"the rendered prompt begins with the model's BOS token (id {bos}) twice: {where} begins with it "
            "again; remove it from the prompt template's head"
        )


def render_trial(
    trial: Trial,
    *,
    spec: JobSpec | ShardSpec,
    questions: Mapping[str, Question],
    tokenizer: Tokenizer | None,
    chat_template: ChatTemplateUse | None = None,
) -> RenderedPrompt:
    """`render` with the prompt settings of a job's or a shard's `spec`: its template, its use of the chat
    template (unless `chat_template` says otherwise), its filler and its seed."""
    return render(
        trial,
        questions=questions,
        template=spec.prompt,
        chat_template=spec.chat_template if chat_template is None else chat_template,
        tokenizer=tokenizer,
        filler=spec.filler,
        seed=spec.seed,
    )


@dataclass(frozen=True)
class Composed:
    """A prompt before any chat template: its paragraphs and where the questions and the filler sit."""

    user_text: str
    """The paragraphs joined by the template's separator."""
    spans: tuple[tuple[int, int], ...]
    """Character span of each question block in `user_text`, by position."""
    filler_span: tuple[int, int] | None
    """Character span of the filler in `user_text`; None without filler."""
    shown: tuple[tuple[Question, tuple[int, ...]], ...]
    """Each position's question and the order its options are shown in."""
    asked: tuple[int, ...]
    """The positions the prompt asks for, in the order it asks them."""


def trial_filler(trial: Trial, *, filler: FillerSpec | None) -> FillerSpec | None:
    """`filler` when `trial`'s prompt holds filler, else None; a trial with filler tokens and no filler spec
    is an error."""
    if trial.filler_tokens and filler is None:
        raise ValueError(f"trial {trial.index} has {trial.filler_tokens} filler tokens but no filler spec")
    return filler if trial.filler_tokens > 0 else None


def compose(
    trial: Trial,
    *,
    questions: Mapping[str, Question],
    template: PromptTemplate,
    filler: FillerSpec | None,
    padding: str,
) -> Composed:
    """The paragraphs of `trial`'s prompt, `padding` being its filler text (empty for none): what `render`
    wraps and tokenizes, and what `workers/prompt_tokens.py` counts from its pieces."""
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
    asked = trial.asked()
    if sorted(set(asked)) != sorted(asked) or not set(asked) <= set(range(1, len(shown) + 1)):
        raise ValueError(f"trial {trial.index}: it asks for positions {asked} of {len(shown)}")

    most_options = max((len(order) for _, order in shown), default=0)
    probe = trial.probe is not None
    head = (template.probe_instructions if probe else template.instructions).replace(
        "{options}", options_phrase(most_options)
    )
    place = filler.where if filler is not None else None
    after = filler.position if filler is not None and filler.position is not None else 0

    parts: list[str] = []
    offset = 0
    filler_span: tuple[int, int] | None = None

    def add(text: str) -> tuple[int, int]:
        nonlocal offset
        if parts:
            offset += len(template.separator)
        span = (offset, offset + len(text))
        parts.append(text)
        offset += len(text)
        return span

    add(head)
    if trial.answer_order is not None:
        order_text = ", ".join(map(str, trial.answer_order))
        add(_fill(_ORDER_FIELDS, template.order_instruction, {"order": order_text}))
    if padding and place is FillerPlace.before:
        filler_span = add(padding)
    spans: list[tuple[int, int]] = []
    for position, (question, order) in enumerate(shown, start=1):
        spans.append(add(question_block(template, position=position, question=question, order=order)))
        if padding and place is FillerPlace.after and position == after:
            filler_span = add(padding)
    if padding and place is FillerPlace.end:
        filler_span = add(padding)
    if probe:
        add(_fill(_PROBE_FIELDS, template.probe_request, {"number": str(trial.probe)}))
    else:
        add(template.answer_intro)
    return Composed(
        user_text=template.separator.join(parts),
        spans=tuple(spans),
        filler_span=filler_span,
        shown=tuple(shown),
        asked=asked,
    )


@dataclass(frozen=True)
class Wrapped:
    """A prompt as sent: the user text in the model's chat template when one is used."""

    text: str
    shift: int
    """Where the user text starts in `text`."""
    chat_template_used: bool


def wrap(user_text: str, *, chat_template: ChatTemplateUse, tokenizer: Tokenizer | None) -> Wrapped:
    """`user_text` as sent: in the model's chat template when `chat_template` and the tokenizer call for
    one. Raises `PosbiasError` when the template rewrites the text, so its questions cannot be found."""
    if not uses_chat_template(chat_template, tokenizer=tokenizer):
        return Wrapped(text=user_text, shift=0, chat_template_used=False)
    assert tokenizer is not None
    text = tokenizer.apply_chat_template(user_text)
    shift = text.find(user_text)
    if shift < 0:
        raise PosbiasError(
            "the model's chat template rewrites the prompt text, so questions cannot be located in it; "
            "set chat_template to off"
        )
    return Wrapped(text=text, shift=shift, chat_template_used=True)


def answer_regex(n_options: Sequence[int], *, asked: Sequence[int] | None = None) -> str:
    """A regular expression admitting exactly the answer sheet: one line `k. i` per position asked, in the
    order asked (`asked`, 1-based positions; default 1..N, i.e. `1. i`, `2. i`, ... `N. i`).

    Position k admits options 1..n_options[k-1]. Only literals, character classes, plain groups and `\\n`,
    so vLLM's structured-output backends (xgrammar, guidance, outlines) all accept it.
    """
    order = list(asked) if asked is not None else list(range(1, len(n_options) + 1))
    lines = [f"{k}\\. {_option_pattern(n_options[k - 1])}" for k in order]
    return "\\n".join(lines) + "\\n?"


def sheet_answer_tokens(asked: Sequence[int], *, tokenizer: Tokenizer) -> dict[int, int]:
    """Per position asked, the index of its option's token in the answer sheet the design asks for (one line
    `k. i` per position, in the order asked): exactly where a constrained answer lands, and where a model
    that follows the format puts it. For estimates before anything is generated (`--dry-run`)."""
    lines = [f"{k}. 1" for k in asked]
    text = "\n".join(lines)
    starts = [start for start, _ in tokenizer.encode(text, add_special_tokens=False).offsets]
    found = {}
    at = 0
    for k, line in zip(asked, lines, strict=True):
        digit = at + len(line) - 1
        found[k] = max(i for i, start in enumerate(starts) if start <= digit)
        at += len(line) + 1
    return found


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


class _SpanLocator:
    """A character span's tokens: the first token whose end is past its start, and one past the last token
    that starts before its end.

    Special tokens sit at (0, 0) wherever the tokenizer puts them, so the offsets need not be sorted; the
    running maximum of the ends and the minimum of the starts from each token on are, and a binary search in
    them finds the same tokens a scan of every token would (in pure Python: no numpy for `posbias trial`)."""

    def __init__(self, offsets: Sequence[tuple[int, int]]) -> None:
        self._max_end = list(itertools.accumulate((int(end) for _, end in offsets), max))
        self._min_start = list(itertools.accumulate((int(start) for start, _ in reversed(offsets)), min))[
            ::-1
        ]

    def __call__(self, char_start: int, char_end: int) -> tuple[int, int]:
        return bisect.bisect_right(self._max_end, char_start), bisect.bisect_left(self._min_start, char_end)
