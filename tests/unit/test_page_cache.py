"""The viewer's page cache (`service/reports/page_cache.py`): many requests for one page at one token of
the store build it once and all get it; a new token builds it again; a failed build reaches every request
that waited for it and is not kept; only the last `kept` pages are kept."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from posbias.service.reports import page_cache
from posbias.service.reports.page_cache import PageCache


def test_requests_that_arrive_during_a_build_wait_for_it_and_a_new_token_builds_again() -> None:
    cache = PageCache()
    builds: list[str] = []
    arrived = threading.Semaphore(0)

    def build() -> bytes:
        builds.append("built")
        for _ in range(20):  # every request is in flight before the first build ends
            assert arrived.acquire(timeout=30)
        return b"page 1"

    def ask(_: int) -> bytes:
        arrived.release()
        return cache.get("job 1", token=1, build=build)

    with ThreadPoolExecutor(20) as pool:
        pages = list(pool.map(ask, range(20)))
    assert builds == ["built"] and pages == [b"page 1"] * 20
    assert cache.get("job 1", token=1, build=lambda: b"never") == b"page 1"
    assert cache.get("job 1", token=2, build=lambda: b"page 2") == b"page 2"
    assert cache.get("job 1", token=2, build=lambda: b"never") == b"page 2"


def test_a_failed_build_reaches_everyone_who_waited_and_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = PageCache()
    started, waiting = threading.Event(), threading.Event()
    wait = page_cache._Flight.wait

    def waits(flight: page_cache._Flight) -> bytes:
        waiting.set()
        return wait(flight)

    monkeypatch.setattr(page_cache._Flight, "wait", waits)

    def failing() -> bytes:
        started.set()
        assert waiting.wait(30)  # the second request waits for this build
        raise LookupError("no job 9")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.get, "job 9", token=1, build=failing)
        assert started.wait(30)
        second = pool.submit(cache.get, "job 9", token=1, build=lambda: b"never")
        for future in (first, second):
            with pytest.raises(LookupError, match="no job 9"):
                future.result(timeout=30)
    assert cache.get("job 9", token=1, build=lambda: b"now there is") == b"now there is"


def test_only_the_last_pages_are_kept() -> None:
    cache = PageCache(kept=2)
    for key in ("a", "b", "c"):
        cache.get(key, token=0, build=lambda key=key: key.encode())
    assert cache.get("a", token=0, build=lambda: b"a again") == b"a again"  # the oldest went
    assert cache.get("c", token=0, build=lambda: b"never") == b"c"
