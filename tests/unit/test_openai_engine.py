"""The served-model engine's parts that need no server: the spec's endpoint fields, what a job may do with an
endpoint's capabilities, token offsets from token strings, answers turned into generations, the cost guard's
shares, and how the API key is kept out of messages."""

from __future__ import annotations

import math
from typing import Any

import pytest
from support.tinymodels import _LLAMA_STYLE, _build_tokenizer

from posbias.schemas import (
    AnswerMode,
    EndpointCapabilities,
    EndpointReport,
    JobSpec,
    PosbiasError,
    Question,
    QuestionPool,
)
from posbias.service.work import costs, planner
from posbias.workers.endpoint_answer import answer_schema, generation_from, sheet_from_json
from posbias.workers.endpoint_session import _backoff, _retry_after, scrub
from posbias.workers.parsing import parse_answers
from posbias.workers.served_mode import choose_mode
from posbias.workers.tokenizer import align_token_strs


def served(**engine: Any) -> dict[str, Any]:
    return {"model": "m", "engine": {"name": "openai", "base_url": "http://127.0.0.1:8000/v1", **engine}}


# --- the spec ---------------------------------------------------------------------------------------------


def test_specs_without_an_endpoint_keep_their_hash_and_model_key() -> None:
    # Values computed on main just before the endpoint fields were merged (22f88a8): idempotency keys and
    # schedules depend on them.
    assert JobSpec(model="google/gemma-2-2b-it").spec_hash() == "de5d13a0b14b9753"
    assert JobSpec(model="google/gemma-2-2b-it").model_key() == "b3fc29ccf27def62"
    fake = JobSpec.model_validate(
        {
            "model": "m",
            "engine": {"name": "fake", "tensor_parallel_size": 2, "extra": {"a": 1}},
            "batch_sizes": [1, 5],
        }
    )
    assert (fake.spec_hash(), fake.model_key()) == ("4d832ee5aad8e7f9", "a4e8e91d3e9efcac")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": "m", "engine": {"name": "openai"}}, "engine openai needs base_url"),
        ({"model": "m", "engine": {"base_url": "http://x/v1"}}, "base_url is an option of engine openai"),
        (served(base_url="http://user:secret@x/v1"), "must not carry credentials"),
        (served(base_url="http://x/v1?key=abc"), "must not carry credentials"),
        (served(base_url="ftp://x"), "must be an http(s) URL"),
        (served(tensor_parallel_size=2), "tensor_parallel_size, extra and hf_overrides are vLLM options"),
        (
            served(hf_overrides={"sliding_window": 512}),
            "tensor_parallel_size, extra and hf_overrides are vLLM",
        ),
        (served(max_concurrency=0), "max_concurrency"),
    ],
)
def test_bad_endpoint_fields_are_refused_with_the_fix(data: dict[str, Any], message: str) -> None:
    with pytest.raises(PosbiasError, match="invalid spec: engine") as caught:
        JobSpec.build(data)
    assert message in str(caught.value)


def test_a_served_job_refuses_architecture_variants_and_names_the_way_to_run_them() -> None:
    with pytest.raises(PosbiasError, match="a served model's architecture is its server's") as caught:
        JobSpec.build(served() | {"variants": ["baseline", "global-only"]})
    assert "serve each variant as its own endpoint" in str(caught.value)
    assert JobSpec.build(served() | {"variants": ["baseline"]}).names == ("baseline",)


def test_a_key_pasted_as_api_key_env_is_refused_without_repeating_it() -> None:
    key = "sk-proj-abcdef0123456789abcdef"
    with pytest.raises(PosbiasError) as caught:
        JobSpec.build(served(api_key_env=key))
    assert "not the key itself" in str(caught.value) and "abcdef0123" not in str(caught.value)


def test_a_served_spec_keeps_only_the_fields_it_sets_in_its_identity() -> None:
    spec = JobSpec.model_validate(served(api_key_env="OPENAI_API_KEY", max_job_tokens=1000))
    identity = spec.engine.identity()
    assert identity["base_url"] == "http://127.0.0.1:8000/v1" and identity["max_job_tokens"] == 1000
    assert "requests_per_minute" not in identity
    assert spec.model_key() != JobSpec.model_validate(served(requests_per_minute=60)).model_key()


# --- what a job does with an endpoint ---------------------------------------------------------------------


def capabilities(**fields: Any) -> EndpointCapabilities:
    values: dict[str, Any] = {
        "base_url": "https://api.example.com/v1",
        "served_model": "m",
        "completions": False,
        "chat": True,
    }
    values.update(fields)
    return EndpointCapabilities(**values)


def mode_for(caps: EndpointCapabilities, **fields: Any) -> Any:
    spec = JobSpec.model_validate({**served(**fields.pop("engine", {})), **fields})
    return choose_mode(
        caps,
        options=spec.engine,
        answer_mode=spec.answer_mode,
        chat_template=spec.chat_template,
        tokenizer=spec.tokenizer,
    )


def test_a_vllm_server_gets_token_prompts_regex_and_option_probabilities() -> None:
    vllm = capabilities(
        completions=True,
        completions_logprobs=5,
        chat_logprobs=5,
        regex_field="structured_outputs",
        tokenize=True,
        chat_template=True,
        token_prompts=True,
    )
    mode = mode_for(vllm, answer_mode="constrained")
    assert (mode.api, mode.constraint, mode.option_probs, mode.token_offsets) == (
        "completions",
        "regex",
        True,
        "server",
    )


def test_a_hosted_chat_api_uses_a_json_schema_and_names_no_offsets() -> None:
    hosted = capabilities(chat_logprobs=20, json_schema=True)
    mode = mode_for(hosted, answer_mode="constrained")
    assert (mode.api, mode.constraint, mode.option_probs, mode.token_offsets) == (
        "chat",
        "json_schema",
        True,
        "none",
    )
    assert mode_for(hosted, tokenizer="some/tokenizer").token_offsets == "named"
    assert mode_for(hosted, engine={"option_probs": False}).option_probs is False


@pytest.mark.parametrize(
    ("caps", "fields", "message"),
    [
        (capabilities(), {"answer_mode": "constrained"}, "answer_mode constrained needs structured output"),
        (capabilities(), {"engine": {"option_probs": True}}, "option probabilities need log-probabilities"),
        (capabilities(), {"chat_template": "off"}, "chat_template off needs the completions API"),
        (capabilities(), {"engine": {"api": "completions"}}, "does not answer the completions API"),
        (
            capabilities(chat=False, completions=True),
            {"engine": {"api": "chat"}},
            "does not answer the chat API",
        ),
    ],
)
def test_what_an_endpoint_cannot_do_is_refused_with_the_reason(
    caps: EndpointCapabilities, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(PosbiasError, match=message):
        mode_for(caps, **fields)


# --- token offsets ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A byte-level BPE tokenizer like Llama 3's (the tiny models' own), with a chat template."""
    return _build_tokenizer(_LLAMA_STYLE, vocab_size=512, seed=0)


@pytest.mark.parametrize(
    "text",
    [
        "Read the following.\n\n1. Question: What is 12?\n   Choices:\n   1. a\n\nHere are the answers:",
        "Héllo wörld — ✓ 日本語, 3 spaces   and\ttabs\n\n",
    ],
)
@pytest.mark.parametrize("chat", [False, True])
def test_offsets_from_token_strings_are_hugging_faces(tokenizer: Any, text: str, chat: bool) -> None:
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    encoded = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    strings = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert align_token_strs(text, strings) == [tuple(span) for span in encoded["offset_mapping"]]


def test_sentencepiece_strings_line_up_too() -> None:
    # Gemma / Llama 2 style: `▁` for a space, a leading space the text does not have, raw bytes as <0xNN>.
    strings = ["<bos>", "▁Hello", "▁wor", "ld", "<0x0A>", "<0xE2>", "<0x9C>", "<0x93>"]
    assert align_token_strs("Hello world\n✓", strings) == [
        (0, 0),
        (0, 5),
        (5, 9),
        (9, 11),
        (11, 12),
        (12, 13),
        (12, 13),
        (12, 13),
    ]


def test_strings_that_do_not_spell_the_text_give_no_offsets() -> None:
    assert align_token_strs("Hello", ["Hel", "p"]) is None


# --- answers ----------------------------------------------------------------------------------------------


def test_a_json_answer_object_becomes_the_answer_sheet_with_its_tokens() -> None:
    raw = '{"1": 3, "2":4}'
    pieces = ['{"', "1", '":', " ", "3", ",", ' "', "2", '":', "4", "}"]
    offsets = [raw.index(p, sum(len(x) for x in pieces[:i])) for i, p in enumerate(pieces)]
    sheet, moved = sheet_from_json(raw, offsets)
    assert sheet == "1. 3\n2. 4"
    answers = parse_answers(sheet, n_options=(4, 4))
    assert [a.predicted for a in answers] == [2, 3]
    # The token carrying each answer is found at its digit in the sheet.
    for answer, token in zip(answers, (4, 9), strict=True):
        assert answer.span is not None
        assert max(i for i, o in enumerate(moved) if o <= answer.span[0]) == token
    schema = answer_schema((4, 2))
    assert schema["required"] == ["1", "2"] and schema["properties"]["2"]["enum"] == [1, 2]


def test_a_chat_answer_gives_offsets_from_bytes_and_merged_log_probabilities() -> None:
    answer = {
        "choices": [
            {
                "message": {"content": "1. 2é"},
                "logprobs": {
                    "content": [
                        {"token": t, "bytes": list(t.encode()), "logprob": -0.1, "top_logprobs": top}
                        for t, top in [
                            ("1", []),
                            (".", []),
                            (" ", []),
                            (
                                "2",
                                [
                                    {"token": "2", "logprob": math.log(0.5)},
                                    {"token": " 2", "logprob": math.log(0.25)},
                                    {"token": "3", "logprob": -9999.0},
                                ],
                            ),
                            ("é", []),
                        ]
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 5},
    }
    generation = generation_from(answer, chat=True)
    assert generation.text == "1. 2é" and generation.token_offsets == [0, 1, 2, 3, 4]
    assert generation.top_logprobs is not None
    assert generation.top_logprobs[3] == {"2": pytest.approx(math.log(0.75))}  # `3` was masked
    assert (generation.prompt_tokens, generation.output_tokens) == (40, 5)


# --- the cost guard ---------------------------------------------------------------------------------------


def test_shard_shares_add_up_to_at_most_the_guard() -> None:
    questions = tuple(
        Question(
            id=f"s/q{i:03d}",
            subject="s",
            question="Why? " * (i % 7 + 1),
            choices=("a", "b", "c", "d"),
            answer=0,
        )
        for i in range(40)
    )
    pool = QuestionPool(questions=questions, subjects=("s",), source="test")
    spec = JobSpec.model_validate(
        served(max_job_tokens=50_000) | {"batch_sizes": [1, 5], "iterations": 12, "shard_size": 4}
    )
    plan = planner.plan(spec, pool=pool)
    lengths = {1: [100, 120], 5: [500, 540]}
    bounds = costs.token_bounds(spec, plan, prompt_tokens=lengths)
    assert bounds[1] == math.ceil(12 * (110 + spec.sampling.max_tokens_for(1, answer_mode=AnswerMode.free)))
    report = EndpointReport(
        capabilities=capabilities(),
        mode=mode_for(capabilities()),
        token_bound=sum(bounds.values()),
        token_bounds=bounds,
        share_basis=costs.share_basis(spec, plan),
    )
    shares = [
        costs.shard_budget(
            spec, report, trials=[plan.trials[i] for i in s.trial_indices], questions=plan.questions
        )
        for s in plan.shards
    ]
    assert all(share is not None and share > 0 for share in shares)
    assert 50_000 - len(shares) <= sum(s for s in shares if s is not None) <= 50_000
    # A batch size's shards share its part of the guard as their bounds share the job's.
    by_size = {
        n: sum(
            s
            for s, p in zip(shares, plan.shards, strict=True)
            if plan.trials[p.trial_indices[0]].batch_size == n
        )
        for n in (1, 5)
    }
    assert by_size[5] / by_size[1] == pytest.approx(bounds[5] / bounds[1], rel=0.01)
    unguarded = JobSpec.model_validate(served())
    assert costs.shard_budget(unguarded, report, trials=plan.trials[:2], questions=plan.questions) is None


# --- retries and the key ----------------------------------------------------------------------------------


def test_retry_after_is_read_as_seconds_or_a_date_and_never_undercut() -> None:
    assert _retry_after("3") == 3.0
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert _retry_after("soon") is None and _retry_after(None) is None
    assert _retry_after("86400") == 600.0
    assert all(_backoff(0, retry_after=2.0) >= 2.0 for _ in range(50))
    assert all(_backoff(3, retry_after=None) <= 4.0 for _ in range(50))


def test_the_key_and_its_fragments_are_scrubbed() -> None:
    key = "sk-live-0123456789abcdefXYZ"
    text = f"bad key {key}; did you mean sk-live-0123...XYZ? ({key[4:20]})"
    cleaned = scrub(text, key)
    assert key not in cleaned and key[4:20] not in cleaned and "sk-live-0123" not in cleaned
    assert scrub("nothing to hide", key) == "nothing to hide" and scrub(text, "") == text
