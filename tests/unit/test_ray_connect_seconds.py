"""`POSBIAS_RAY_CONNECT_SECONDS`: how long connecting to a Ray address that answers TCP but never answers as
Ray may take before the command gives up with a line naming the setting. The address is a real listening
socket (the TCP probe reaches it for real); `ray.init` is replaced by one that waits until the test ends, as
Ray does for a GCS that never replies."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator

import pytest
import ray

from posbias.schemas import PosbiasError
from posbias.service.dispatch import ray_connect
from posbias.service.settings import Settings


@pytest.fixture
def silent_address() -> Iterator[str]:
    """host:port of a socket that accepts connections and never says anything."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def hanging_init(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """`ray.init` that never returns while the test runs; the addresses it was given."""
    released = threading.Event()
    calls: list[str] = []

    def init(*, address: str, **_: object) -> None:
        calls.append(address)
        released.wait(60)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    yield calls
    released.set()


def test_a_ray_address_that_never_answers_gives_up_after_the_setting_and_names_it(
    monkeypatch: pytest.MonkeyPatch, silent_address: str, hanging_init: list[str]
) -> None:
    monkeypatch.setenv("POSBIAS_RAY_CONNECT_SECONDS", "1")
    settings = Settings(ray_address=silent_address)
    assert settings.ray_connect_seconds == 1
    with pytest.raises(PosbiasError) as raised:
        ray_connect.init_ray(settings)
    assert hanging_init == [silent_address]  # the probe got through: it was Ray that did not answer
    # The wait left after the TCP probe, rounded: 1 s unless the probe itself took half of it.
    assert re.fullmatch(
        rf"the Ray cluster at {re.escape(repr(silent_address))} did not answer within [01] s "
        rf"\(is it a Ray GCS address\?\); {re.escape(ray_connect.RAY_HINT)}, "
        "or raise POSBIAS_RAY_CONNECT_SECONDS",
        str(raised.value),
    )


def test_a_ray_that_answers_in_time_connects(monkeypatch: pytest.MonkeyPatch, silent_address: str) -> None:
    calls: list[str] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *, address, **_: calls.append(address))
    monkeypatch.setenv("POSBIAS_RAY_CONNECT_SECONDS", "1")
    ray_connect.init_ray(Settings(ray_address=silent_address))
    assert calls == [silent_address]
