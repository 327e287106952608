"""Checks shared by the design tests on the fake engine and on vLLM: a stored trial against its prompt,
rendered again, position by position."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from posbias.schemas import JobSpec, ParseStatus
from posbias.workers.engine import Tokenizer
from posbias.workers.filler import BUILTIN_TEXT
from posbias.workers.prompts import answer_regex, render


class Window(NamedTuple):
    """The model's sliding window as a test expects the results to see it."""

    tokens: int
    layers: int
    sliding_layers: int


def check_trial(
    name: str,
    spec: JobSpec,
    trial: Any,
    row: Any,
    results: dict[tuple[int, int], Any],
    questions: dict[str, Any],
    *,
    tokenizer: Tokenizer,
    window: Window,
) -> None:
    """Check one stored trial of job spec `spec` against its prompt as rendered again with `tokenizer` (the
    one the worker used): the design as the prompt states it and as stored, the filler's span, text and
    place, and each position's stored token span, answer slot, distance and window fields; a constrained
    output matches the design's pattern. `results` maps (trial row id, position) to result rows."""
    prompt = render(
        trial,
        questions=questions,
        template=spec.prompt,
        chat_template=spec.chat_template,
        tokenizer=tokenizer,
        filler=spec.filler,
        seed=spec.seed,
    )
    assert row.prompt_tokens == prompt.prompt_tokens, name
    encoding = tokenizer.encode(prompt.text, add_special_tokens=False)
    offsets = encoding.offsets

    def span_text(start: int, end: int) -> str:
        return prompt.text[offsets[start][0] : offsets[end - 1][1]]

    # The design as stored, and as the prompt says it.
    paragraphs = prompt.user_text.split("\n\n")
    if trial.probe is not None:
        assert (
            row.probe_position == trial.probe
            and paragraphs[-1] == f"Answer question {trial.probe} only, on one line:"
        )
    elif trial.answer_order is not None:
        assert row.answer_order == list(trial.answer_order)
        assert (
            paragraphs[1] == f"Answer the questions in this order: {', '.join(map(str, trial.answer_order))}."
        )
    else:
        assert row.answer_order is None and "in this order" not in prompt.user_text
    assert row.filler_tokens == trial.filler_tokens
    if trial.filler_tokens:
        # The filler the model saw: exactly the asked length in its tokens, where the design puts it.
        assert (row.filler_token_start, row.filler_token_end) == prompt.filler_tokens
        assert row.filler_token_end - row.filler_token_start == trial.filler_tokens
        shown = " ".join(span_text(row.filler_token_start, row.filler_token_end).split())
        assert shown in " ".join((BUILTIN_TEXT + " " + BUILTIN_TEXT).split())
        before = prompt.text[: offsets[row.filler_token_start][0]]
        where = spec.filler.where.value  # type: ignore[union-attr]
        if where == "before":
            assert "1. Question:" not in before
        elif where == "after":
            assert f"{spec.filler.position}. Question:" in before  # type: ignore[union-attr]
            assert f"{spec.filler.position + 1}. Question:" not in before  # type: ignore[union-attr]
        else:
            assert f"{trial.batch_size}. Question:" in before
    else:
        assert row.filler_token_start is None and row.filler_token_end is None

    # The answers: one per position asked, each on the line the output has it, the constrained output the
    # design's pattern.
    output = row.output_text or ""
    if spec.answer_mode.value == "constrained":
        assert re.fullmatch(answer_regex(prompt.n_options, asked=prompt.asked), output), (name, output)
    lines = [int(line.split(".")[0]) for line in output.splitlines() if re.match(r"\d+\.", line)]
    asked = set(prompt.asked)
    for position in range(1, trial.batch_size + 1):
        result = results.get((row.id, position))
        if position not in asked:
            assert result is None, (name, position)
            continue
        assert result is not None, (name, position)
        placed = prompt.questions[position - 1]
        # The stored token span is the question's block in the prompt, position by position.
        assert (result.question_token_start, result.question_token_end) == (
            placed.token_start,
            placed.token_end,
        )
        block = span_text(result.question_token_start, result.question_token_end).lstrip()
        assert block.startswith(
            f"{position}. Question: {questions[trial.question_ids[position - 1]].question}"
        )
        if result.parse_status is ParseStatus.missing:
            assert result.answer_slot is None and position not in lines
            continue
        assert result.answer_slot == lines.index(position) + 1
        assert (
            result.token_distance == row.prompt_tokens - result.question_token_end + result.answer_token_index
        )
        assert result.in_window == (result.token_distance < window.tokens)
        assert result.visible_layers == (
            window.layers if result.in_window else window.layers - window.sliding_layers
        )
