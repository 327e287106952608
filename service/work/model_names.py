"""Is the model a job names there? Checked at submit, so that a misspelled name is refused in one line rather
than queued to fail later on a worker.

A local path (a folder, a `.gguf` file; anything that starts like a path or whose parent folder exists here)
must exist, and a near miss among its parent folder's entries is suggested. A hub id is asked of the hub
when it is reachable, else looked for in the local Hugging Face cache; when neither can say (submitting from
a laptop without the model is the main use), `check_model_name` warns (`ModelNotCheckedWarning`) and the job
goes on.
"""

from __future__ import annotations

import difflib
import warnings
from pathlib import Path

from posbias.schemas import ModelNotCheckedWarning, PosbiasError, one_line
from posbias.workers import hub
from posbias.workers.models import DEMO_MODEL, check_model_source

HUB_TIMEOUT_S = 10.0
"""How long the hub may take to say whether a model exists."""


def check_model_name(model: str, *, revision: str | None = None, hub_cache: Path | None = None) -> None:
    """Raise `PosbiasError` (with a suggestion when one is near) when `model` is a local path that does not
    exist or a hub id the hub does not have; warn `ModelNotCheckedWarning` when nothing here can tell.
    `hub_cache`: the Hugging Face cache folder (default: huggingface_hub's)."""
    text = model.strip()
    if text == DEMO_MODEL:
        return
    path = Path(text).expanduser()
    if _meant_as_path(text, path) and not path.exists():
        raise PosbiasError(f"model path {path} does not exist{_near(path)}; check the path")
    source = check_model_source(text)
    if source.kind != "hub":
        return
    cache = hub_cache if hub_cache is not None else _default_cache()
    said = _ask_hub(text, revision=revision, cache=cache)
    if said is not None:
        return
    if _cached(text, cache=cache):
        return
    near = _near_cached(text, cache=cache)
    hint = f" (did you mean {near}?)" if near else ""
    warnings.warn(
        f"cannot check model {text}{hint}: the hub is not reachable from here and it is not in the local "
        "cache; the job goes on, and its workers will download it",
        ModelNotCheckedWarning,
        stacklevel=2,
    )


def _meant_as_path(text: str, path: Path) -> bool:
    if text.startswith(("/", "./", "../", "~")) or text.lower().endswith(".gguf"):
        return True
    parent = path.parent
    return parent != Path(".") and parent.is_dir()  # `models/smolm` with a `models/` folder here


def _near(path: Path) -> str:
    """` (did you mean ...?)` with the first part of `path` that is missing here replaced by the closest
    name in the folder that holds it; empty when none is close."""
    parts = path.parts
    for depth in range(len(parts)):
        if not Path(*parts[: depth + 1]).exists():
            break
    else:
        return ""
    parent = Path(*parts[:depth]) if depth else Path(".")
    try:
        names = [entry.name for entry in parent.iterdir()]
    except OSError:
        return ""
    found = difflib.get_close_matches(parts[depth], names, n=1, cutoff=0.6)
    if not found:
        return ""
    return f" (did you mean {Path(*parts[:depth], found[0], *parts[depth + 1 :])}?)"


def _ask_hub(model: str, *, revision: str | None, cache: Path) -> bool | None:
    """True when the hub has `model` (at `revision`); None when it cannot be asked. Raises `PosbiasError`
    when the hub says there is no such model or revision."""
    if not hub.can_fetch():
        return None
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(model, revision=revision, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return True  # it exists; the workers need a token for its files
    except RevisionNotFoundError:
        raise PosbiasError(
            f"model {model} has no revision {revision!r} on the hub; check --revision"
        ) from None
    except RepositoryNotFoundError:
        near = _near_cached(model, cache=cache)
        hint = f"did you mean {near}? " if near else ""
        raise PosbiasError(
            f"the hub has no model {model}: {hint}check the name (a private model needs HF_TOKEN set)"
        ) from None
    except Exception:  # the hub client raises many unrelated types for a failed request; the cache may say
        return None
    return True


def _default_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _cached(model: str, *, cache: Path) -> bool:
    """True when the local Hugging Face cache holds a snapshot of `model`."""
    snapshots = cache / f"models--{model.replace('/', '--')}" / "snapshots"
    try:
        return snapshots.is_dir() and any(snapshots.iterdir())
    except OSError:
        return False


def _near_cached(model: str, *, cache: Path) -> str | None:
    try:
        ids = [p.name.removeprefix("models--").replace("--", "/") for p in cache.glob("models--*")]
    except OSError as exc:
        raise PosbiasError(f"cannot read the Hugging Face cache {cache}: {one_line(exc)}") from None
    found = difflib.get_close_matches(model, ids, n=1, cutoff=0.6)
    return found[0] if found else None
