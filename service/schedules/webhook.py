"""The webhook: posting final verdicts to `POSBIAS_WEBHOOK_URL`, each once, whichever tick gets there first.

A verdict waits in its checkpoint row (`announcement` = `due`) until a tick claims and posts it; a failed post
is retried at later ticks, a bounded number of times, and never fails a tick. Only a 2xx answer posts it: a
redirect is not followed (it would turn the POST into a GET to wherever the receiver says, and carry the
credentials there), so a 3xx is a failed post. Credentials in the URL (`user:password@`) go as basic
authentication, never as part of the host name.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from sqlalchemy import select, update

from posbias.schemas import one_line
from posbias.schemas.schedule import Announcement, VerdictDetail
from posbias.service.settings import Settings, check_webhook_url
from posbias.service.store import Checkpoint, Database

log = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0
MAX_ANNOUNCE_ATTEMPTS = 3


def announce(db: Database, *, settings: Settings) -> tuple[list[str], list[str]]:
    """POST every verdict due for announcement to `settings.webhook_url`, each claimed first so that two
    ticks never post the same one. A failure is logged and retried at the next tick, up to
    `MAX_ANNOUNCE_ATTEMPTS`; it never fails the tick. Returns (posted, failures), as `schedule/checkpoint`
    and one-line messages."""
    url = settings.webhook_url
    if not url:
        return [], []
    with db.read() as session:
        due = session.execute(
            select(Checkpoint.id, Checkpoint.detail, Checkpoint.announce_attempts)
            .where(Checkpoint.announcement == Announcement.due)
            .order_by(Checkpoint.id)
        ).all()
    posted, failures = [], []
    for checkpoint_id, stored, attempts in due:
        with db.write() as session:
            claimed = session.scalars(
                update(Checkpoint)
                .where(Checkpoint.id == checkpoint_id, Checkpoint.announcement == Announcement.due)
                .values(announcement=Announcement.sending)
                .returning(Checkpoint.id)
            ).all()
        if not claimed:
            continue
        detail = VerdictDetail.model_validate(stored)
        label = f"{detail.schedule}/{detail.checkpoint}"
        try:
            post_json(url, webhook_payload(detail), timeout=WEBHOOK_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            tries = attempts + 1
            message = (
                f"could not post the verdict of {label} to the webhook at {_host(url)} "
                f"({_http_problem(exc)}); "
                + (
                    "will retry at the next tick"
                    if tries < MAX_ANNOUNCE_ATTEMPTS
                    else f"gave up after {tries} tries"
                )
            )
            log.warning("%s", message)
            failures.append(message)
            values: dict[str, Any] = {
                "announcement": Announcement.due if tries < MAX_ANNOUNCE_ATTEMPTS else Announcement.failed,
                "announce_attempts": tries,
                "announce_error": message,
            }
        else:
            posted.append(label)
            values = {
                "announcement": Announcement.sent,
                "announced_at": datetime.now(UTC),
                "announce_error": None,
            }
        with db.write() as session:
            session.execute(update(Checkpoint).where(Checkpoint.id == checkpoint_id).values(**values))
    return posted, failures


def webhook_payload(detail: VerdictDetail) -> dict[str, Any]:
    """What the webhook receives: the `VerdictDetail` as JSON plus `text`, a one-line summary (the field
    chat webhooks such as Slack's display)."""
    text = f"posbias: {detail.schedule} checkpoint {detail.checkpoint}: {detail.verdict.value.upper()}"
    return {"text": f"{text} - {detail.reason}", **detail.model_dump(mode="json")}


def post_json(url: str, payload: dict[str, Any], *, timeout: float) -> None:
    """POST `payload` as JSON; raises `OSError` (`urllib.error.URLError`, timeouts) on failure or an answer
    that is not 2xx (a redirect included), `ValueError` for a URL posbias does not post to (`Settings`
    refuses it already; this is for settings copied without validation)."""
    check_webhook_url(url)
    parts = urlsplit(url)
    headers = {"Content-Type": "application/json", "User-Agent": "posbias"}
    if parts.username is not None or parts.password is not None:
        login = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(login.encode()).decode("ascii")
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(65536)
    except urllib.error.HTTPError as exc:
        exc.close()  # the answer's connection: the caller needs only the status
        raise


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib then raises the 3xx as an `HTTPError`."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _host(url: str) -> str:
    # Never the whole URL: chat webhooks carry their token in it.
    return urlsplit(url).hostname or "?"


def _http_problem(exc: BaseException) -> str:
    # The status or the reason, never the URL: chat webhooks carry their token in it.
    if isinstance(exc, urllib.error.HTTPError):
        if 300 <= exc.code < 400:
            return f"HTTP {exc.code}, a redirect, not followed: set POSBIAS_WEBHOOK_URL to where it points"
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return f"{exc.reason}"
    return one_line(exc)
