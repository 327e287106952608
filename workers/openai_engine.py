"""`OpenAIEngine`: the `Engine` interface on an OpenAI-compatible endpoint (`vllm serve`, SGLang, llama.cpp's
server, a hosted API).

At first use (submit, and again in each worker) `probe` asks the endpoint what it can do, a handful of
one-token requests: the chat and completions APIs, log-probabilities, a regular expression or a JSON schema
obeyed, vLLM's `/tokenize`. `choose_mode` turns that and the job into a `ServedMode`, or refuses the job with
the reason. Against vLLM with `/tokenize`, prompts are rendered with the server's tokenizer and sent as token
ids to `/completions`, so a job answers exactly as the in-process engine does, token offsets included.

The API key is the one value a worker reads from its own environment (`api_key_env`, e.g. a Kubernetes
Secret in the worker pods): it is never part of a spec, a Ray argument, a stored row or a message.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from posbias.schemas import (
    ChatTemplateUse,
    Constraint,
    EndpointApi,
    EndpointCapabilities,
    EngineInfo,
    EngineName,
    EngineOptions,
    JobSpec,
    ModelInfo,
    PosbiasError,
    ServedMode,
    ShardSpec,
    TokenSource,
    WorkerConfig,
    one_line,
)
from posbias.schemas.job import AnswerMode
from posbias.workers.endpoint import (
    DEFAULT_CONCURRENCY,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    EndpointError,
    EndpointSession,
    Limits,
    RequestCache,
)
from posbias.workers.engine import (
    CostGuardError,
    Encoding,
    Generation,
    GenerationRequest,
    TokenBudget,
    Tokenizer,
)

CHARS_PER_TOKEN = 4
"""Without a tokenizer, a prompt's tokens are estimated at this many characters a token (English text)."""
PROMPT_OVERHEAD_TOKENS = 16
"""Added to such an estimate for what a chat template wraps around the prompt."""
PROBE_RETRIES = 2
"""A probe gives up sooner than a job's requests: at submit a user is waiting."""
_PROBE_TEXT = "Héllo wörld 12.\n\n  3. Choices: ✓ 日本 <b>"
"""Text whose tokenization must line up with its characters for `/tokenize` to give offsets: accents,
digits, blank lines, runs of spaces, a character of several bytes, CJK."""
_SENTINEL = "POSBIAS_USER_TEXT_7F3A"
_MIN_LOGPROBS = 5
_MAX_LOGPROBS = 20
_MASKED = -9000.0
"""vLLM reports a log-probability masked by a grammar as -9999 (JSON has no -inf)."""


def api_key(name: str | None) -> str | None:
    """The API key from this process's environment variable `name` (None: no key is sent).

    Raises `PosbiasError` naming the variable (never its value) when it is not set."""
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise PosbiasError(
            f"engine.api_key_env names {name}, which is not set here; export it (on the workers too: in "
            "deploy/, a Kubernetes Secret)"
        )
    return value


def limits_of(options: EngineOptions) -> Limits:
    """The request limits a job's engine options ask for, with their defaults."""
    return Limits(
        concurrency=options.max_concurrency or DEFAULT_CONCURRENCY,
        requests_per_minute=options.requests_per_minute,
        tokens_per_minute=options.tokens_per_minute,
        timeout_s=options.timeout_s or DEFAULT_TIMEOUT_S,
        max_retries=DEFAULT_RETRIES if options.max_retries is None else options.max_retries,
    )


def open_session(options: EngineOptions, *, key: str | None) -> EndpointSession:
    """A session to the endpoint `options` name."""
    if options.base_url is None:
        raise PosbiasError("engine openai needs base_url, e.g. http://127.0.0.1:8000/v1")
    return EndpointSession(options.base_url, api_key=key, limits=limits_of(options))


def estimated_prompt_tokens(text: str) -> int:
    """Tokens of a prompt whose tokenizer is unknown, estimated (the cost guard's and the dry run's rule)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) + PROMPT_OVERHEAD_TOKENS


# --- the probe ---------------------------------------------------------------------------------------------


def probe(session: EndpointSession, *, model: str) -> EndpointCapabilities:
    """Ask the endpoint what it can do for `model`. Raises `PosbiasError` when it cannot be reached, refuses
    the key, does not serve the model, or answers neither API."""
    try:
        return session.run(_probe(session, model=model))
    except EndpointError as exc:
        raise PosbiasError(f"cannot use the endpoint {session.base_url}: {exc}") from None


async def _probe(session: EndpointSession, *, model: str) -> EndpointCapabilities:
    listed = await _try(session, "/models", None)
    max_model_len = None
    if isinstance(listed, dict) and isinstance(listed.get("data"), list):
        entries = {str(m.get("id")): m for m in listed["data"] if isinstance(m, dict)}
        if entries and model not in entries:
            shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
            raise PosbiasError(
                f"{session.base_url} serves {shown}, not {model}: set engine.model to the name it serves"
            )
        if model in entries and isinstance(entries[model].get("max_model_len"), int):
            max_model_len = int(entries[model]["max_model_len"])
    version = await _try(session, "/version", None, root=True)
    server_version = str(version["version"]) if isinstance(version, dict) and "version" in version else None

    completions, completions_logprobs, seen = await _probe_api(session, model=model, chat=False)
    chat, chat_logprobs, seen_chat = await _probe_api(session, model=model, chat=True)
    if not (completions or chat):
        raise PosbiasError(
            f"{session.base_url} answers neither /completions nor /chat/completions for {model}: {seen_chat}"
        )
    answered = seen if completions else seen_chat
    served_model = str(answered.get("model") or model) if isinstance(answered, dict) else model
    fingerprint = answered.get("system_fingerprint") if isinstance(answered, dict) else None
    on_chat = not completions
    regex_field = None
    for field in ("structured_outputs", "guided_regex"):
        constraint = {"regex": "7{3}"} if field == "structured_outputs" else "7{3}"
        text = await _generated(session, model=model, chat=on_chat, extra={field: constraint}, max_tokens=6)
        if text is not None and text.strip() == "777":
            regex_field = field
            break
    json_schema = False
    if regex_field is None:
        schema = {
            "type": "object",
            "properties": {"a": {"type": "string", "enum": ["zq"]}},
            "required": ["a"],
            "additionalProperties": False,
        }
        extra = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "probe", "schema": schema, "strict": True},
            }
        }
        text = await _generated(session, model=model, chat=on_chat, extra=extra, max_tokens=12)
        squeezed = "".join((text or "").split())
        json_schema = len(squeezed) >= 4 and '{"a":"zq"}'.startswith(squeezed)
    tokenize, chat_template, token_prompts = await _probe_tokenizer(
        session, model=model, completions=completions
    )
    return EndpointCapabilities(
        base_url=session.base_url,
        served_model=served_model,
        server_version=server_version or (str(fingerprint) if fingerprint else None),
        max_model_len=max_model_len,
        completions=completions,
        chat=chat,
        completions_logprobs=completions_logprobs,
        chat_logprobs=chat_logprobs,
        regex_field=regex_field,
        json_schema=json_schema,
        tokenize=tokenize,
        chat_template=chat_template,
        token_prompts=token_prompts,
    )


async def _try(
    session: EndpointSession, path: str, body: dict[str, Any] | None, *, root: bool = False
) -> Any | None:
    """The answer, or None when the endpoint refuses this request (a 4xx other than a refused key)."""
    try:
        return await session.request(path, body, retries=PROBE_RETRIES, root=root)
    except EndpointError as exc:
        if re.search(r"HTTP 40[13]\b", str(exc)):
            raise PosbiasError(
                f"{session.base_url} refused the API key ({exc}); check the variable engine.api_key_env names"
            ) from None
        if "answered HTTP" in str(exc):
            return None
        raise


async def _probe_api(session: EndpointSession, *, model: str, chat: bool) -> tuple[bool, int, Any]:
    """Whether one API answers, how many log-probability alternatives it returns, and its answer (or the
    reason it gave none)."""
    path = "/chat/completions" if chat else "/completions"
    body = _probe_body(model, chat=chat, max_tokens=1)
    logprobs: dict[str, Any] = (
        {"logprobs": True, "top_logprobs": _MIN_LOGPROBS} if chat else {"logprobs": _MIN_LOGPROBS}
    )
    try:
        answer = await session.request(path, {**body, **logprobs}, retries=PROBE_RETRIES)
    except EndpointError as exc:
        if "answered HTTP" not in str(exc):
            raise
        if re.search(r"HTTP 40[13]\b", str(exc)):
            raise PosbiasError(
                f"{session.base_url} refused the API key ({exc}); check the variable engine.api_key_env names"
            ) from None
        try:  # some servers answer, only without log-probabilities
            answer = await session.request(path, body, retries=PROBE_RETRIES)
        except EndpointError as again:
            if "answered HTTP" not in str(again):
                raise
            return False, 0, str(again)
        return _has_choice(answer), 0, answer
    return _has_choice(answer), _alternatives(answer, chat=chat), answer


def _probe_body(model: str, *, chat: bool, max_tokens: int) -> dict[str, Any]:
    prompt = "Count: 1, 2, 3,"
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def _generated(
    session: EndpointSession, *, model: str, chat: bool, extra: dict[str, Any], max_tokens: int
) -> str | None:
    path = "/chat/completions" if chat else "/completions"
    answer = await _try(session, path, {**_probe_body(model, chat=chat, max_tokens=max_tokens), **extra})
    if answer is None or not _has_choice(answer):
        return None
    choice = answer["choices"][0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    return text if isinstance(text, str) else None


def _has_choice(answer: Any) -> bool:
    return isinstance(answer, dict) and isinstance(answer.get("choices"), list) and bool(answer["choices"])


def _alternatives(answer: Any, *, chat: bool) -> int:
    if not _has_choice(answer):
        return 0
    logprobs = answer["choices"][0].get("logprobs")
    if not isinstance(logprobs, dict):
        return 0
    if chat:
        content = logprobs.get("content") or []
        top = content[0].get("top_logprobs") if content and isinstance(content[0], dict) else None
    else:
        tops = logprobs.get("top_logprobs") or []
        top = tops[0] if tops else None
    # Asked for 5; a server that caps lower still gives what it can, and that is the most it will give.
    return min(len(top), _MAX_LOGPROBS) if top else 0


async def _probe_tokenizer(
    session: EndpointSession, *, model: str, completions: bool
) -> tuple[bool, bool, bool]:
    """Whether vLLM-style `/tokenize` gives offsets, whether it renders chat messages (the server has a
    chat template), and whether `/completions` takes token ids."""
    plain = await _try(
        session,
        "/tokenize",
        {"model": model, "prompt": _PROBE_TEXT, "add_special_tokens": False, "return_token_strs": True},
        root=True,
    )
    if not (isinstance(plain, dict) and isinstance(plain.get("tokens"), list)):
        return False, False, False
    lined_up = align_token_strs(_PROBE_TEXT, plain.get("token_strs") or []) is not None
    detokenized = await _try(session, "/detokenize", {"model": model, "tokens": plain["tokens"]}, root=True)
    round_trip = isinstance(detokenized, dict) and detokenized.get("prompt") == _PROBE_TEXT
    chat = await _try(
        session, "/tokenize", {"model": model, "messages": [{"role": "user", "content": "Hi"}]}, root=True
    )
    token_prompts = False
    if completions:
        answer = await _try(
            session,
            "/completions",
            {"model": model, "prompt": plain["tokens"], "max_tokens": 1, "temperature": 0.0},
        )
        token_prompts = _has_choice(answer)
    return lined_up and round_trip, isinstance(chat, dict) and "tokens" in chat, token_prompts


# --- what a job does with it -------------------------------------------------------------------------------


def token_source(capabilities: EndpointCapabilities, *, tokenizer: str | None) -> TokenSource:
    """Where token offsets come from: the server's `/tokenize`, else the job's named tokenizer, else none."""
    if capabilities.tokenize:
        return TokenSource.server
    return TokenSource.named if tokenizer is not None else TokenSource.none


def engine_api(
    capabilities: EndpointCapabilities, *, options: EngineOptions, tokens: TokenSource
) -> EndpointApi:
    """The API an engine talks to: the one the options name, or for `auto` completions when prompts can go
    as the server's own token ids (exact, like the in-process engine), else chat, else completions."""
    wanted = options.api or EndpointApi.auto
    if wanted is not EndpointApi.auto:
        return wanted
    if capabilities.completions and tokens is TokenSource.server and capabilities.token_prompts:
        return EndpointApi.completions
    return EndpointApi.chat if capabilities.chat else EndpointApi.completions


def choose_mode(
    capabilities: EndpointCapabilities,
    *,
    options: EngineOptions,
    answer_mode: AnswerMode,
    chat_template: ChatTemplateUse,
    tokenizer: str | None,
) -> ServedMode:
    """How a job uses its endpoint; `PosbiasError` with the reason (and the fix) when it cannot run there."""
    where = capabilities.base_url
    tokens = token_source(capabilities, tokenizer=tokenizer)
    api = engine_api(capabilities, options=options, tokens=tokens)
    if chat_template is ChatTemplateUse.off and api is EndpointApi.chat:
        if not capabilities.completions:
            raise PosbiasError(
                f"chat_template off needs the completions API, which {where} does not answer (its chat API "
                "always applies the model's chat template): set chat_template to auto"
            )
        api = EndpointApi.completions
    if api is EndpointApi.chat and not capabilities.chat:
        raise PosbiasError(f"{where} does not answer the chat API: set engine.api to completions (or auto)")
    if api is EndpointApi.completions and not capabilities.completions:
        raise PosbiasError(f"{where} does not answer the completions API: set engine.api to chat (or auto)")
    constraint = Constraint.none
    if answer_mode is AnswerMode.constrained:
        if capabilities.regex_field is not None:
            constraint = Constraint.regex
        elif capabilities.json_schema:
            constraint = Constraint.json_schema
        else:
            raise PosbiasError(
                f"answer_mode constrained needs structured output (a regular expression, as vLLM's "
                f"structured_outputs, or a JSON schema), and {where} obeyed neither: use answer_mode free"
            )
    alternatives = capabilities.logprobs(api)
    if options.option_probs and alternatives == 0:
        raise PosbiasError(
            f"option probabilities need log-probabilities, which {where} does not return from its {api} API: "
            "set engine.option_probs to false (or leave it unset)"
        )
    use_logprobs = alternatives > 0 and options.option_probs is not False
    return ServedMode(api=api, constraint=constraint, option_probs=use_logprobs, token_offsets=tokens)


# --- tokenizers --------------------------------------------------------------------------------------------


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


def _local_tokenizer(name: str) -> Tokenizer:
    """The tokenizer a job names (a hub id or a folder), as the `Tokenizer` interface."""
    from transformers import AutoTokenizer

    from posbias.workers.vllm_engine import HfTokenizer

    try:
        folder = Path(name).expanduser()
        return HfTokenizer(AutoTokenizer.from_pretrained(folder if folder.is_dir() else name))
    except Exception as exc:  # transformers raises OSError, ValueError, and more for a bad name
        raise PosbiasError(f"cannot load tokenizer {name}: {one_line(exc)}") from exc


def job_tokenizer(
    capabilities: EndpointCapabilities, *, session: EndpointSession, model: str, tokenizer: str | None
) -> Tokenizer | None:
    """The tokenizer prompts are rendered with: the server's, else the named one, else none."""
    source = token_source(capabilities, tokenizer=tokenizer)
    if source is TokenSource.server:
        return RemoteTokenizer(session, model=model, chat_template=capabilities.chat_template)
    if source is TokenSource.named:
        assert tokenizer is not None
        return _local_tokenizer(tokenizer)
    return None


# --- answers -----------------------------------------------------------------------------------------------


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


def _piece_offsets(text: str, pieces: Sequence[str]) -> list[int]:
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


def _byte_offsets(text: str, pieces: Sequence[Sequence[int]]) -> list[int] | None:
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


def _merged(candidates: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Log-probabilities keyed by stripped token text, spellings of one text (`2`, ` 2`) added up, masked
    ones dropped (as the in-process engine does)."""
    merged: dict[str, float] = {}
    for token, logprob in candidates:
        if logprob <= _MASKED or math.isnan(logprob):
            continue
        key = token.strip()
        if key in merged:
            high, low = max(merged[key], logprob), min(merged[key], logprob)
            merged[key] = high + math.log1p(math.exp(low - high))
        else:
            merged[key] = logprob
    return merged


def generation_from(answer: Any, *, chat: bool) -> Generation:
    """A `Generation` from an endpoint's JSON answer (completions or chat)."""
    if not _has_choice(answer):
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
            offsets = _byte_offsets(text, [c.get("bytes") or [] for c in content]) or _piece_offsets(
                text, [str(c.get("token", "")) for c in content]
            )
            top = [
                _merged([(str(t.get("token", "")), float(t["logprob"])) for t in c.get("top_logprobs") or []])
                for c in content
            ]
    else:
        text = str(choice.get("text") or "")
        if logprobs and logprobs.get("tokens") is not None:
            offsets = _piece_offsets(text, [str(t) for t in logprobs["tokens"]])
            top = [
                _merged([(k, float(v)) for k, v in (d or {}).items()])
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


def _usage(answer: Any, *, default: int) -> int:
    """Tokens an answer cost as the endpoint reported them (prompt plus output); `default` when it did not."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return default
    spent = (_int(usage.get("prompt_tokens")) or 0) + (_int(usage.get("completion_tokens")) or 0)
    return spent or default


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


# --- the engine --------------------------------------------------------------------------------------------


class OpenAIEngine:
    """An OpenAI-compatible endpoint answering prompts. Implements `workers.engine.Engine`.

    One per endpoint per worker (a Ray actor holding no GPU): its session's limits are that worker's share of
    the endpoint. Answers are cached under the worker's cache folder, so a shard delivered again (its lease
    expired, its worker died) does not pay for what was already answered.
    """

    def __init__(self, spec: ShardSpec | JobSpec, *, config: WorkerConfig) -> None:
        """Probe the endpoint `spec.engine` names. Raises `PosbiasError` (one line) when the job cannot run
        there."""
        options = spec.engine
        if options.name is not EngineName.openai:
            raise ValueError("OpenAIEngine serves engine openai only")
        self._options = options
        self._served = options.model or spec.model
        self._session = open_session(options, key=api_key(options.api_key_env))
        try:
            self._capabilities = probe(self._session, model=self._served)
            self._tokens = token_source(self._capabilities, tokenizer=spec.tokenizer)
            self._api = engine_api(self._capabilities, options=options, tokens=self._tokens)
            self._mode = choose_mode(
                self._capabilities,
                options=options,
                answer_mode=spec.answer_mode,
                chat_template=spec.chat_template,
                tokenizer=spec.tokenizer,
            )
            self._tokenizer = job_tokenizer(
                self._capabilities, session=self._session, model=self._served, tokenizer=spec.tokenizer
            )
        except BaseException:
            self._session.close()
            raise
        self._cache = RequestCache(Path(config.cache_dir).expanduser() / "openai" / "answers")
        caps = self._capabilities
        self._max_model_len = options.max_model_len or caps.max_model_len or 1 << 40
        self._info = EngineInfo(
            name="openai",
            version=caps.server_version or "unknown",
            dtype="unknown",
            attention_backend=None,
            device="remote",
            served_model=caps.served_model,
            endpoint=caps.base_url,
        )
        self._model_info = _model_info(spec, context_length=caps.max_model_len)

    @property
    def info(self) -> EngineInfo:
        """`openai`, the version the server reports, the model name it answered with, the endpoint."""
        return self._info

    @property
    def model_info(self) -> ModelInfo:
        """The model's facts: read from its config when `model` is a local folder, else its context only."""
        return self._model_info

    @property
    def capabilities(self) -> EndpointCapabilities:
        """What the probe found."""
        return self._capabilities

    @property
    def mode(self) -> ServedMode:
        """How this engine's first job uses the endpoint."""
        return self._mode

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The server's tokenizer, the job's named one, or None (token offsets unknown)."""
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """The endpoint's context length (as configured, or as it reports it; unbounded when unknown)."""
        return self._max_model_len

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """Answer all requests, many at once (the session's concurrency), in order.

        Request i samples with seed `seed + i`, as in the in-process engine. Before anything is sent, each
        shard's requests not in the cache must fit its token budget (else `CostGuardError`); while they
        run, each request reserves its upper bound and settles at what the endpoint reports."""
        if not requests:
            return []
        return self._session.run(self._generate(requests, temperature=temperature, top_p=top_p, seed=seed))

    async def _generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        calls = [
            self._call(r, temperature=temperature, top_p=top_p, seed=None if seed is None else seed + i)
            for i, r in enumerate(requests)
        ]
        cached = [self._cache.get(call.key) for call in calls]
        needs: dict[int, tuple[Any, int]] = {}
        for call, hit in zip(calls, cached, strict=True):
            budget = call.request.budget
            if budget is None:
                continue
            if hit is None:
                held = needs.get(id(budget), (budget, 0))
                needs[id(budget)] = (budget, held[1] + call.bound)
            elif hit.get("paid_by") == budget.label:
                # Paid for by an earlier attempt of this shard: it counts against the same share, so no
                # number of attempts can spend more than the share.
                budget.spent += _usage(hit.get("answer"), default=call.bound)
                budget.bounded += call.bound
                needs.setdefault(id(budget), (budget, 0))
        for budget, need in needs.values():
            if need > budget.left:
                raise CostGuardError(
                    f"cost guard: {budget.label} would spend up to {need:,} tokens, more than its share of "
                    f"the job's engine.max_job_tokens ({budget.left:,} left); nothing was sent"
                )
        outcomes = await asyncio.gather(
            *(self._answer(call, hit) for call, hit in zip(calls, cached, strict=True)),
            return_exceptions=True,
        )
        # Every request has finished (and what came back is cached) before a failure is raised, so a retry
        # of the shard pays only for what is missing.
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [outcome for outcome in outcomes if isinstance(outcome, Generation)]

    def _call(
        self, request: GenerationRequest, *, temperature: float, top_p: float, seed: int | None
    ) -> _Call:
        # A prompt meant to go without a chat template can only go to the completions API: the chat API
        # always applies one (choose_mode refused such jobs where there is no completions API).
        chat = self._api is EndpointApi.chat and not request.chat_template_off
        if not (self._capabilities.chat if chat else self._capabilities.completions):
            api = "chat" if chat else "completions"
            raise EndpointError(f"{self._session.base_url} does not answer the {api} API this prompt needs")
        body: dict[str, Any] = {
            "model": self._served,
            "max_tokens": request.max_tokens,
            "temperature": temperature,
            "top_p": top_p,
        }
        exact = self._tokens is TokenSource.server and bool(request.prompt_token_ids)
        if chat:
            body["messages"] = [{"role": "user", "content": request.user_text}]
        elif exact and self._capabilities.token_prompts:
            body["prompt"] = list(request.prompt_token_ids)
            body["return_token_ids"] = True
        else:
            body["prompt"] = request.prompt_text
        if seed is not None:
            body["seed"] = seed
        alternatives = self._capabilities.logprobs(EndpointApi.chat if chat else EndpointApi.completions)
        if request.option_labels and alternatives and self._options.option_probs is not False:
            wanted = min(max(len(request.option_labels), _MIN_LOGPROBS), max(alternatives, _MIN_LOGPROBS))
            wanted = min(wanted, _MAX_LOGPROBS)
            if chat:
                body["logprobs"] = True
                body["top_logprobs"] = wanted
            else:
                body["logprobs"] = wanted
        json_sheet = False
        if request.regex is not None:
            field = self._capabilities.regex_field
            if field == "structured_outputs":
                body[field] = {"regex": request.regex}
            elif field is not None:
                body[field] = request.regex
            elif self._capabilities.json_schema:
                schema = answer_schema(request.n_options)
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "answer_sheet", "schema": schema, "strict": True},
                }
                json_sheet = True
            else:
                raise EndpointError(f"{self._session.base_url} obeys no constraint; use answer_mode free")
        path = "/chat/completions" if chat else "/completions"
        prompt_tokens = (
            len(request.prompt_token_ids)
            if self._tokens is not TokenSource.none and request.prompt_token_ids
            else estimated_prompt_tokens(request.prompt_text or request.user_text)
        )
        key = RequestCache.key(endpoint=self._session.base_url, path=path, body=body, salt=request.cache_salt)
        return _Call(
            request=request,
            path=path,
            body=body,
            chat=chat,
            json_sheet=json_sheet,
            key=key,
            bound=prompt_tokens + request.max_tokens,
        )

    async def _answer(self, call: _Call, hit: dict[str, Any] | None) -> Generation:
        budget = call.request.budget
        if hit is not None:
            answer = hit.get("answer")
        else:
            admit = None if budget is None else _admission(budget, bound=call.bound)
            answer = await self._session.request(call.path, call.body, tokens=call.bound, admit=admit)
            self._cache.put(call.key, {"answer": answer, "paid_by": None if budget is None else budget.label})
        generation = generation_from(answer, chat=call.chat)
        if budget is not None and hit is None:
            budget.spent += _usage(answer, default=call.bound)
            budget.bounded += call.bound
        if call.json_sheet:
            text, offsets = sheet_from_json(generation.text, generation.token_offsets)
            generation = Generation(
                text=text,
                token_ids=generation.token_ids,
                token_offsets=offsets,
                top_logprobs=generation.top_logprobs,
                prompt_tokens=generation.prompt_tokens,
                output_tokens=generation.output_tokens,
            )
        if not generation.token_offsets and generation.text and self._tokenizer is not None:
            generation = self._offsets_from_tokenizer(generation)
        return generation

    def _offsets_from_tokenizer(self, generation: Generation) -> Generation:
        """Output offsets by tokenizing the output again, when the endpoint gave no per-token pieces."""
        assert self._tokenizer is not None
        try:
            encoding = self._tokenizer.encode(generation.text, add_special_tokens=False)
        except PosbiasError:
            return generation
        return Generation(
            text=generation.text,
            token_ids=generation.token_ids,
            token_offsets=[start for start, _ in encoding.offsets],
            top_logprobs=generation.top_logprobs,
            prompt_tokens=generation.prompt_tokens,
            output_tokens=generation.output_tokens,
        )

    def close(self) -> None:
        """Close the HTTP client (the actor calls this before loading another model)."""
        self._session.close()


def _admission(budget: TokenBudget, *, bound: int) -> Callable[[], Callable[[], None]]:
    """What lets a request through its shard's cost guard: as it is about to be sent (not when it is queued,
    so what answers have already spent counts), it reserves its bound, scaled by how far the endpoint's counts
    have exceeded the bounds so far, or is stopped."""

    def admit() -> Callable[[], None]:
        reserve = budget.scaled(bound)
        if reserve > budget.left:
            raise CostGuardError(
                f"cost guard: {budget.label} has spent {budget.spent:,} tokens and its next prompt needs up "
                f"to {reserve:,}, more than its share of the job's engine.max_job_tokens leaves; not sent"
            )
        budget.reserved += reserve

        def release() -> None:
            budget.reserved -= reserve

        return release

    return admit


class _Call:
    """One request, ready to send: its body, cache key and upper bound in tokens."""

    __slots__ = ("body", "bound", "chat", "json_sheet", "key", "path", "request")

    def __init__(
        self,
        *,
        request: GenerationRequest,
        path: str,
        body: dict[str, Any],
        chat: bool,
        json_sheet: bool,
        key: str,
        bound: int,
    ) -> None:
        self.request = request
        self.path = path
        self.body = body
        self.chat = chat
        self.json_sheet = json_sheet
        self.key = key
        self.bound = bound


def _model_info(spec: ShardSpec | JobSpec, *, context_length: int | None) -> ModelInfo:
    """The model's facts when its config is on this machine (a local folder), else its name and context."""
    from posbias.workers.models import read_model_info

    folder = Path(spec.model).expanduser()
    if (folder / "config.json").is_file():
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(folder)
            return read_model_info(config, name=spec.model, revision=spec.revision, weights_dir=folder)
        except Exception:  # a config transformers cannot read leaves only what the endpoint said
            pass
    return ModelInfo(name=spec.model, revision=spec.revision, context_length=context_length)
