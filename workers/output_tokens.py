"""What an engine reports of each output token, put the way a `Generation` holds it: where the token starts
in the text (`token_offsets` from a Hugging Face tokenizer, `piece_offsets` and `byte_offsets` from an
endpoint's token pieces), and its top log-probabilities keyed by text (`logprobs_by_text`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

_CONTEXT_TOKENS = 8
_PRIME_TOKENS = range(4, 24)
"""How long a tail of the prompt primes the streaming detokenizer: the first of these lengths that decodes to
whole characters."""
MASKED = -9000.0
"""A log-probability at or below this was masked by a grammar: vLLM reports -inf in process, and -9999 through
its server (JSON has no -inf)."""


def token_offsets(
    tokenizer: Any, token_ids: Sequence[int], *, text: str, prompt_token_ids: Sequence[int] = ()
) -> list[int]:
    """Character offset in `text` where each of `token_ids` starts, `text` being their detokenization
    after `prompt_token_ids` (special tokens skipped).

    Decoded pieces do not always concatenate to the text (a character split over byte tokens decodes to
    nothing until its last byte; SentencePiece drops a leading space), so offsets come from streaming
    detokenization primed with the prompt, as vLLM's own detokenizer does, falling back to comparing
    decoded prefixes with `text`. A token that adds no visible text (a special token, or the first bytes of
    a character) starts where the next text begins. Offsets never decrease and never exceed `len(text)`.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        offsets = _stream_offsets(backend, token_ids, text=text, prompt_token_ids=prompt_token_ids)
        if offsets is not None:
            return offsets
    return _prefix_offsets(tokenizer, token_ids, text=text, prompt_token_ids=prompt_token_ids)


def _stream_offsets(
    backend: Any, token_ids: Sequence[int], *, text: str, prompt_token_ids: Sequence[int]
) -> list[int] | None:
    from tokenizers.decoders import DecodeStream

    offsets: list[int] = []
    length = 0
    pieces: list[str] = []
    try:
        # Primed with the prompt's tail, so a leading space or a character continued from the prompt
        # decodes as in vLLM's own detokenizer; the tail, because priming with a whole prompt of thousands
        # of tokens decodes all of it (about 1 ms a request, benchmarks/throughput.py). Should the tail
        # ever decode differently, the pieces miss the text and the slow path below decides.
        stream = DecodeStream(ids=_prompt_tail(backend, prompt_token_ids), skip_special_tokens=True)
        for token in token_ids:
            offsets.append(length)
            piece = stream.step(backend, token)
            if piece:
                pieces.append(piece)
                length += len(piece)
    except Exception:  # tokenizers rejects some byte sequences mid-stream; the slow path copes
        return None
    return offsets if "".join(pieces) == text else None


def _prompt_tail(backend: Any, prompt_token_ids: Sequence[int]) -> list[int]:
    """The shortest tail of the prompt, of `_PRIME_TOKENS` tokens, that decodes to whole characters (no
    U+FFFD from a character cut in two), as vLLM's detokenizer chose one before it primed with the whole
    prompt; the whole prompt when none does."""
    ids = list(prompt_token_ids)
    for length in _PRIME_TOKENS:
        if length >= len(ids):
            break
        tail = ids[-length:]
        if "\ufffd" not in backend.decode(tail, skip_special_tokens=True):
            return tail
    return ids


def _prefix_offsets(
    tokenizer: Any, token_ids: Sequence[int], *, text: str, prompt_token_ids: Sequence[int]
) -> list[int]:
    # A few prompt tokens of context, so the first output token decodes with its leading space.
    context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
    context_text = tokenizer.decode(context, skip_special_tokens=True)
    offsets: list[int] = []
    floor = 0
    for i in range(len(token_ids)):
        decoded = tokenizer.decode(context + list(token_ids[:i]), skip_special_tokens=True)
        prefix = decoded[len(context_text) :] if decoded.startswith(context_text) else decoded
        floor = max(floor, min(_common_prefix(prefix, text), len(text)))
        offsets.append(floor)
    return offsets


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def piece_offsets(text: str, pieces: Sequence[str]) -> list[int]:
    """Where each decoded token piece starts in `text`: pieces that spell the text in order sit where they
    match; a piece that adds nothing (or a byte of a character cut in two) starts where the next text does."""
    offsets: list[int] = []
    position = 0
    for piece in pieces:
        found = text.find(piece, position, position + len(piece) + 4) if piece else -1
        if found >= 0:
            offsets.append(found)
            position = found + len(piece)
        else:
            offsets.append(min(position, len(text)))
    return offsets


def byte_offsets(text: str, pieces: Sequence[Sequence[int]]) -> list[int] | None:
    """Offsets from each token's UTF-8 bytes (the chat API's `bytes`); None when they do not spell `text`."""
    data = text.encode("utf-8")
    if b"".join(bytes(p) for p in pieces) != data:
        return None
    offsets = []
    consumed = 0
    for piece in pieces:
        offsets.append(len(data[:consumed].decode("utf-8", errors="ignore")))
        consumed += len(piece)
    return offsets


def logprobs_by_text(candidates: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Log-probabilities keyed by stripped token text, spellings of one text (`2`, ` 2`) added up, masked ones
    (and NaN) dropped."""
    merged: dict[str, float] = {}
    for token, logprob in candidates:
        if math.isnan(logprob) or math.isinf(logprob) or logprob <= MASKED:
            continue
        key = token.strip()
        if key in merged:
            high, low = max(merged[key], logprob), min(merged[key], logprob)
            merged[key] = high + math.log1p(math.exp(low - high))
        else:
            merged[key] = logprob
    return merged
