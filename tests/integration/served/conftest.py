"""Fixtures for served-model tests: the API key they send, in the environment before Ray starts.

Ray's workers inherit the environment of the process that started Ray; the key must be set before the
session's Ray (`ray_session`) starts, so it is set when this file is loaded, at collection.
"""

from __future__ import annotations

import os
import secrets

import pytest
from support.fakeendpoint import KEY_ENV


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(KEY_ENV, f"sk-posbias-{secrets.token_hex(16)}")


@pytest.fixture(scope="session")
def endpoint_key() -> str:
    """The API key the served tests' endpoints expect (environment variable `KEY_ENV`)."""
    return os.environ[KEY_ENV]
