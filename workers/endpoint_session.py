"""Talking to an OpenAI-compatible endpoint: one async HTTP client with its limits and retries.

`EndpointSession` holds an `httpx.AsyncClient` on an event loop of its own, so the synchronous engine
interface (`workers/engine.py`) can run many requests at once: `session.run(coroutine)`. Every request goes
through `request()`, which

- waits for a concurrency slot (requests in flight) and for the request and token rate limits;
- retries 429, 408 and 5xx answers, timeouts, refused or dropped connections, truncated bodies and
  answers the caller cannot read (`accept`), with exponential backoff and jitter, never sooner than a
  `Retry-After` the server sent;
- fails at once on any other 4xx, with the server's message on one line.

`open_session` builds one from a job's engine options. The API key is the one value a worker reads from its
own environment (`api_key`; `api_key_env`, e.g. a Kubernetes Secret in the worker pods): it is never part of a
spec, a Ray argument, a stored row or a message. It lives only in the client's headers (httpx shows them as
`[secure]`); every message built from a server's answer is scrubbed of it before it leaves this module.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from posbias.schemas import EngineOptions, PosbiasError

T = TypeVar("T")

DEFAULT_CONCURRENCY = 8
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 6
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 60.0
RETRY_AFTER_CAP_S = 600.0
"""A `Retry-After` longer than this is taken as this (a server asking for an hour is better failed and
retried by the queue)."""
_RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 522, 524, 529})
_MIN_SCRUBBED = 6
"""Fragments of the key at least this long are scrubbed too (servers echo part of a wrong key)."""


class EndpointError(PosbiasError):
    """The endpoint refused a request, or kept failing it after every retry. The message is one line."""


class MalformedAnswer(EndpointError):
    """The endpoint answered every try, but never with an answer that could be read (e.g. no `choices`):
    the endpoint works, this one request does not, so it costs its trial, not its shard."""


@dataclass(frozen=True)
class Limits:
    """How hard one worker may drive an endpoint."""

    concurrency: int = DEFAULT_CONCURRENCY
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_RETRIES


class RateLimiter:
    """Request and token rate limits, as evenly spaced starts (no bursts).

    Request i starts no sooner than 60 / requests_per_minute seconds after request i - 1, and no sooner than
    the previous request's tokens take to drain at tokens_per_minute; so in any window of W seconds at most
    W x rate + 1 requests start, and at most W x token rate + one request's tokens. Retries are requests.
    """

    def __init__(self, *, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
        self._request_gap = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._token_rate = tokens_per_minute / 60.0 if tokens_per_minute else None
        self._next_request = 0.0
        self._next_tokens = 0.0
        self._turn = asyncio.Lock()
        """One waiter at a time, in call order (asyncio's lock is fair)."""

    async def acquire(self, tokens: int) -> None:
        """Wait until a request of `tokens` tokens may start. Slots are handed out in call order.

        The next slot is counted from when this one actually started, not from when it was due: on a busy
        machine the event loop wakes sleepers late, and slots computed ahead of time would then start
        together, a burst the endpoint sees as over its limit."""
        if self._request_gap == 0.0 and self._token_rate is None:
            return
        async with self._turn:
            wait = max(self._next_request, self._next_tokens) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            started = time.monotonic()
            self._next_request = started + self._request_gap
            if self._token_rate is not None:
                self._next_tokens = started + tokens / self._token_rate


class EndpointSession:
    """An async HTTP client to one endpoint, with its limits; usable from synchronous code via `run`."""

    def __init__(self, base_url: str, *, api_key: str | None, limits: Limits) -> None:
        self.base_url = base_url.rstrip("/")
        # vLLM's /tokenize, /detokenize and /version live at the server's root, beside /v1.
        self.root = re.sub(r"/v1$", "", self.base_url)
        self.limits = limits
        self._secret = api_key or ""
        self._loop = asyncio.new_event_loop()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = self._loop.run_until_complete(self._make_client(headers))
        self._limiter = RateLimiter(
            requests_per_minute=limits.requests_per_minute, tokens_per_minute=limits.tokens_per_minute
        )
        self._slots = asyncio.Semaphore(limits.concurrency)

    async def _make_client(self, headers: dict[str, str]) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.limits.timeout_s, connect=min(30.0, self.limits.timeout_s)),
            limits=httpx.Limits(max_connections=self.limits.concurrency + 2),
            follow_redirects=False,
        )

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run `awaitable` on the session's loop to completion (from synchronous code only)."""
        return self._loop.run_until_complete(awaitable)

    def close(self) -> None:
        """Close the client and its loop."""
        if self._loop.is_closed():
            return
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()

    def scrub(self, text: str) -> str:
        """`text` without the API key or any long fragment of it."""
        return scrub(text, self._secret)

    async def request(
        self,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        tokens: int = 0,
        retries: int | None = None,
        root: bool = False,
        admit: Callable[[], Callable[[], None]] | None = None,
        accept: Callable[[Any], str | None] | None = None,
    ) -> Any:
        """POST `body` (or GET, without one) to `path` under the base URL (`root`: under the server's root)
        and return the decoded JSON, retrying as the module docstring says. `tokens` counts against the
        token rate limit. `admit`, when given, is called as each try is about to be sent (it may raise to
        stop it) and returns what to call once that try is over. `accept`, when given, says why a decoded
        answer cannot be read (None: it can); such an answer is retried like a broken one. Raises
        `MalformedAnswer` when the last try was such an answer, else `EndpointError` (one line, key
        scrubbed) once it gives up."""
        url = (self.root if root else self.base_url) + path
        tries = 1 + (self.limits.max_retries if retries is None else retries)
        reason = ""
        malformed = False
        for attempt in range(tries):
            malformed = False
            await self._limiter.acquire(tokens)
            retry_after: float | None = None
            async with self._slots:
                release = admit() if admit is not None else None
                try:
                    if body is None:
                        response = await self._client.get(url)
                    else:
                        response = await self._client.post(url, json=body)
                except httpx.TimeoutException:
                    reason = f"no answer within {self.limits.timeout_s:g} s"
                except httpx.TransportError as exc:
                    reason = (
                        f"connection failed ({type(exc).__name__}: {exc})" if str(exc) else type(exc).__name__
                    )
                else:
                    status = response.status_code
                    if status < 300:
                        try:
                            answer = response.json()
                        except ValueError:
                            reason = "the answer was not complete JSON (a truncated body)"
                        else:
                            problem = accept(answer) if accept is not None else None
                            if problem is None:
                                return answer
                            reason, malformed = problem, True
                    elif status in _RETRYABLE:
                        reason = f"HTTP {status}: {_server_message(response)}"
                        retry_after = _retry_after(response.headers.get("retry-after"))
                    else:
                        raise EndpointError(
                            self.scrub(f"{path} answered HTTP {status}: {_server_message(response)}")
                        )
                finally:
                    if release is not None:
                        release()
            if attempt + 1 < tries:
                await asyncio.sleep(_backoff(attempt, retry_after=retry_after))
        if malformed:
            raise MalformedAnswer(self.scrub(f"{path} gave no readable answer in {tries} tries: {reason}"))
        raise EndpointError(self.scrub(f"{path} failed after {tries} tries: {reason}"))


def scrub(text: str, secret: str) -> str:
    """`text` with `secret`, and every fragment of it of `_MIN_SCRUBBED` characters or more, masked."""
    if not secret:
        return text
    if secret in text:
        text = text.replace(secret, "***")
    if len(secret) < _MIN_SCRUBBED:
        return text
    for size in range(len(secret) - 1, _MIN_SCRUBBED - 1, -1):
        for start in range(len(secret) - size + 1):
            fragment = secret[start : start + size]
            if fragment in text:
                text = text.replace(fragment, "***")
    return text


def _backoff(attempt: int, *, retry_after: float | None) -> float:
    """Seconds before try `attempt + 2`: exponential with equal jitter, and never less than Retry-After."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0**attempt)
    delay: float = ceiling / 2 + random.uniform(0, ceiling / 2)
    if retry_after is not None:
        # Jitter on top, so the clients a server turned away together do not come back together.
        delay = max(delay, retry_after + random.uniform(0, min(1.0, retry_after / 10)))
    return delay


def _retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date); None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


def _server_message(response: httpx.Response) -> str:
    """The error message an OpenAI-style server put in its body, on one line (or the start of the body)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    message: Any = None
    if isinstance(data, dict):
        error = data.get("error", data)
        message = error.get("message") if isinstance(error, dict) else error
        if message is None and isinstance(data.get("detail"), str):
            message = data["detail"]
    text = str(message) if message is not None else (response.text or response.reason_phrase)
    text = " ".join(text.split())
    return text[:300] + ("..." if len(text) > 300 else "")


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
