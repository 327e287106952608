"""VllmEngine on the real vLLM CPU build, with tiny random Llama and Gemma 2 models."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from engine_helpers import (
    GEMMA2_MAX_MODEL_LEN,
    GEMMA2_WINDOW,
    TINY_CONTEXT,
    answer_sheet_regex,
    answer_slots,
    chat_prompt,
    quiz_prompt,
)

from posbias.schemas import EngineOptions, JobSpec, PosbiasError, WorkerConfig
from posbias.workers.engine import Generation, GenerationRequest
from posbias.workers.loader import load_engine
from posbias.workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm

OPTIONS = ("1", "2", "3", "4")


def _check_offsets(generation: Generation) -> None:
    offsets = generation.token_offsets
    assert len(offsets) == len(generation.token_ids)
    assert offsets == sorted(offsets), "token offsets go backwards"
    assert all(0 <= offset <= len(generation.text) for offset in offsets)


def test_constrained_answers_follow_the_format_with_option_probabilities(tiny_engine: VllmEngine) -> None:
    n = 10
    prompts = [chat_prompt(tiny_engine.tokenizer, quiz_prompt(n, seed=seed)) for seed in range(3)]
    regex = answer_sheet_regex([4] * n)
    # Far longer than Gemma 2's window, so its sliding layers really slide.
    assert min(len(p.ids) for p in prompts) > 4 * GEMMA2_WINDOW

    generations = tiny_engine.generate(
        [GenerationRequest(p.ids, max_tokens=8 * n + 8, regex=regex, option_labels=OPTIONS) for p in prompts],
        temperature=0.0,
        top_p=1.0,
        seed=None,
    )

    assert len(generations) == len(prompts)
    for generation in generations:
        assert re.fullmatch(regex, generation.text), generation.text
        _check_offsets(generation)
        assert generation.top_logprobs is not None
        assert len(generation.top_logprobs) == len(generation.token_ids)
        for slot in answer_slots(generation.text, n):
            token = generation.token_offsets.index(slot)
            chosen = generation.text[slot]
            candidates = generation.top_logprobs[token]
            # The grammar allows only the option digits here, and the probabilities are renormalised.
            assert set(candidates) <= set(OPTIONS)
            assert math.fsum(math.exp(lp) for lp in candidates.values()) == pytest.approx(1.0, abs=1e-3)
            # Greedy decoding picks the most likely option.
            assert candidates[chosen] == max(candidates.values())


def test_free_generation_returns_text_and_reproduces_with_a_seed(tiny_engine: VllmEngine) -> None:
    prompt = chat_prompt(tiny_engine.tokenizer, quiz_prompt(3))
    requests = [GenerationRequest(prompt.ids, max_tokens=24, regex=None, option_labels=())] * 2

    first = tiny_engine.generate(requests, temperature=0.8, top_p=0.95, seed=7)
    again = tiny_engine.generate(requests, temperature=0.8, top_p=0.95, seed=7)

    for generation in first:
        assert 1 <= len(generation.token_ids) <= 24
        assert generation.top_logprobs is None  # no options asked for, none computed
        _check_offsets(generation)
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
    assert [g.text for g in again] == [g.text for g in first]
    # Requests of one call draw different randomness (seed + i), so identical prompts diverge.
    assert first[0].token_ids != first[1].token_ids


def test_no_requests_means_no_engine_call(llama_engine: VllmEngine) -> None:
    assert llama_engine.generate([], temperature=0.0, top_p=1.0, seed=None) == []


def test_gemma2_metadata_records_the_alternating_sliding_window(gemma2_engine: VllmEngine) -> None:
    info = gemma2_engine.model_info
    assert info.architecture == "Gemma2ForCausalLM"
    assert info.num_layers == 4
    assert info.sliding_window == GEMMA2_WINDOW
    assert info.sliding_window_layers == (0, 2)
    assert info.rope_theta == 10_000.0
    assert info.context_length == TINY_CONTEXT


def test_llama_metadata_has_no_sliding_window(llama_engine: VllmEngine, tiny_llama_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    info = llama_engine.model_info
    assert info.name == str(tiny_llama_dir)
    assert info.architecture == "LlamaForCausalLM"
    assert info.sliding_window is None
    assert info.sliding_window_layers is None
    assert info.rope_theta == 500_000.0
    assert info.context_length == TINY_CONTEXT
    assert info.num_parameters == AutoModelForCausalLM.from_pretrained(tiny_llama_dir).num_parameters()


def test_engine_info_names_what_ran(tiny_engine: VllmEngine) -> None:
    import vllm

    info = tiny_engine.info
    assert info.name == "vllm"
    assert info.version == vllm.__version__
    assert info.device == "cpu"
    assert info.dtype == "float32"  # `auto` on CPU
    assert info.attention_backend == "CPU_ATTN"
    # Reported by vLLM's worker for each of the 4 layers (sliding or not), not guessed; no FlashAttention.
    assert info.attention_layers == ("CPU_ATTN",) * 4
    assert info.attention_backend_guessed is False and info.flash_attn_version is None
    assert info.max_model_len == tiny_engine.max_model_len


def test_max_model_len_is_the_models_or_the_option(
    llama_engine: VllmEngine, gemma2_engine: VllmEngine
) -> None:
    assert llama_engine.max_model_len == TINY_CONTEXT
    assert gemma2_engine.max_model_len == GEMMA2_MAX_MODEL_LEN


def test_a_prompt_that_fills_max_model_len_still_runs(gemma2_engine: VllmEngine) -> None:
    # run_shard skips a prompt when prompt + max_tokens > max_model_len; right at the limit it must work.
    max_tokens = 4
    filler = gemma2_engine.tokenizer.encode(" the man", add_special_tokens=False).ids
    ids = (filler * GEMMA2_MAX_MODEL_LEN)[: GEMMA2_MAX_MODEL_LEN - max_tokens]

    [generation] = gemma2_engine.generate(
        [GenerationRequest(ids, max_tokens=max_tokens, regex=None, option_labels=())],
        temperature=0.0,
        top_p=1.0,
        seed=None,
    )

    assert 1 <= len(generation.token_ids) <= max_tokens


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_tokenizer_offsets_span_each_tokens_text(tiny_engine: VllmEngine, add_special_tokens: bool) -> None:
    tokenizer = tiny_engine.tokenizer
    text = quiz_prompt(2)
    if not add_special_tokens:
        text = tokenizer.apply_chat_template(text)

    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)

    assert len(encoding.ids) == len(encoding.offsets)
    decode = tiny_engine.tokenizer.decode
    covered = 0
    for token, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
        if start == end:  # a BOS the tokenizer added: no text of its own
            assert add_special_tokens
            continue
        assert start == covered, "a gap or overlap between token spans"
        assert decode([token]) == text[start:end]
        covered = end
    assert covered == len(text)
    if add_special_tokens:
        assert encoding.offsets[0] == (0, 0)  # BOS


def test_chat_template_wraps_one_user_turn(gemma2_engine: VllmEngine, llama_engine: VllmEngine) -> None:
    assert gemma2_engine.tokenizer.has_chat_template()
    assert gemma2_engine.tokenizer.apply_chat_template("Hi?") == (
        "<bos><start_of_turn>user\nHi?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert llama_engine.tokenizer.apply_chat_template("Hi?").endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_load_engine_builds_the_engine_the_spec_names(
    tiny_llama_dir: Path, worker_config: WorkerConfig
) -> None:
    fake = load_engine(JobSpec(model="anything", engine={"name": "fake"}), config=worker_config)
    assert fake.info.name == "fake"

    engine = load_engine(
        JobSpec(model=str(tiny_llama_dir), engine={"max_model_len": 512}), config=worker_config
    )
    assert isinstance(engine, VllmEngine)
    try:
        assert engine.max_model_len == 512
        assert engine.model_info.architecture == "LlamaForCausalLM"
    finally:
        engine.close()


def test_an_engine_closed_while_another_is_open_leaves_the_other_answering(
    llama_engine: VllmEngine, tiny_gemma2_dir: Path, worker_config: WorkerConfig
) -> None:
    # Closing an in-process engine must not end what the engines of a process share: the session's engines
    # stay open around the ones tests load and close.
    prompt = chat_prompt(llama_engine.tokenizer, quiz_prompt(2))
    request = [GenerationRequest(prompt.ids, max_tokens=8, regex=None, option_labels=())]
    before = llama_engine.generate(request, temperature=0.0, top_p=1.0, seed=None)

    other = VllmEngine(str(tiny_gemma2_dir), options=EngineOptions(max_model_len=512), config=worker_config)
    [answer] = other.generate(request, temperature=0.0, top_p=1.0, seed=None)
    assert answer.token_ids
    other.close()

    after = llama_engine.generate(request, temperature=0.0, top_p=1.0, seed=None)
    assert [g.token_ids for g in after] == [g.token_ids for g in before]


def test_a_model_that_fails_to_load_says_why_in_one_line(tmp_path: Path, worker_config: WorkerConfig) -> None:
    # A config.json is there, but nothing else: vLLM's loader fails (on the missing tokenizer).
    (tmp_path / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')

    with pytest.raises(PosbiasError) as caught:
        VllmEngine(str(tmp_path), config=worker_config)

    message = str(caught.value)
    assert message.startswith(f"cannot load model {tmp_path}: ")
    assert "\n" not in message
    assert len(message) > len(f"cannot load model {tmp_path}: ") + 10  # the loader's reason follows
