"""Tokenizers behind the `Tokenizer` interface, and the estimate of a prompt's tokens without one.

`HfTokenizer` wraps a Hugging Face fast tokenizer (the one vLLM loaded, or one named by a job);
`RemoteTokenizer` is a served model's own, through vLLM's `/tokenize` and `/detokenize`, its token offsets
found by lining its token strings up with the text (`align_token_strs`). `job_tokenizer` picks the one a
served job renders its prompts with; `estimated_prompt_tokens` counts a prompt when there is none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posbias.schemas import EndpointCapabilities, PosbiasError, TokenSource, one_line
from posbias.workers.engine import Encoding, Tokenizer
from posbias.workers.served_mode import token_source

if TYPE_CHECKING:
    from posbias.workers.endpoint_session import EndpointSession

CHARS_PER_TOKEN = 4
"""Without a tokenizer, a prompt's tokens are estimated at this many characters a token (English text)."""
PROMPT_OVERHEAD_TOKENS = 16
"""Added to such an estimate for what a chat template wraps around the prompt."""
_SENTINEL = "POSBIAS_USER_TEXT_7F3A"


def estimated_prompt_tokens(text: str) -> int:
    """Tokens of a prompt whose tokenizer is unknown, estimated (the cost guard's and the dry run's rule)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) + PROMPT_OVERHEAD_TOKENS


class HfTokenizer:
    """The `Tokenizer` interface over a Hugging Face fast tokenizer (the one vLLM loaded, or one named).

    `prompt_bos_id` is the BOS every rendered prompt must begin with exactly once (`prompt_bos_id` below
    says which, at model load); None leaves prompts unchecked (a tokenizer loaded only to count tokens)."""

    def __init__(self, tokenizer: Any, *, prompt_bos_id: int | None = None) -> None:
        self._tokenizer = tokenizer
        self._prompt_bos_id = prompt_bos_id

    @property
    def hf(self) -> Any:
        """The wrapped Hugging Face tokenizer."""
        return self._tokenizer

    @property
    def prompt_bos_id(self) -> int | None:
        """The BOS token id every rendered prompt must begin with exactly once; None: not checked."""
        return self._prompt_bos_id

    def has_chat_template(self) -> bool:
        """True when the model defines a chat template."""
        return bool(getattr(self._tokenizer, "chat_template", None))

    def apply_chat_template(self, user_text: str) -> str:
        """`user_text` as the single user turn, followed by the assistant's generation prompt."""
        text = self._tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):
            raise PosbiasError("the model's chat template did not render to text; set chat_template: off")
        return text

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """Token ids of `text` with each token's character span (special tokens added here span nothing)."""
        try:
            encoded = self._tokenizer(
                text, add_special_tokens=add_special_tokens, return_offsets_mapping=True
            )
        except NotImplementedError:  # slow (Python) tokenizers have no offsets
            raise PosbiasError(
                "the model's tokenizer has no fast version, so token offsets are unknown; give a "
                "`tokenizer` with a tokenizer.json"
            ) from None
        ids = [int(i) for i in encoded["input_ids"]]
        offsets = [(int(start), int(end)) for start, end in encoded["offset_mapping"]]
        return Encoding(ids=ids, offsets=offsets)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))


class RemoteTokenizer:
    """The `Tokenizer` interface over vLLM's `/tokenize` and `/detokenize`: the server's own tokenizer and
    chat template, with token offsets from lining its token strings up with the text."""

    def __init__(self, session: EndpointSession, *, model: str, chat_template: bool) -> None:
        self._session = session
        self._model = model
        self._chat_template = chat_template
        self._wrap: tuple[str, str] | None = None
        self._wrap_checked = False

    def has_chat_template(self) -> bool:
        """True when the server renders chat messages."""
        return self._chat_template

    @property
    def prompt_bos_id(self) -> int | None:
        """None: a served model's prompts are not checked for BOS here (the server holds its config)."""
        return None

    def apply_chat_template(self, user_text: str) -> str:
        """`user_text` as the single user turn, followed by the generation prompt, as the server renders it.

        The template is rendered once around a placeholder, checked against a real rendering, then reused:
        rendering every prompt on the server would cost two requests each."""
        if self._wrap is None and not self._wrap_checked:
            self._wrap_checked = True
            wrapped = self._render(_SENTINEL)
            if wrapped.count(_SENTINEL) == 1:
                before, after = wrapped.split(_SENTINEL)
                if self._render(user_text) == before + user_text + after:
                    self._wrap = (before, after)
                    return before + user_text + after
        if self._wrap is not None:
            return self._wrap[0] + user_text + self._wrap[1]
        return self._render(user_text)

    def _render(self, user_text: str) -> str:
        body = {"model": self._model, "messages": [{"role": "user", "content": user_text}]}
        tokens = self._call("/tokenize", {**body, "add_generation_prompt": True})["tokens"]
        return str(self._call("/detokenize", {"model": self._model, "tokens": tokens})["prompt"])

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """Token ids of `text` from the server, with each token's character span."""
        answer = self._call(
            "/tokenize",
            {
                "model": self._model,
                "prompt": text,
                "add_special_tokens": add_special_tokens,
                "return_token_strs": True,
            },
        )
        ids = [int(i) for i in answer["tokens"]]
        spans = align_token_strs(text, answer.get("token_strs") or [])
        if spans is None or len(spans) != len(ids):
            raise PosbiasError(
                f"{self._session.base_url}'s /tokenize tokens do not line up with the prompt, so token "
                "offsets are unknown; name the model's tokenizer in the job's `tokenizer`"
            )
        return Encoding(ids=ids, offsets=spans)

    def _call(self, path: str, body: dict[str, Any]) -> Any:
        return self._session.run(self._session.request(path, body, root=True))


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character to byte (the inverse of its `bytes_to_unicode`)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def align_token_strs(text: str, token_strs: Sequence[str]) -> list[tuple[int, int]] | None:
    """Each token's character span in `text`, from its vocabulary string (`convert_ids_to_tokens`), or None
    when they do not line up.

    Byte-level BPE strings (GPT-2, Llama 3, SmolLM) map character by character to bytes; SentencePiece strings
    (Gemma, Llama 2) spell a space as `▁` and raw bytes as `<0xNN>`, and may start with a space the text does
    not have. A token the text does not spell (a BOS added by the tokenizer) spans nothing, as in Hugging
    Face's offsets. Spans are in characters, a character cut by a token boundary belonging to both tokens.
    """
    decoder = _byte_decoder()
    byte_level = all(c in decoder for s in token_strs for c in s)
    data = text.encode("utf-8")
    byte_spans: list[tuple[int, int]] = []
    position = 0
    for token in token_strs:
        if byte_level:
            piece = bytes(decoder[c] for c in token)
        else:
            match = _BYTE_TOKEN.fullmatch(token)
            piece = bytes([int(match.group(1), 16)]) if match else token.replace("▁", " ").encode("utf-8")
        if piece and data.startswith(piece, position):
            byte_spans.append((position, position + len(piece)))
            position += len(piece)
        elif (
            not byte_level
            and piece.startswith(b" ")
            and len(piece) > 1
            and data.startswith(piece[1:], position)
        ):
            byte_spans.append((position, position + len(piece) - 1))
            position += len(piece) - 1
        else:
            byte_spans.append((position, position))
    if position != len(data):
        return None
    # Byte offset -> character offset: a start inside a character belongs to that character, an end inside
    # one to the character's end.
    starts = [0] * (len(data) + 1)
    ends = [0] * (len(data) + 1)
    byte = 0
    for index, char in enumerate(text):
        width = len(char.encode("utf-8"))
        for k in range(width):
            starts[byte + k] = index
            ends[byte + k + 1] = index + 1
        byte += width
    starts[len(data)] = len(text)
    ends[0] = 0
    return [(starts[a], ends[b] if b > a else starts[a]) for a, b in byte_spans]


def _named_tokenizer(name: str, *, trust_remote_code: bool) -> Tokenizer:
    """The tokenizer a job names (a hub id or a folder), as the `Tokenizer` interface."""
    from transformers import AutoTokenizer

    try:
        folder = Path(name).expanduser()
        source = folder if folder.is_dir() else name
        return HfTokenizer(AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code))
    except Exception as exc:  # transformers raises OSError, ValueError, and more for a bad name
        raise PosbiasError(f"cannot load tokenizer {name}: {one_line(exc)}") from exc


def job_tokenizer(
    capabilities: EndpointCapabilities,
    *,
    session: EndpointSession,
    model: str,
    tokenizer: str | None,
    trust_remote_code: bool = False,
) -> Tokenizer | None:
    """The tokenizer prompts are rendered with: the server's, else the named one, else none. The named one's
    own code runs only with `trust_remote_code` (the job's, on the workers; never at submit)."""
    source = token_source(capabilities, tokenizer=tokenizer)
    if source is TokenSource.server:
        return RemoteTokenizer(session, model=model, chat_template=capabilities.chat_template)
    if source is TokenSource.named:
        assert tokenizer is not None
        return _named_tokenizer(tokenizer, trust_remote_code=trust_remote_code)
    return None
