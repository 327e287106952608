"""Tiny random-weights models that vLLM's CPU build can load: for trying variants and designs without a GPU
(`posbias models build-tiny`), and for the integration tests and benchmarks.

`build_tiny_model` writes a complete Hugging Face model folder (config, safetensors weights, a fast tokenizer
with a chat template) in a few seconds, with no download. The weights are random, so the answers are noise;
what is real is everything around them: the architecture (Gemma 2's alternating sliding window, Gemma 3's
five local layers per global one with a RoPE base per layer kind, Llama's full attention), prompt lengths in
the thousands of tokens, chat templates, constrained decoding and option log-probabilities.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posbias.schemas import PosbiasError, PromptTemplate

Architecture = Literal["llama", "gemma2", "gemma3"]
ARCHITECTURES: tuple[Architecture, ...] = ("llama", "gemma2", "gemma3")
"""The architectures `build_tiny_model` writes."""

# Attention head size 32 is the smallest vLLM accepts.
_HEAD_DIM = 32

_WORD_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her she there been one all we their has would when if so no will what can more out "
    "who about up said some into them only time could these two may first then do any like my now over "
    "such our man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three question answer choice "
    "correct option index number following multiple read format one by law cell energy market history "
    "function value theory court water acid patient economy president war equation force light"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class _ChatStyle:
    bos: str
    eos: str
    pad: str
    unk: str
    turn_tokens: tuple[str, ...]
    """Special tokens of the chat format; the last one ends a turn (a stop token)."""
    template: str


_GEMMA_STYLE = _ChatStyle(
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    unk="<unk>",
    turn_tokens=("<start_of_turn>", "<end_of_turn>"),
    # Gemma's own template: no system role, the assistant is "model".
    template=(
        "{{ bos_token }}{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
        "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
)

_LLAMA_STYLE = _ChatStyle(
    bos="<|begin_of_text|>",
    eos="<|end_of_text|>",
    pad="<|finetune_right_pad_id|>",
    unk="<|reserved_special_token_0|>",
    turn_tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    # Llama 3's template, without the date and tool preamble.
    template=(
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
        "{{ message['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
)


def build_tiny_model(
    folder: str | Path,
    *,
    architecture: Architecture,
    seed: int = 0,
    num_layers: int = 4,
    sliding_window: int = 64,
    max_position_embeddings: int = 4096,
    rope_theta: float | None = None,
    vocab_size: int = 1024,
    head_dim: int = _HEAD_DIM,
) -> Path:
    """Write a tiny random-weights Hugging Face model to `folder` (created; must be empty or absent); raises
    `PosbiasError` for an unknown architecture or a folder that is not empty.

    Hidden size 64, two heads of `head_dim` (32; Gemma 2's real 256 for `scripts/gpu-check.sh`, the size that
    decides its attention backend on GPUs), `num_layers` layers. `gemma2`: a sliding window of
    `sliding_window` tokens on every other layer (layers 0, 2, ...), as in Gemma 2; `gemma3`: five sliding
    layers, then one global (layers 5, 11, ... global), as in Gemma 3, with RoPE base 10000 on the sliding
    layers and `rope_theta` (default 1000000) on the global ones; `llama`: full attention everywhere. RoPE
    base `rope_theta` (default 10000 for Gemma 2, 500000 for Llama, as in the real models). The tokenizer is
    byte-level BPE with every digit a token of its own, so an answer line `k. i` is the tokens `k`, `.`, ` `,
    `i`. The same arguments give the same files, byte for byte.
    """
    if architecture not in ARCHITECTURES:
        raise PosbiasError(f"unknown tiny architecture {architecture!r}; use {', '.join(ARCHITECTURES)}")
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PosbiasError(f"{out} is not an empty folder; give a new folder for the tiny model")

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out.mkdir(parents=True, exist_ok=True)

    style = _LLAMA_STYLE if architecture == "llama" else _GEMMA_STYLE
    tokenizer = _build_tokenizer(style, vocab_size=vocab_size, seed=seed)
    special = {name: tokenizer.convert_tokens_to_ids(name) for name in (style.bos, style.eos, style.pad)}
    end_of_turn = tokenizer.convert_tokens_to_ids(style.turn_tokens[-1])
    eos_ids = [special[style.eos], end_of_turn]

    config = _model_config(
        architecture,
        vocab_size=len(tokenizer),
        num_layers=num_layers,
        sliding_window=sliding_window,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        head_dim=head_dim,
        bos_token_id=special[style.bos],
        eos_token_id=eos_ids,
        pad_token_id=special[style.pad],
    )
    # A private generator, so building a model neither reads nor disturbs the caller's global seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _untyped(AutoModelForCausalLM).from_config(config, dtype=torch.float32)
    model.generation_config = _untyped(GenerationConfig)(
        bos_token_id=special[style.bos], eos_token_id=eos_ids, pad_token_id=special[style.pad]
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _model_config(
    architecture: Architecture,
    *,
    vocab_size: int,
    num_layers: int,
    sliding_window: int,
    max_position_embeddings: int,
    rope_theta: float | None,
    head_dim: int = _HEAD_DIM,
    bos_token_id: int,
    eos_token_id: list[int],
    pad_token_id: int,
) -> Any:
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
    if architecture == "gemma2":
        theta = 10_000.0 if rope_theta is None else rope_theta
        return Gemma2Config(
            **common,
            sliding_window=sliding_window,
            # Gemma 2's pattern, spelled out so the saved config states it.
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
            query_pre_attn_scalar=head_dim,
            rope_parameters={"rope_type": "default", "rope_theta": theta},
            tie_word_embeddings=True,
        )
    if architecture == "gemma3":
        theta = 1_000_000.0 if rope_theta is None else rope_theta
        return Gemma3TextConfig(
            **common,
            sliding_window=sliding_window,
            layer_types=[
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(num_layers)
            ],
            query_pre_attn_scalar=head_dim,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": theta},
            },
            tie_word_embeddings=True,
        )
    if architecture == "llama":
        theta = 500_000.0 if rope_theta is None else rope_theta
        return LlamaConfig(
            **common,
            rope_parameters={"rope_type": "default", "rope_theta": theta},
            tie_word_embeddings=False,
        )
    raise ValueError(f"unknown tiny architecture {architecture!r}; use 'llama', 'gemma2' or 'gemma3'")


def _build_tokenizer(style: _ChatStyle, *, vocab_size: int, seed: int) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [style.pad, style.eos, style.bos, style.unk, *style.turn_tokens]
    tok = Tokenizer(models.BPE())
    # Digits are isolated before byte-level splitting, so "12" is two tokens and " 3" is " " then "3":
    # every option number is exactly one token and constrained answers have a single spelling.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    bos_id = tok.token_to_id(style.bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{style.bos} $A", pair=f"{style.bos} $A $B", special_tokens=[(style.bos, bos_id)]
    )
    return _untyped(PreTrainedTokenizerFast)(
        tokenizer_object=tok,
        bos_token=style.bos,
        eos_token=style.eos,
        pad_token=style.pad,
        unk_token=style.unk,
        additional_special_tokens=list(style.turn_tokens),
        chat_template=style.template,
        model_max_length=1_000_000,
    )


def _corpus(seed: int) -> list[str]:
    """Text shaped like the prompts posbias renders, so common words become single tokens."""
    template = PromptTemplate()
    rng = random.Random(seed)
    lines = [template.instructions, template.answer_intro, json.dumps(template.model_dump())]
    for number in range(1, 200):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 30)))
        lines.append(f"{number}. Question: {words.capitalize()}?\n   Choices:\n   1. {rng.choice(_WORDS)}")
    return lines


def _untyped(thing: Any) -> Any:
    """transformers' factories are untyped; calling them through Any keeps mypy's strict checks quiet."""
    return thing
