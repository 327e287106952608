"""Asking an OpenAI-compatible endpoint what it can do for a model (`probe`), with a handful of one-token
requests: the chat and completions APIs, log-probabilities, a regular expression or a JSON schema obeyed,
vLLM's `/tokenize` (lined up with the text, and taking token ids back), its chat template. The answer is an
`EndpointCapabilities`; `workers/served_mode.py` turns it and a job into how the job uses the endpoint.
"""

from __future__ import annotations

import re
from typing import Any

from posbias.schemas import EndpointCapabilities, PosbiasError
from posbias.workers.endpoint_answer import has_choice
from posbias.workers.endpoint_session import EndpointError, EndpointSession
from posbias.workers.tokenizer import align_token_strs

PROBE_RETRIES = 2
"""A probe gives up sooner than a job's requests: at submit a user is waiting."""
_PROBE_TEXT = "Héllo wörld 12.\n\n  3. Choices: ✓ 日本 <b>"
"""Text whose tokenization must line up with its characters for `/tokenize` to give offsets: accents,
digits, blank lines, runs of spaces, a character of several bytes, CJK."""
MIN_LOGPROBS = 5
"""The fewest log-probability alternatives asked for (the probe asks for this many)."""
MAX_LOGPROBS = 20
"""The most alternatives ever asked for."""


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
        {"logprobs": True, "top_logprobs": MIN_LOGPROBS} if chat else {"logprobs": MIN_LOGPROBS}
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
        return has_choice(answer), 0, answer
    return has_choice(answer), _alternatives(answer, chat=chat), answer


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
    if answer is None or not has_choice(answer):
        return None
    choice = answer["choices"][0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    return text if isinstance(text, str) else None


def _alternatives(answer: Any, *, chat: bool) -> int:
    if not has_choice(answer):
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
    return min(len(top), MAX_LOGPROBS) if top else 0


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
        token_prompts = has_choice(answer)
    return lined_up and round_trip, isinstance(chat, dict) and "tokens" in chat, token_prompts
