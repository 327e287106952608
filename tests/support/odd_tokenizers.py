"""Tokenizers that break what counting a prompt from its pieces assumes, for the tests that check it is
noticed (tests/unit/test_prompt_tokens.py, tests/unit/test_context.py)."""

from __future__ import annotations

from posbias.workers.engine import Encoding


class ChunkTokenizer:
    """Tokens of seven characters counted from the text's start: where a token starts depends on all the
    text before it, so counting from pieces is wrong, and a dry run must notice. It states no reach."""

    prompt_bos_id = None

    def has_chat_template(self) -> bool:
        return False

    def apply_chat_template(self, user_text: str) -> str:
        raise AssertionError("no chat template")

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        offsets = [(i, min(i + 7, len(text))) for i in range(0, len(text), 7)]
        return Encoding(ids=[1000 + i for i in range(len(offsets))], offsets=offsets)
