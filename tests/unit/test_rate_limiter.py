"""The served engine's rate limiter (`workers/endpoint_session.RateLimiter`) on a clock the test drives: the
starts it hands out are spaced by the request and token limits, in call order, and an event loop that wakes
late does not turn the slots it owed into a burst. The server-side view of the same limits, with a real
endpoint and its loopback's jitter, is tests/integration/served/test_served_faults.py."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import pytest

from posbias.workers import endpoint_session
from posbias.workers.endpoint_session import RateLimiter


class Clock:
    """`time.monotonic` and `asyncio.sleep` for the limiter: a sleep moves the clock on by what was asked
    plus `late(i)` for the i-th sleep (a busy machine waking sleepers late)."""

    def __init__(self, late: Callable[[int], float] = lambda i: 0.0) -> None:
        self.now = 1000.0
        self.sleeps = 0
        self._late = late
        self._yield: Callable[[float], Awaitable[None]] = asyncio.sleep

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds + self._late(self.sleeps)
        self.sleeps += 1
        await self._yield(0)


def starts(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, limiter: RateLimiter, tokens: list[int]
) -> list[tuple[int, float]]:
    """Request i (of `tokens[i]` tokens) asks for a slot, all at once; (i, start) in slot order."""
    monkeypatch.setattr(endpoint_session.time, "monotonic", clock.monotonic)
    got: list[tuple[int, float]] = []

    async def request(i: int) -> None:
        await limiter.acquire(tokens[i])
        got.append((i, clock.now))

    async def main() -> None:
        monkeypatch.setattr(endpoint_session.asyncio, "sleep", clock.sleep)
        await asyncio.gather(*(request(i) for i in range(len(tokens))))

    asyncio.run(main())
    return got


def most_in_a_window(times: list[float], window: float) -> int:
    return max(sum(1 for t in times if first <= t < first + window) for first in times)


def test_requests_start_one_gap_apart_in_call_order(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    got = starts(monkeypatch, clock, RateLimiter(requests_per_minute=1200, tokens_per_minute=None), [10] * 40)
    assert [i for i, _ in got] == list(range(40))
    times = [t for _, t in got]
    assert [round(b - a, 9) for a, b in itertools.pairwise(times)] == [0.05] * 39
    assert most_in_a_window(times, 1.0) <= 20 + 1  # the docstring's bound: W x rate + 1


def test_the_token_limit_spaces_a_request_by_the_previous_ones_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens = [100, 500, 50, 50, 1000, 10]
    clock = Clock()
    got = starts(monkeypatch, clock, RateLimiter(requests_per_minute=1200, tokens_per_minute=60_000), tokens)
    times = [t for _, t in got]
    # 1,000 tokens a second: after a request of k tokens the next waits k ms, or the 50 ms gap if longer.
    gaps = [round(b - a, 9) for a, b in itertools.pairwise(times)]
    assert gaps == [max(0.05, k / 1000) for k in tokens[:-1]]


def test_a_late_wakeup_delays_the_next_start_instead_of_bunching_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every third sleep wakes 0.3 s late: starts slip, but no two are ever closer than the gap.
    clock = Clock(late=lambda i: 0.3 if i % 3 == 0 else 0.0)
    got = starts(monkeypatch, clock, RateLimiter(requests_per_minute=600, tokens_per_minute=None), [1] * 30)
    times = [t for _, t in got]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.1 - 1e-9 and max(gaps) > 0.35  # the late ones really were late
    for window in (0.5, 1.0, 2.0):
        assert most_in_a_window(times, window) <= window * 10 + 1


def test_no_limits_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    got = starts(monkeypatch, clock, RateLimiter(requests_per_minute=None, tokens_per_minute=None), [5] * 10)
    assert {t for _, t in got} == {1000.0} and clock.sleeps == 0
