"""Reading the model's answer sheet: one `k. i` line per position, tolerantly.

A line answers question k when, after optional list or markdown decoration (`-`, `*`, `#`, `>`, `**`)
and an optional word `Question`, `Q` or `Answer`, it starts with the number k followed by one of `.`, `:`,
`)`, `]`, `-` or `=`. Its option is the first number after that, optionally behind `(`, `[`, `*`, `_` or a
phrase such as `Answer:`, `Option`, `The correct answer is`. So all of these read as option 2 for question 1:

    1. 2        1: 2        1) 2        **1.** 2        1. **2**        1. (2)
    1. Answer: 2        1. 2. <option text>        Question 1: 2        - 1 . 2

The explicit question numbers place each answer, so a missing line never shifts the later ones, and answers
in any order (reverse, random, a probe's one line) read the same way; each answer's *slot* is the index of
its line among the answer lines (lines that start with a question number 1..N), whatever order they came
in. Numbers above N (or 0) are ignored. Letters (`1. B`) and option texts (`1. Paris`) are not guessed at:
the prompt asks for option indices, and such a line is reported `unparseable`, so that a model which ignores
the format shows up in the parse rate rather than in its accuracy. One line per question: several answers on
one line (`1. 2 2. 3`) read as the first only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from posbias.schemas import ParseStatus

_NUMBERED_LINE = re.compile(
    r"""
    [ \t>#*_\-]*                              # list and markdown decoration
    (?:(?:question|answer|q)[ \t]*\#?[ \t]*)? # `Question 1:`, `Q1.`, `Answer 1:`
    (?P<number>[0-9]{1,6})
    [ \t*_]*                                  # `**1**.`
    [.:)\]=\-]                                # the separator is required, so `2 apples` is no answer
    [ \t*_]*                                  # `**1.** 2`
    (?P<rest>.*)
    """,
    re.IGNORECASE | re.VERBOSE,
)
_OPTION = re.compile(
    r"""
    [ \t*_(\[]*
    (?:(?:the[ \t]+)?(?:correct[ \t]+)?(?:answer|option|choice|index)(?:[ \t]+is)?[ \t]*[:=\-]?[ \t*_(\[]*)?
    (?P<option>[0-9]{1,6})(?![0-9])
    """,
    re.IGNORECASE | re.VERBOSE,
)


@dataclass(frozen=True)
class ParsedAnswer:
    """What the parser read for one position."""

    position: int
    """1-based position."""
    status: ParseStatus
    predicted: int | None
    """0-based option index as shown; None unless the status is `ok` or `duplicate`."""
    span: tuple[int, int] | None
    """Character span in the text of the option number that was read; None when there is none."""
    slot: int | None = None
    """1-based index of its (first) line among the answer lines; None when no line answers it."""


@dataclass(frozen=True)
class _Line:
    option: int | None
    span: tuple[int, int] | None
    slot: int


def parse_answers(
    text: str, *, n_options: Sequence[int], asked: Sequence[int] | None = None
) -> tuple[ParsedAnswer, ...]:
    """One `ParsedAnswer` per position asked (`asked`; default every position 1..N, N = len(n_options)),
    in that order, read from the model's output `text`. Lines for any question 1..N are answer lines (they
    count towards slots) even when that question was not asked.

    Statuses: `ok`; `missing` (no line for the number); `duplicate` (several lines: the first counts);
    `out_of_range` (an option outside 1..n_options[k-1]); `unparseable` (a line for the number but no option
    index on it). Never raises on any text.
    """
    n = len(n_options)
    found: dict[int, list[_Line]] = {}
    offset = 0
    slot = 0
    for line in text.splitlines(keepends=True):
        match = _NUMBERED_LINE.match(line)
        if match is not None:
            number = int(match.group("number"))
            if 1 <= number <= n:
                slot += 1
                found.setdefault(number, []).append(_read_option(match, offset, slot=slot))
        offset += len(line)

    answers = []
    for position in asked if asked is not None else range(1, n + 1):
        lines = found.get(position)
        if not lines:
            answers.append(ParsedAnswer(position, ParseStatus.missing, None, None))
            continue
        first = lines[0]
        if first.option is None:
            status = _status(lines, ParseStatus.unparseable)
            answers.append(ParsedAnswer(position, status, None, None, first.slot))
        elif not 1 <= first.option <= n_options[position - 1]:
            status = _status(lines, ParseStatus.out_of_range)
            answers.append(ParsedAnswer(position, status, None, first.span, first.slot))
        else:
            status = _status(lines, ParseStatus.ok)
            answers.append(ParsedAnswer(position, status, first.option - 1, first.span, first.slot))
    return tuple(answers)


def _read_option(line: re.Match[str], offset: int, *, slot: int) -> _Line:
    rest_start = line.start("rest")
    option = _OPTION.match(line.group("rest"))
    if option is None:
        return _Line(None, None, slot)
    start = offset + rest_start + option.start("option")
    return _Line(int(option.group("option")), (start, start + len(option.group("option"))), slot)


def _status(lines: list[_Line], single: ParseStatus) -> ParseStatus:
    """`duplicate` trumps the first line's own status: two answers to one question is the louder problem."""
    return ParseStatus.duplicate if len(lines) > 1 else single
