"""An endpoint's answer, read: a `Generation` from its JSON (completions or chat), the tokens it says the
answer cost, and for endpoints that obey a JSON schema but no regular expression, the answer sheet's schema
and the translation of a JSON sheet back into the `k. i` lines the parser reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from posbias.schemas import one_line
from posbias.workers.endpoint_session import EndpointError
from posbias.workers.engine import Generation
from posbias.workers.output_tokens import byte_offsets, logprobs_by_text, piece_offsets


def answer_schema(n_options: Sequence[int]) -> dict[str, Any]:
    """The JSON schema of an answer sheet: `{"1": i, "2": i, ...}`, position k taking 1..n_options[k-1]."""
    keys = [str(k) for k in range(1, len(n_options) + 1)]
    return {
        "type": "object",
        "properties": {
            key: {"type": "integer", "enum": list(range(1, n + 1))}
            for key, n in zip(keys, n_options, strict=True)
        },
        "required": keys,
        "additionalProperties": False,
    }


_JSON_ANSWER = re.compile(r'"(\d+)"\s*:\s*"?(\d+)')


def sheet_from_json(text: str, offsets: Sequence[int]) -> tuple[str, list[int]]:
    """A JSON answer object turned into the answer sheet `k. i` lines the parser reads, and the output
    tokens' offsets moved along: a token in a value starts at that value in the sheet, any other at the
    next value (so the token that carries an answer is still found at its digit)."""
    lines: list[str] = []
    moves: list[tuple[int, int, int]] = []  # (start in text, end in text, start in sheet)
    length = 0
    for match in _JSON_ANSWER.finditer(text):
        prefix = f"{match.group(1)}. "
        sheet_at = length + len(prefix)
        moves.append((match.start(2), match.end(2), sheet_at))
        line = prefix + match.group(2)
        lines.append(line)
        length += len(line) + 1
    sheet = "\n".join(lines)
    moved = []
    for offset in offsets:
        target = len(sheet)
        for start, end, sheet_at in moves:
            if offset < end:
                target = sheet_at + max(0, offset - start)
                break
        moved.append(target)
    return sheet, moved


def generation_from(answer: Any, *, chat: bool) -> Generation:
    """A `Generation` from an endpoint's JSON answer (completions or chat)."""
    if not has_choice(answer):
        raise EndpointError("the endpoint's answer has no choices")
    choice = answer["choices"][0]
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else None
    token_ids = [int(t) for t in choice.get("token_ids") or []]
    top: list[dict[str, float]] | None = None
    offsets: list[int] = []
    if chat:
        text = str((choice.get("message") or {}).get("content") or "")
        content = logprobs.get("content") if logprobs else None
        if content:
            offsets = byte_offsets(text, [c.get("bytes") or [] for c in content]) or piece_offsets(
                text, [str(c.get("token", "")) for c in content]
            )
            top = [
                logprobs_by_text(
                    [(str(t.get("token", "")), float(t["logprob"])) for t in c.get("top_logprobs") or []]
                )
                for c in content
            ]
    else:
        text = str(choice.get("text") or "")
        if logprobs and logprobs.get("tokens") is not None:
            offsets = piece_offsets(text, [str(t) for t in logprobs["tokens"]])
            top = [
                logprobs_by_text([(k, float(v)) for k, v in (d or {}).items()])
                for d in logprobs.get("top_logprobs") or []
            ]
    return Generation(
        text=text,
        token_ids=token_ids,
        token_offsets=offsets,
        top_logprobs=top,
        prompt_tokens=_int(usage.get("prompt_tokens")),
        output_tokens=_int(usage.get("completion_tokens")),
    )


def unreadable(answer: Any, *, chat: bool) -> str | None:
    """Why `answer` cannot be read as a generation (no `choices`, a choice that is not an object, a
    log-probability that is not a number, ...); None when it can."""
    try:
        generation_from(answer, chat=chat)
    except EndpointError as exc:
        return str(exc)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        return f"the endpoint's answer is malformed ({type(exc).__name__}: {one_line(exc)})"
    return None


def reported_tokens(answer: Any, *, default: int) -> int:
    """Tokens an answer cost as the endpoint reported them (prompt plus output); `default` when it did not."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return default
    spent = (_int(usage.get("prompt_tokens")) or 0) + (_int(usage.get("completion_tokens")) or 0)
    return spent or default


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def has_choice(answer: Any) -> bool:
    """True when `answer` is a JSON answer with at least one choice."""
    return isinstance(answer, dict) and isinstance(answer.get("choices"), list) and bool(answer["choices"])
