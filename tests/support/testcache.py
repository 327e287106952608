"""What the test suite builds once per machine and keeps across sessions and fresh clones: tiny models (keyed
by the hash of what builds them, `support.tinymodels.tiny_model`) and the kernels torch and vLLM compile.

The folder is `$XDG_CACHE_HOME/posbias-tests` (default `~/.cache/posbias-tests`). Deleting it costs the next
session the builds again, nothing more.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

COMPILED = ("inductor", "vllm")
"""Subfolders of a posbias cache folder where torch (the sampler kernel, ~35 s to compile) and vLLM (what it
learnt of each architecture, ~10 s each) keep what they compile: kept here across sessions."""


def cache_root() -> Path:
    """The suite's cache folder (created); a private temporary folder when the home folder is read-only."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "posbias-tests"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / f"posbias-tests-{os.getuid()}"
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def posbias_cache(folder: Path) -> Path:
    """Make `folder` a posbias cache folder (POSBIAS_CACHE_DIR) of its own, fresh except for its compiled
    kernels, which point at the suite's cache: converted models and answers are this folder's alone."""
    folder.mkdir(parents=True, exist_ok=True)
    for sub in COMPILED:
        shared = cache_root() / f"engine-{sub}"
        shared.mkdir(exist_ok=True)
        link = folder / sub
        if not link.exists():
            link.symlink_to(shared, target_is_directory=True)
    return folder
