"""Loopback ports for tests and benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on (free a moment ago): one to start a server on, or one to point
    a client at that must find nothing there. Another process may take it in between; a server that must
    come up retries with a new one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
