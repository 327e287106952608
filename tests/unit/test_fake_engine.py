"""The fake engine and tokenizer: deterministic, following the configured curve, shaped like a real engine."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from posbias.schemas import FakeSpec, ParseStatus
from posbias.workers.engine import Engine, GenerationRequest, Tokenizer
from posbias.workers.fake_engine import CHAT_TEMPLATE, FakeEngine, FakeTokenizer
from posbias.workers.parsing import parse_answers
from posbias.workers.prompts import answer_regex, option_labels


def _request(
    prompt: list[int], key: tuple[int, ...], *, regex: str | None = None, max_tokens: int = 10_000
) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        regex=regex,
        option_labels=option_labels(4),
        answer_key=key,
    )


def _generate(engine: FakeEngine, requests: list[GenerationRequest]) -> list[str]:
    return [g.text for g in engine.generate(requests, temperature=0.0, top_p=1.0, seed=None)]


def test_tokenizer_offsets_cover_the_text() -> None:
    tokenizer: Tokenizer = FakeTokenizer()
    text = "1. Question: What's 2+2?\n   Choices:\n   1. four"
    encoding = tokenizer.encode(text, add_special_tokens=False)
    assert "".join(text[s:e] for s, e in encoding.offsets) == text
    assert [text[s:e] for s, e in encoding.offsets][:6] == ["1", ".", " ", "Question", ":", " "]
    with_bos = tokenizer.encode(text, add_special_tokens=True)
    assert with_bos.ids == [2, *encoding.ids]
    assert with_bos.offsets[0] == (0, 0)


def test_tokenizer_ids_are_stable_and_special_tokens_are_single() -> None:
    tokenizer = FakeTokenizer()
    assert FakeTokenizer.token_id("hello") == 1000 + 907060870 % 1_000_000  # zlib.crc32(b"hello")
    chat = tokenizer.apply_chat_template("Hi")
    assert chat == CHAT_TEMPLATE.format(text="Hi")
    ids = tokenizer.encode(chat, add_special_tokens=False).ids
    assert ids[:2] == [2, 3]
    assert ids.count(4) == 1


def test_engine_interface() -> None:
    engine: Engine = FakeEngine(FakeSpec(), model="my-model", max_model_len=4096)
    assert engine.info.name == "fake"
    assert engine.info.device == "none"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", engine.info.version)
    assert engine.model_info.name == "my-model"
    assert engine.max_model_len == 4096
    assert FakeEngine(FakeSpec()).max_model_len == 1_000_000


def test_same_prompt_same_answer() -> None:
    engine = FakeEngine(FakeSpec(first=0.5, last=0.5), seed=1)
    key = tuple(i % 4 for i in range(30))
    first = _generate(engine, [_request([5, 6, 7], key), _request([5, 6, 8], key)])
    again = _generate(FakeEngine(FakeSpec(first=0.5, last=0.5), seed=1), [_request([5, 6, 7], key)])
    assert first[0] == again[0]
    assert first[0] != first[1]
    assert (
        _generate(FakeEngine(FakeSpec(first=0.5, last=0.5), seed=2), [_request([5, 6, 7], key)])[0]
        != first[0]
    )


def test_answers_follow_the_configured_accuracy() -> None:
    key = tuple(i % 4 for i in range(40))
    always = _generate(FakeEngine(FakeSpec(first=1.0, last=1.0)), [_request([1], key)])[0]
    assert always == "\n".join(f"{k}. {g + 1}" for k, g in enumerate(key, start=1))
    never = _generate(FakeEngine(FakeSpec(first=0.0, last=0.0)), [_request([1], key)])[0]
    parsed = parse_answers(never, n_options=[4] * 40)
    assert all(a.status is ParseStatus.ok and a.predicted != g for a, g in zip(parsed, key, strict=True))

    engine = FakeEngine(FakeSpec(first=0.1, last=0.9))
    texts = _generate(engine, [_request([i], key) for i in range(400)])
    correct = np.array(
        [
            [a.predicted == g for a, g in zip(parse_answers(t, n_options=[4] * 40), key, strict=True)]
            for t in texts
        ]
    )
    assert correct[:, :5].mean() == pytest.approx(0.1 + 0.8 * 2 / 39, abs=0.05)
    assert correct[:, -5:].mean() == pytest.approx(0.9 - 0.8 * 2 / 39, abs=0.05)


def test_malformed_lines_in_free_mode_only() -> None:
    key = tuple(i % 4 for i in range(50))
    engine = FakeEngine(FakeSpec(malformed=0.5))
    free = _generate(engine, [_request([9], key)])[0]
    statuses = [a.status for a in parse_answers(free, n_options=[4] * 50)]
    assert ParseStatus.missing in statuses
    assert ParseStatus.unparseable in statuses
    assert "I am not sure" in free

    regex = answer_regex([4] * 50)
    constrained = _generate(engine, [_request([9], key, regex=regex)])[0]
    assert re.fullmatch(regex, constrained)
    # The malformed draws do not move the other answers.
    free_lines = {line.split(".")[0]: line for line in free.splitlines() if "not sure" not in line}
    assert all(line in constrained.splitlines() for line in free_lines.values())


def test_logprobs_favour_the_written_option_and_track_the_curve() -> None:
    spec = FakeSpec(first=0.2, last=0.8)
    engine = FakeEngine(spec)
    key = tuple(i % 4 for i in range(10))
    generations = engine.generate(
        [_request([i], key) for i in range(300)], temperature=0.0, top_p=1.0, seed=None
    )
    gold_probs = np.zeros((300, 10))
    for row, generation in enumerate(generations):
        assert generation.top_logprobs is not None
        assert len(generation.top_logprobs) == len(generation.token_ids) == len(generation.token_offsets)
        for answer in parse_answers(generation.text, n_options=[4] * 10):
            assert answer.span is not None and answer.predicted is not None
            token = generation.token_offsets.index(answer.span[0])
            probs = {label: math.exp(lp) for label, lp in generation.top_logprobs[token].items()}
            assert sum(probs.values()) == pytest.approx(1.0)
            assert max(probs, key=lambda label: probs[label]) == str(answer.predicted + 1)
            gold_probs[row, answer.position - 1] = probs.get(str(key[answer.position - 1] + 1), 0.0)
    expected = [spec.accuracy(p, 10) for p in range(1, 11)]
    np.testing.assert_allclose(gold_probs.mean(axis=0), expected, atol=0.05)


def test_output_stops_at_max_tokens() -> None:
    engine = FakeEngine(FakeSpec(first=1.0, last=1.0))
    (generation,) = engine.generate(
        [_request([1], (0,) * 10, max_tokens=9)], temperature=0.0, top_p=1.0, seed=None
    )
    assert generation.text == "1. 1\n2. 1"
    assert len(generation.token_ids) == 9


def test_too_long_prompt_is_refused() -> None:
    engine = FakeEngine(FakeSpec(), max_model_len=100)
    with pytest.raises(ValueError, match="exceeds max_model_len by 1 tokens"):
        engine.generate(
            [_request(list(range(91)), (0,), max_tokens=10)], temperature=0.0, top_p=1.0, seed=None
        )


def test_a_mechanism_drops_accuracy_by_position_or_by_answer_slot() -> None:
    """`position_drop` takes accuracy from the first position whatever line answers it, `slot_drop` from the
    first answer line whatever position it answers (the causes diagnose's coverage program simulates)."""
    n = 20
    key = tuple(i % 4 for i in range(n))
    reverse = tuple(range(n, 0, -1))  # line 1 answers position 20: position and slot run opposite ways

    def accuracy_by_position(mechanism: dict[str, float]) -> np.ndarray:
        engine = FakeEngine(FakeSpec.model_validate({"mechanism": {"accuracy": 0.9, **mechanism}}))
        requests = [
            GenerationRequest(
                prompt_token_ids=[i, *range(30 * n)],
                max_tokens=10_000,
                regex=None,
                option_labels=option_labels(4),
                answer_key=key,
                asked=reverse,
                question_token_ends=tuple(30 * (p + 1) for p in range(n)),
            )
            for i in range(400)
        ]
        texts = _generate(engine, requests)
        by_position = [
            {a.position: a.predicted == key[a.position - 1] for a in parse_answers(t, n_options=[4] * n)}
            for t in texts
        ]
        return np.array([[row[p] for p in range(1, n + 1)] for row in by_position]).mean(axis=0)

    position = accuracy_by_position({"position_drop": 0.8})
    assert position[:3].mean() == pytest.approx(0.9 - 0.8 * (1 - 1 / 19), abs=0.06)
    assert position[-3:].mean() == pytest.approx(0.9 - 0.8 * 1 / 19, abs=0.06)
    slot = accuracy_by_position({"slot_drop": 0.8})  # the last positions are answered first
    assert slot[-3:].mean() == pytest.approx(0.9 - 0.8 * (1 - 1 / 19), abs=0.06)
    assert slot[:3].mean() == pytest.approx(0.9 - 0.8 * 1 / 19, abs=0.06)
