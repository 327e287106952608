"""The tiny test models: what vLLM needs of them, and that they are reproducible."""

from __future__ import annotations

from pathlib import Path

from support.tinymodels import build_tiny_model
from transformers import AutoConfig, AutoTokenizer


def test_the_same_seed_builds_the_same_files(tmp_path: Path, tiny_gemma2_dir: Path) -> None:
    again = build_tiny_model(tmp_path / "again", architecture="gemma2")
    other = build_tiny_model(tmp_path / "other", architecture="gemma2", seed=1)

    names = sorted(p.name for p in tiny_gemma2_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (tiny_gemma2_dir / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_digits_are_single_tokens_and_heads_are_vllm_sized(
    tiny_llama_dir: Path, tiny_gemma2_dir: Path
) -> None:
    for folder in (tiny_llama_dir, tiny_gemma2_dir):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for digit in "0123456789":
            assert len(tokenizer.encode(digit, add_special_tokens=False)) == 1
        # An answer line is `k`, `.`, ` `, `i`: the option never merges with the space before it.
        tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode("12. 3", add_special_tokens=False))
        assert tokens == ["1", "2", ".", "Ġ", "3"]
        config = AutoConfig.from_pretrained(folder)
        assert config.head_dim >= 32  # vLLM refuses smaller heads
        assert config.max_position_embeddings >= 4096
