"""Waiting in tests for something another thread or process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], *, timeout: float = 120, what: str = "the condition") -> None:
    """Poll `condition` every 50 ms until it holds; `AssertionError` naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
