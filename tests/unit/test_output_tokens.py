"""Token offsets primed with the prompt's tail are the offsets primed with the whole prompt (what vLLM's own
detokenizer does), for prompts that end mid-character and outputs that start with a space or a byte of one."""

from __future__ import annotations

import random

import pytest
from support.tinymodels import tiny_model
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer

from posbias.workers import output_tokens

TEXTS = ("Größe? Ünïcödé — 日本語のテキスト 🤖", "1. 2\n2. 3\n3. 4", " leading space", "naïve café", "x" * 40)


def test_offsets_from_the_prompt_tail_match_the_whole_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(
        str(tiny_model(architecture="llama", max_position_embeddings=16384))
    )
    backend = tokenizer.backend_tokenizer
    rng = random.Random(0)
    cases = []
    for _ in range(60):
        prompt = tokenizer.encode(" ".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 120))))
        if rng.random() < 0.4:
            prompt = prompt[:-1]  # may end inside a character
        output = tokenizer.encode(rng.choice(TEXTS) + "\n1. 3\n2. 1", add_special_tokens=False)
        stream = DecodeStream(ids=list(prompt), skip_special_tokens=True)  # the text as vLLM decodes it
        text = "".join(stream.step(backend, token) or "" for token in output)
        cases.append((prompt, output, text))

    tail = [output_tokens.token_offsets(tokenizer, o, text=t, prompt_token_ids=p) for p, o, t in cases]
    monkeypatch.setattr(output_tokens, "_prompt_tail", lambda backend, prompt: list(prompt))
    whole = [output_tokens.token_offsets(tokenizer, o, text=t, prompt_token_ids=p) for p, o, t in cases]

    assert tail == whole
    assert all(
        len(offsets) == len(o) and offsets == sorted(offsets)
        for offsets, (_, o, _) in zip(tail, cases, strict=True)
    )
    assert any(offsets[-1] > 0 for offsets in tail)
