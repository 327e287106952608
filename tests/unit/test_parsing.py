"""The tolerant answer parser: accepted variants, statuses, and properties over arbitrary text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posbias.schemas import ParseStatus
from posbias.workers.parsing import parse_answers


@pytest.mark.parametrize(
    "line",
    [
        "1. 2",
        "1: 2",
        "1) 2",
        "1 - 2",
        "1.2",
        "**1.** 2",
        "**1**. 2",
        "1. **2**",
        "1. (2)",
        "1. [2]",
        "1. Answer: 2",
        "1. The correct answer is 2",
        "1. Option 2",
        "1. 2. Jupiter",
        "1. 2) Jupiter",
        "Question 1: 2",
        "Q1. 2",
        "- 1. 2",
        "* 1. 2",
        "  1 .  2  ",
        "1. 2\r",
    ],
)
def test_accepted_variants(line: str) -> None:
    text = f"Sure! Here are my answers:\n{line}\nHope that helps."
    (answer,) = parse_answers(text, n_options=[4])
    assert answer.status is ParseStatus.ok
    assert answer.predicted == 1
    assert answer.span is not None
    assert text[answer.span[0] : answer.span[1]] == "2"


@pytest.mark.parametrize(
    "line", ["1. I am not sure", "1. B", "1. Jupiter", "1.", "1. Question: What is 2+2?"]
)
def test_a_line_without_an_option_index_is_unparseable(line: str) -> None:
    (answer,) = parse_answers(line, n_options=[4])
    assert answer.status is ParseStatus.unparseable
    assert answer.predicted is None
    assert answer.span is None


def test_missing_line_does_not_shift_later_answers() -> None:
    answers = parse_answers("1. 2\n3. 4\n4. 1", n_options=[4, 4, 4, 4])
    assert [a.status for a in answers] == [
        ParseStatus.ok,
        ParseStatus.missing,
        ParseStatus.ok,
        ParseStatus.ok,
    ]
    assert [a.predicted for a in answers] == [1, None, 3, 0]
    assert [a.position for a in answers] == [1, 2, 3, 4]


def test_out_of_order_lines_are_placed_by_their_numbers() -> None:
    answers = parse_answers("2. 3\n1. 4", n_options=[4, 4])
    assert [a.predicted for a in answers] == [3, 2]


def test_duplicate_keeps_the_first() -> None:
    text = "1. 3\n2. 1\n1. 2"
    first, second = parse_answers(text, n_options=[4, 4])
    assert first.status is ParseStatus.duplicate
    assert first.predicted == 2
    assert first.span == (3, 4)
    assert second.status is ParseStatus.ok


def test_out_of_range_option() -> None:
    text = "1. 5\n2. 3\n3. 0"
    answers = parse_answers(text, n_options=[4, 2, 4])
    assert [a.status for a in answers] == [ParseStatus.out_of_range] * 3
    assert [a.predicted for a in answers] == [None] * 3
    assert answers[0].span is not None
    assert text[answers[0].span[0] : answers[0].span[1]] == "5"


def test_numbers_beyond_the_batch_size_are_ignored() -> None:
    answers = parse_answers("1. 1\n2. 2\n3. 3\n0. 4", n_options=[4, 4])
    assert [a.status for a in answers] == [ParseStatus.ok, ParseStatus.ok]


def test_prose_with_numbers_is_not_an_answer() -> None:
    answers = parse_answers("2 questions were hard.\n1 of them twice.", n_options=[4, 4])
    assert [a.status for a in answers] == [ParseStatus.missing, ParseStatus.missing]


def test_empty_output_is_all_missing() -> None:
    assert [a.status for a in parse_answers("", n_options=[4] * 3)] == [ParseStatus.missing] * 3
    assert parse_answers("1. 2", n_options=[]) == ()


@given(st.text(), st.lists(st.integers(min_value=2, max_value=12), max_size=30))
def test_never_raises_and_gives_one_status_per_position(text: str, n_options: list[int]) -> None:
    answers = parse_answers(text, n_options=n_options)
    assert [a.position for a in answers] == list(range(1, len(n_options) + 1))
    for answer, n in zip(answers, n_options, strict=True):
        assert isinstance(answer.status, ParseStatus)
        if answer.predicted is not None:
            assert 0 <= answer.predicted < n
        if answer.status is ParseStatus.ok:
            assert answer.predicted is not None
        if answer.status in (ParseStatus.missing, ParseStatus.unparseable):
            assert answer.predicted is None


_DECORATIONS = st.sampled_from(
    [
        ("", ". ", ""),
        ("", ": ", ""),
        ("", ") ", ""),
        ("**", ".** ", ""),
        ("", ". Answer: ", ""),
        ("Question ", ": ", ""),
        ("", ". ", ". some option text"),
        ("- ", ". ", ""),
        ("  ", " . ", "  "),
    ]
)


@st.composite
def _answer_sheets(draw: st.DrawFn) -> tuple[str, list[int], list[int | None]]:
    """A sheet with some lines left out, in any order, amid chatter: (text, n_options, expected 1-based)."""
    n_options = draw(st.lists(st.integers(min_value=2, max_value=12), min_size=1, max_size=50))
    answers = [draw(st.integers(min_value=1, max_value=n)) for n in n_options]
    kept = [k for k in range(1, len(n_options) + 1) if draw(st.booleans()) or len(n_options) < 3]
    order = draw(st.permutations(kept))
    lines = ["Here you go:"]
    for k in order:
        before, separator, after = draw(_DECORATIONS)
        lines.append(f"{before}{k}{separator}{answers[k - 1]}{after}")
    lines.append(draw(st.sampled_from(["", "Done.", "Let me know if you need more."])))
    expected: list[int | None] = [a if k in kept else None for k, a in enumerate(answers, start=1)]
    return "\n".join(lines), n_options, expected


@given(_answer_sheets())
def test_well_formed_sheets_round_trip(sheet: tuple[str, list[int], list[int | None]]) -> None:
    text, n_options, expected = sheet
    answers = parse_answers(text, n_options=n_options)
    for answer, want in zip(answers, expected, strict=True):
        if want is None:
            assert answer.status is ParseStatus.missing
            continue
        assert answer.status is ParseStatus.ok
        assert answer.predicted == want - 1
        assert answer.span is not None
        assert text[answer.span[0] : answer.span[1]] == str(want)
