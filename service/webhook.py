"""The webhook: posting final verdicts to `POSBIAS_WEBHOOK_URL`, each once, whichever tick gets there first.

A verdict waits in its checkpoint row (`announcement` = `due`) until a tick claims and posts it; a failed post
is retried at later ticks, a bounded number of times, and never fails a tick.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select, update

from posbias.schemas import one_line
from posbias.schemas.schedule import Announcement, VerdictDetail
from posbias.service.database import Database
from posbias.service.settings import Settings
from posbias.service.tables import Checkpoint

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
    """POST `payload` as JSON; raises `OSError` (`urllib.error.URLError`, timeouts) on failure or a non-2xx
    answer, `ValueError` for a URL that is not http(s)."""
    if urlsplit(url).scheme not in {"http", "https"}:
        raise ValueError("POSBIAS_WEBHOOK_URL must be an http:// or https:// URL")
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "posbias"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read(65536)


def _host(url: str) -> str:
    # Never the whole URL: chat webhooks carry their token in it.
    return urlsplit(url).hostname or "?"


def _http_problem(exc: BaseException) -> str:
    # The status or the reason, never the URL: chat webhooks carry their token in it.
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return f"{exc.reason}"
    return one_line(exc)
