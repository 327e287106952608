"""A tiny random Gemma 3 written as a GGUF file, as llama.cpp writes one (architecture `gemma3`, a
SentencePiece vocabulary with Gemma's special tokens at Gemma's ids), so the GGUF conversion can be tested
on the settings a real file states without a 253 MB download: `tokenizer.ggml.add_bos_token` above all.
Written in well under a second; float32 weights, random, so the model answers noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
"""Gemma's special tokens, at Gemma's ids (`<bos>` is 2)."""
BOS_ID = 2
EOS_ID = 1
_WORDS = ("Read", "the", "questions", "and", "answer", "each", "one", "Question", "Choices", "Answer")
_HIDDEN = 64
_HEAD_DIM = 32
_HEADS = 2
_FEED_FORWARD = 128
_LAYERS = 2


def _vocabulary() -> list[str]:
    """Special tokens, then every character the words and digits need, then the words (each with and
    without Gemma's space mark), so that merges rebuilt from the vocabulary spell each word whole."""
    pieces: list[str] = list(SPECIALS)
    characters = sorted({c for word in _WORDS for c in word} | set("0123456789.:?\n") | {"▁"})
    pieces += [c for c in characters if c not in pieces]
    for word in _WORDS:
        for prefix in range(2, len(word) + 1):  # every prefix, so each merge step makes a known token
            for spelled in (word[:prefix], "▁" + word[:prefix]):
                if spelled not in pieces:
                    pieces.append(spelled)
    return pieces


def write_tiny_gguf(
    path: Path,
    *,
    add_bos_token: bool | None,
    add_eos_token: bool | None = None,
    add_sep_token: bool | None = None,
    chat_template: str | None = None,
    seed: int = 0,
) -> Path:
    """Write a tiny Gemma 3 GGUF file at `path` whose header states the given `add_*_token` flags (None:
    the key is left out, as older writers do) and `chat_template`. Returns `path`."""
    import gguf

    vocabulary = _vocabulary()
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny gemma 3 (posbias tests)")
    writer.add_context_length(2048)
    writer.add_embedding_length(_HIDDEN)
    writer.add_block_count(_LAYERS)
    writer.add_feed_forward_length(_FEED_FORWARD)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(1)
    writer.add_key_length(_HEAD_DIM)
    writer.add_value_length(_HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(512)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocabulary)
    writer.add_token_scores([0.0] * len(vocabulary))
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_token_types([control if piece in SPECIALS else normal for piece in vocabulary])
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    if add_bos_token is not None:
        writer.add_add_bos_token(add_bos_token)
    if add_eos_token is not None:
        writer.add_add_eos_token(add_eos_token)
    if add_sep_token is not None:
        writer.add_add_sep_token(add_sep_token)
    writer.add_add_space_prefix(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    queries, keys = _HEADS * _HEAD_DIM, _HEAD_DIM
    writer.add_tensor("token_embd.weight", weights(len(vocabulary), _HIDDEN))
    writer.add_tensor("output_norm.weight", np.zeros(_HIDDEN, dtype=np.float32))
    for layer in range(_LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_q.weight", weights(queries, _HIDDEN))
        writer.add_tensor(f"{block}.attn_k.weight", weights(keys, _HIDDEN))
        writer.add_tensor(f"{block}.attn_v.weight", weights(keys, _HIDDEN))
        writer.add_tensor(f"{block}.attn_output.weight", weights(_HIDDEN, queries))
        for norm, size in (
            ("attn_norm", _HIDDEN),
            ("attn_q_norm", _HEAD_DIM),
            ("attn_k_norm", _HEAD_DIM),
            ("post_attention_norm", _HIDDEN),
            ("ffn_norm", _HIDDEN),
            ("post_ffw_norm", _HIDDEN),
        ):
            writer.add_tensor(f"{block}.{norm}.weight", np.zeros(size, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(_FEED_FORWARD, _HIDDEN))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(_FEED_FORWARD, _HIDDEN))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(_HIDDEN, _FEED_FORWARD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
