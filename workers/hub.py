"""Whether the Hugging Face hub can be asked at all, found in milliseconds.

Without network the hub client retries for about half a minute before it gives up; a direct TCP connection
to its endpoint says the same at once. Every place that would reach the hub to fetch something it could go
without (a dataset, a model's config for the engine's context) asks here first."""

from __future__ import annotations

import socket
from urllib.parse import urlparse
from urllib.request import getproxies

PROBE_TIMEOUT_S = 3.0


def hub_settings() -> tuple[bool, str]:
    """(HF_HUB_OFFLINE, the hub's endpoint), as huggingface_hub reads them."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE), str(constants.ENDPOINT)


def reachable(endpoint: str) -> bool:
    """A direct TCP connection to the endpoint; behind a proxy the hub client is left to find out itself."""
    url = urlparse(endpoint)
    if url.scheme in getproxies():
        return True
    host = url.hostname or endpoint
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def can_fetch() -> bool:
    """True when a download from the hub may succeed: not offline, and its endpoint answers."""
    offline, endpoint = hub_settings()
    return not offline and reachable(endpoint)
