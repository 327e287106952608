"""How `posbias worker` connects to a Ray cluster: which refusals it tries again, and what it says when it
gives up. `ray.init` is replaced here (the real connections are in tests/deploy/test_ray_wiring.py), and so
is the TCP probe before it for the made-up address; the refusals are the exceptions Ray Client raises. The
probe itself is tried on a real closed port."""

from __future__ import annotations

import socket

import pytest
import ray

from posbias.schemas import PosbiasError
from posbias.service.dispatch import ray_connect
from posbias.service.settings import Settings

CLIENT = Settings(ray_address="ray://head:10001")
# What Ray Client raises when its proxy answers but cannot start this client's server (a head whose
# runtime-env agent is not up yet): the proxy's traceback, with the cause on its last line.
REFUSED = ConnectionAbortedError(
    'Initialization failure from server:\nTraceback (most recent call last):\n  File "proxier.py"\n'
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err for detailed logs."
)


def connect_with(monkeypatch: pytest.MonkeyPatch, outcomes: list[BaseException | None]) -> list[str]:
    """Replace `ray.init` by one that meets `outcomes` in turn (None: connected); the addresses it got."""
    calls: list[str] = []

    def init(*, address: str, **_: object) -> None:
        calls.append(address)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_connect, "_probe", lambda address, *, seconds: None)
    return calls


def test_a_session_the_cluster_cannot_set_up_yet_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = connect_with(monkeypatch, [REFUSED, REFUSED, None])
    ray_connect.init_ray(CLIENT)
    assert calls == ["ray://head:10001"] * 3


def test_after_the_last_refusal_the_error_names_the_cause_and_where_to_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = connect_with(monkeypatch, [REFUSED] * ray_connect.RAY_CLIENT_ATTEMPTS)
    with pytest.raises(PosbiasError) as raised:
        ray_connect.init_ray(CLIENT)
    message = str(raised.value)
    assert len(calls) == ray_connect.RAY_CLIENT_ATTEMPTS
    assert "\n" not in message
    assert "Starting Ray client server failed" in message and "ray_client_server" in message


def test_an_unreachable_cluster_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = connect_with(monkeypatch, [ConnectionError("ray client connection timeout")])
    with pytest.raises(
        PosbiasError, match=r"cannot reach the Ray cluster at 'ray://head:10001'.*ray start --head"
    ):
        ray_connect.init_ray(CLIENT)
    assert len(calls) == 1


def test_an_address_nothing_listens_on_is_refused_at_once_without_calling_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    called: list[str] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: called.append(kwargs["address"]))
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(PosbiasError, match=r"cannot reach the Ray cluster .*refused.*ray start --head"):
            ray_connect.init_ray(Settings(ray_address=address))
    with pytest.raises(PosbiasError, match="is not a Ray address"):
        ray_connect.init_ray(Settings(ray_address="127.0.0.1:notaport"))
    assert called == []
