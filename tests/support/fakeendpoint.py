"""A small OpenAI-compatible server for fault injection: threaded, on 127.0.0.1, answering `/v1/completions`
with an answer sheet (`1. 1`, `2. 2`, ...) and misbehaving on cue.

It is no model: what it checks is posbias's side of the wire. Each job prompt (one holding `Question:`)
gets, on its k-th try, whatever `faults(prompt, k)` names (None: a proper answer):

- `429-retry-after`: HTTP 429 with `Retry-After: 1`; `429`: without it; `500`: HTTP 500;
- `truncated`: HTTP 200 whose body stops halfway (the connection closes before Content-Length is reached);
- `slow`: a proper answer, but only once the client has given up waiting (its timeout closed the connection),
  or after `slow_s` seconds: slow by the client's own clock, whatever the machine's load;
- `drop`: the connection closes without an answer;
- `no-choices`: HTTP 200 with a JSON answer that has no `choices` (a proxy's or a broken server's);
- `echo-key`: HTTP 400 whose message quotes the Authorization header it got (as some servers quote a bad key).

Every request is logged (`requests`), with its arrival time, so tests count at the server: answers per
prompt, requests and tokens per second, tokens spent. Usage is reported as the client's own estimate of the
prompt times `usage_factor` (a server that counts more than the client expects), plus the answer's tokens.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "served-fake"
KEY_ENV = "POSBIAS_TEST_ENDPOINT_KEY"
"""The environment variable served tests keep their endpoints' API key in (tests/integration/served)."""
Faults = Callable[[str, int], str | None]


@dataclass(frozen=True)
class Logged:
    """One request as the server saw it."""

    at: float
    """time.monotonic() on arrival."""
    path: str
    prompt: str
    attempt: int
    """1 for the first try of this prompt."""
    status: int
    tokens: int
    """Tokens it was charged (usage reported), 0 when it got no answer."""
    authorization: str | None
    max_tokens: int


@dataclass
class FakeEndpoint:
    """The server's state: what it does and what it saw."""

    faults: Faults = lambda prompt, attempt: None
    key: str | None = None
    """When set, requests without `Authorization: Bearer <key>` get HTTP 401."""
    usage_factor: float = 1.0
    slow_s: float = 3.0
    requests: list[Logged] = field(default_factory=list)
    url: str = ""
    _attempts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answered(self) -> dict[str, int]:
        """Proper answers (HTTP 200 with a body) sent per job prompt."""
        counts: dict[str, int] = {}
        for r in self.requests:
            if r.status == 200 and r.tokens and "Question:" in r.prompt:
                counts[r.prompt] = counts.get(r.prompt, 0) + 1
        return counts

    def job_requests(self) -> list[Logged]:
        """Requests carrying a job's prompt (not the probe's), in arrival order."""
        return [r for r in self.requests if "Question:" in r.prompt]

    def _attempt(self, prompt: str) -> int:
        with self._lock:
            self._attempts[prompt] = self._attempts.get(prompt, 0) + 1
            return self._attempts[prompt]

    def _log(self, entry: Logged) -> None:
        with self._lock:
            self.requests.append(entry)


def estimated_tokens(prompt: str) -> int:
    """posbias's estimate of a prompt's tokens without a tokenizer (`workers.tokenizer`)."""
    from posbias.workers.tokenizer import estimated_prompt_tokens

    return estimated_prompt_tokens(prompt)


def answer_sheet(prompt: str) -> str:
    """`k. ((k - 1) % 4 + 1)` for every question the prompt holds."""
    count = len(re.findall(r"(?m)^\d+\. Question:", prompt))
    return "\n".join(f"{k}. {(k - 1) % 4 + 1}" for k in range(1, count + 1))


def _handler(state: FakeEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any, *, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str, **headers: str) -> None:
            self._send(
                status, {"error": {"message": message, "type": "error", "code": status}}, headers=headers
            )

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            authorization = self.headers.get("Authorization")
            arrived = time.monotonic()
            if state.key is not None and authorization != f"Bearer {state.key}":
                self._error(401, "a wrong API key")
                return
            if self.path != "/v1/completions":
                self._error(404, f"no route {self.path}")
                return
            prompt = body.get("prompt")
            prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
            max_tokens = int(body.get("max_tokens") or 16)
            attempt = state._attempt(prompt)
            fault = state.faults(prompt, attempt) if "Question:" in prompt else None

            def log(status: int, tokens: int = 0) -> None:
                state._log(
                    Logged(
                        at=arrived,
                        path=self.path,
                        prompt=prompt,
                        attempt=attempt,
                        status=status,
                        tokens=tokens,
                        authorization=authorization,
                        max_tokens=max_tokens,
                    )
                )

            if fault == "429-retry-after":
                log(429)
                self._error(429, "slow down", **{"Retry-After": "1"})
            elif fault == "429":
                log(429)
                self._error(429, "slow down")
            elif fault == "500":
                log(500)
                self._error(500, "the server fell over")
            elif fault == "echo-key":
                log(400)
                self._error(400, f"this request is not allowed for {authorization}")
            elif fault == "no-choices":
                log(200)
                self._send(200, {"id": "cmpl-fake", "object": "text_completion", "model": MODEL})
            elif fault == "drop":
                log(0)
                self.close_connection = True
                self.connection.shutdown(2)
            else:
                text = answer_sheet(prompt) if "Question:" in prompt else "1"
                output = min(max_tokens, max(1, len(text) // 2))
                tokens = math.ceil(estimated_tokens(prompt) * state.usage_factor) + output
                payload = json.dumps(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": MODEL,
                        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                        "usage": {
                            "prompt_tokens": tokens - output,
                            "completion_tokens": output,
                            "total_tokens": tokens,
                        },
                    }
                ).encode()
                if fault == "slow":
                    _wait_for_hang_up(self.connection, state.slow_s)
                if fault == "truncated":
                    log(200)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                log(200, tokens if fault != "slow" else 0)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client gave up waiting (the `slow` fault)
                    self.wfile.write(payload)

    return Handler


def _wait_for_hang_up(connection: socket.socket, limit_s: float) -> None:
    """Wait until the client closes the connection (its timeout fired), or `limit_s` seconds."""
    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([connection], [], [], left)
        if readable:
            try:
                if connection.recv(1, socket.MSG_PEEK) == b"":
                    return  # end of stream: the client hung up
            except OSError:
                return
            time.sleep(0.01)  # bytes of a next request on a kept-alive connection: not a hang-up


@contextmanager
def serve(state: FakeEndpoint) -> Iterator[FakeEndpoint]:
    """Run `state`'s server on a free port of 127.0.0.1; `state.url` is its base URL (with /v1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fake-endpoint", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
