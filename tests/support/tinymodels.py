"""The tiny random-weights models of `posbias.workers.tiny_models` (the builder, `posbias models build-tiny`),
built once per machine for the tests and benchmarks.

`tiny_model` keeps each in the suite's cache (`support.testcache`) under the hash of its arguments, the
builder's code and the versions of the libraries that write it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

from posbias.workers import tiny_models
from posbias.workers.tiny_models import _LLAMA_STYLE, Architecture, _build_tokenizer, build_tiny_model
from support.testcache import cache_root

__all__ = ["_LLAMA_STYLE", "Architecture", "_build_tokenizer", "build_tiny_model", "tiny_model"]

_WRITERS = ("torch", "transformers", "tokenizers", "safetensors")
"""The libraries whose versions decide the bytes `build_tiny_model` writes."""


def tiny_model(*, architecture: Architecture, **fields: Any) -> Path:
    """The folder `build_tiny_model(folder, architecture=..., **fields)` writes, built the first time these
    arguments, the builder's code and the versions of the libraries that write the files are seen on this
    machine, and reused after that (from other sessions and clones too). Treat it as read-only."""
    key = json.dumps(
        {
            "arguments": {"architecture": architecture, **fields},
            "code": hashlib.sha256(Path(tiny_models.__file__).read_bytes()).hexdigest(),
            "versions": {name: version(name) for name in _WRITERS},
        },
        sort_keys=True,
    )
    root = cache_root() / "tiny-models"
    final = root / f"{architecture}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if final.is_dir():
        return final
    # Built aside and renamed into place, so a folder under its final name is always complete, and two
    # sessions building at once both end with one of the two (the same bytes).
    partial = root / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    build_tiny_model(partial, architecture=architecture, **fields)
    try:
        partial.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(partial)
    return final
