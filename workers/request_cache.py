"""Answers an endpoint was already paid for, kept on disk, so that a shard delivered again (its lease expired,
its worker died) does not pay twice: `RequestCache`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class RequestCache:
    """Answers already paid for, one JSON file per request under `folder`, keyed by a digest of the endpoint,
    the model, the request body (prompt and sampling) and a salt. Safe for several workers on one machine:
    files are written whole (a temporary file, then a rename)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    @staticmethod
    def key(*, endpoint: str, path: str, body: Mapping[str, Any], salt: str | None) -> str:
        """The digest that names a request's answer."""
        canonical = json.dumps(
            {"endpoint": endpoint, "path": path, "body": body, "salt": salt},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self._folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry (a mapping, as it was put), or None."""
        try:
            entry = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, answer: dict[str, Any]) -> None:
        """Store an entry (best effort: a full disk costs a second payment later, not this result)."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            scratch.write_text(json.dumps(answer))
            os.replace(scratch, path)
        except OSError:
            pass
