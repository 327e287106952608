"""Architecture facts read from model configs: sliding windows and their layers, RoPE base, context."""

from __future__ import annotations

from types import SimpleNamespace

from transformers import (
    Gemma2Config,
    Gemma3Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

from posbias.workers.models import read_model_info


def test_gemma2_slides_on_every_other_layer() -> None:
    info = read_model_info(Gemma2Config(num_hidden_layers=26), name="google/gemma-2-2b-it")
    assert info.sliding_window == 4096
    assert info.sliding_window_layers == tuple(range(0, 26, 2))
    assert info.rope_theta == 10_000.0
    assert info.context_length == 8192


def test_gemma3_has_five_local_layers_per_global_one_and_the_global_rope_base() -> None:
    config = Gemma3TextConfig(num_hidden_layers=12, sliding_window=1024)
    info = read_model_info(config, name="google/gemma-3-1b-it")
    assert info.sliding_window == 1024
    assert info.sliding_window_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert info.rope_theta == 1_000_000.0  # the full-attention layers', not the local layers' 10k


def test_a_multimodal_config_is_read_through_its_text_config() -> None:
    config = Gemma3Config(text_config={"num_hidden_layers": 6, "sliding_window": 1024})
    config.architectures = ["Gemma3ForConditionalGeneration"]
    info = read_model_info(config, name="google/gemma-3-4b-it")
    assert info.architecture == "Gemma3ForConditionalGeneration"
    assert info.num_layers == 6
    assert info.sliding_window_layers == (0, 1, 2, 3, 4)


def test_mistral_slides_on_every_layer() -> None:
    info = read_model_info(MistralConfig(num_hidden_layers=4, sliding_window=4096), name="mistral")
    assert info.sliding_window == 4096
    assert info.sliding_window_layers == (0, 1, 2, 3)


def test_llama_and_qwen2_have_no_window() -> None:
    llama = read_model_info(
        LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 500_000.0}), name="llama"
    )
    assert (llama.sliding_window, llama.sliding_window_layers) == (None, None)
    assert llama.rope_theta == 500_000.0
    # Qwen 2 configs carry a window size with use_sliding_window false: no layer slides.
    qwen = read_model_info(Qwen2Config(sliding_window=4096, use_sliding_window=False), name="qwen")
    assert (qwen.sliding_window, qwen.sliding_window_layers) == (None, None)


def test_older_configs_fall_back_to_known_patterns() -> None:
    # As written by transformers 4: no layer_types, no rope_parameters.
    gemma2 = SimpleNamespace(
        model_type="gemma2",
        num_hidden_layers=6,
        sliding_window=4096,
        rope_theta=10_000.0,
        max_position_embeddings=8192,
        architectures=["Gemma2ForCausalLM"],
    )
    info = read_model_info(gemma2, name="old-gemma2", revision="abc123")
    assert info.sliding_window_layers == (0, 2, 4)
    assert info.rope_theta == 10_000.0
    assert info.revision == "abc123"
    gemma3 = SimpleNamespace(
        model_type="gemma3_text", num_hidden_layers=12, sliding_window=512, sliding_window_pattern=6
    )
    assert read_model_info(gemma3, name="old-gemma3").sliding_window_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)


def test_parameters_are_not_guessed_without_weights() -> None:
    assert read_model_info(LlamaConfig(), name="llama").num_parameters is None
