"""Prompts, answer formats and constants shared by the engine tests."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from typing import NamedTuple

from posbias.schemas import PromptTemplate
from posbias.workers.engine import Encoding, Tokenizer
from posbias.workers.models import ResolvedModel

TINY_CONTEXT = 4096
"""max_position_embeddings of the tiny models."""
GEMMA2_MAX_MODEL_LEN = 2048
"""The tiny Gemma 2 engine is started with this max_model_len (shorter than the model's)."""
GEMMA2_WINDOW = 64
"""The tiny Gemma 2's sliding window: a 10-question prompt is far longer."""
GEMMA3_WINDOW = 48
"""The tiny Gemma 3's sliding window (layers 0-4 of 6)."""
KV_CACHE_GIB = 1


class Conversion(NamedTuple):
    """The demo model's GGUF file resolved, in the session's fresh cache, before any engine loads it."""

    resolved: ResolvedModel
    weights: os.stat_result
    """The converted weights file as the conversion left it."""


def answer_sheet_regex(n_options: Sequence[int]) -> str:
    """The constrained answer format: one line `k. i` per position, i in 1..n_options[k-1]."""
    return "\\n".join(f"{k}\\. [1-{n}]" for k, n in enumerate(n_options, start=1)) + "\\n?"


def answer_slots(text: str, n_questions: int) -> list[int]:
    """Character offset of each position's option digit in a constrained answer sheet."""
    slots = []
    for k in range(1, n_questions + 1):
        match = re.search(rf"(?m)^{k}\. (\d)", text)
        assert match is not None, f"no answer line for position {k} in {text!r}"
        slots.append(match.start(1))
    return slots


def quiz_prompt(n_questions: int, *, seed: int = 0) -> str:
    """A multiple-choice prompt in posbias's default wording, with made-up questions of four options."""
    rng = random.Random(seed)
    template = PromptTemplate()
    subjects = ["enzymes", "tariffs", "torts", "vectors", "glaciers", "sonnets", "alloys", "synapses"]
    blocks = []
    for k in range(1, n_questions + 1):
        subject = rng.choice(subjects)
        choices = "\n".join(
            f"   {i}. {rng.choice(subjects)} number {rng.randint(1, 99)}" for i in range(1, 5)
        )
        blocks.append(f"{k}. Question: Which statement about {subject} is correct?\n   Choices:\n{choices}")
    instructions = template.instructions.format(options="1, 2, 3, or 4")
    return template.separator.join([instructions, *blocks, template.answer_intro])


def chat_prompt(tokenizer: Tokenizer, user_text: str) -> Encoding:
    """`user_text` in the model's chat template, tokenized as posbias feeds it (template adds BOS)."""
    return tokenizer.encode(tokenizer.apply_chat_template(user_text), add_special_tokens=False)
