"""The webhook posts a verdict to the URL it was given and nowhere else: a redirect is a failed post, not a
GET to wherever the receiver says; credentials in the URL go as basic authentication, not into a host name;
a URL posbias would never post to is refused when it is set, not when the first verdict is sent."""

from __future__ import annotations

import base64
import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from posbias.service.schedules.webhook import _http_problem, post_json
from posbias.service.settings import Settings, SettingsError


@pytest.fixture
def receiver() -> Iterator[SimpleNamespace]:
    """A local HTTP server: `/redirect` answers 302 to `/elsewhere`, anything else 200; `seen` holds
    (method, path, Authorization) of every request."""
    seen: list[tuple[str, str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.command, self.path, self.headers.get("Authorization")))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/elsewhere")
            else:
                self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(base=f"127.0.0.1:{server.server_address[1]}", seen=seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_redirect_is_a_failed_post_and_is_not_followed(receiver: SimpleNamespace) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        post_json(f"http://{receiver.base}/redirect", {"verdict": "pass"}, timeout=5)
    assert receiver.seen == [("POST", "/redirect", None)]  # no GET to /elsewhere
    problem = _http_problem(raised.value)
    assert "HTTP 302" in problem and "not followed" in problem and "\n" not in problem


def test_credentials_in_the_url_go_as_basic_authentication_not_into_the_host_name(
    receiver: SimpleNamespace,
) -> None:
    post_json(f"http://alice:s%3Acret@{receiver.base}/hook", {"verdict": "pass"}, timeout=5)
    expected = "Basic " + base64.b64encode(b"alice:s:cret").decode()
    assert receiver.seen == [("POST", "/hook", expected)]


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "gopher://example.com/",
        "data:text/plain,hello",
        "example.com/hook",
        "http:///hook",
        "https://example.com:99999/hook",
        "https://example.com/a hook",
        "https://example.com/hook\r\nX-Injected: 1",
    ],
)
def test_a_url_posbias_never_posts_to_is_refused_when_the_webhook_is_set(url: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings(webhook_url=url)
    message = str(raised.value)
    assert message.startswith("setting POSBIAS_WEBHOOK_URL") and "\n" not in message
    assert "example.com" not in message and "passwd" not in message  # the URL itself is never quoted


def test_http_and_https_webhooks_are_kept() -> None:
    for url in ("http://127.0.0.1:8080/hook", "https://user:token@hooks.example.com/services/T0/B0"):
        assert Settings(webhook_url=url).webhook_url == url
    assert Settings(webhook_url="").webhook_url is None
