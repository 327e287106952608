"""Checkpoints of a model and where they come from: when a folder is a complete checkpoint, and finding new
ones among a folder's subfolders or a Hugging Face repository's revisions.

Nothing here touches the database: a look at a source returns a `Discovery`, which the scheduler records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from posbias.schemas.errors import PosbiasError
from posbias.schemas.files import MAX_CONFIG_BYTES, read_bytes
from posbias.schemas.schedule import HubRevisions

TRAILING_NUMBER = re.compile(r"(\d{1,18})$")
# A folder (or a file in it) with one of these endings is still being written: trainers and copy tools
# write to a temporary name and rename when done; huggingface_hub downloads to `*.incomplete`.
INCOMPLETE_SUFFIXES = (".tmp", ".partial", ".incomplete", ".lock")
INCOMPLETE_MARKERS = frozenset({"INCOMPLETE", ".incomplete", ".writing"})
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class FolderSource:
    """Checkpoints are the subfolders of `path`."""

    path: Path


@dataclass(frozen=True)
class HubSource:
    """Checkpoints are revisions of the hub repository `repo`."""

    repo: str
    branch: str = "main"
    revisions: HubRevisions = HubRevisions.commits


Source = FolderSource | HubSource


def order_key(name: str, step: int | None) -> tuple[bool, int, str]:
    """Checkpoints sort by step (trailing number), then name; those without a number come last."""
    return (step is None, step or 0, name)


def trailing_number(name: str) -> int | None:
    """The number a name ends with (`checkpoint-1000` -> 1000), or None."""
    match = TRAILING_NUMBER.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Found:
    """A complete checkpoint seen by a tick."""

    name: str
    step: int | None
    model: str
    revision: str | None = None


@dataclass(frozen=True)
class Waiting:
    """A subfolder that is not (yet) a complete checkpoint, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Discovery:
    """What one look at a schedule's source found."""

    found: list[Found] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    problem: str | None = None
    """Why nothing could be looked at (hub unreachable, folder gone); the tick carries on."""


def incomplete_reason(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint yet; None when it is.

    Complete means: no temporary name or marker file, a `config.json` that parses, and weights that are all
    there: every shard a `*.index.json` lists, else a non-empty `*.safetensors` or `pytorch_model*.bin`.
    """
    if folder.name.endswith(INCOMPLETE_SUFFIXES):
        return f"its name ends in {folder.suffix} (still being written)"
    try:
        entries = {entry.name: entry for entry in folder.iterdir()}
    except OSError as exc:
        return f"cannot list it ({exc.strerror})"
    markers = sorted(n for n in entries if n in INCOMPLETE_MARKERS or n.endswith(INCOMPLETE_SUFFIXES))
    if markers:
        return f"{markers[0]} says it is still being written"
    try:
        return _weights_reason(folder, entries=set(entries))
    except PosbiasError as exc:  # a FIFO or device where a config should be: reading it would never end
        return str(exc)


def _weights_reason(folder: Path, *, entries: set[str]) -> str | None:
    if _json_object(folder / "config.json") is None:
        return "no complete config.json yet"
    for index in WEIGHT_INDEXES:
        if index in entries:
            listed = _json_object(folder / index)
            weight_map = listed.get("weight_map") if listed else None
            if not isinstance(weight_map, dict):
                return f"{index} is not complete yet"
            missing = sorted(str(s) for s in set(weight_map.values()) if not _non_empty(folder / str(s)))
            return f"{index} lists {missing[0]}, which is not there yet" if missing else None
    weights = sorted(
        n
        for n in entries
        if n.endswith(".safetensors") or (n.startswith("pytorch_model") and n.endswith(".bin"))
    )
    if not weights:
        return "no weights yet (*.safetensors or pytorch_model*.bin)"
    empty = [n for n in weights if not _non_empty(folder / n)]
    return f"weights file {empty[0]} is empty" if empty else None


def _json_object(file: Path) -> dict[str, Any] | None:
    """The JSON object in `file`; None while it is missing or does not parse. Raises `PosbiasError` when it
    is not a regular file (or too large for a config)."""
    if not file.exists():
        return None
    fix = "replace it with the file itself"
    try:
        data = json.loads(read_bytes(file, what=file.name, fix=fix, limit=MAX_CONFIG_BYTES))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _non_empty(file: Path) -> bool:
    try:
        return file.is_file() and file.stat().st_size > 0
    except OSError:
        return False


def scan_folder(folder: Path) -> Discovery:
    """The complete checkpoints among `folder`'s subfolders (hidden ones skipped), and those still being
    written."""
    try:
        subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as exc:
        return Discovery(problem=f"cannot list checkpoint folder {folder} ({exc.strerror}): is it mounted?")
    discovery = Discovery()
    for sub in subfolders:
        reason = incomplete_reason(sub)
        if reason is None:
            discovery.found.append(Found(name=sub.name, step=trailing_number(sub.name), model=str(sub)))
        else:
            discovery.waiting.append(Waiting(name=sub.name, reason=reason))
    return discovery


class HubClient(Protocol):
    """The part of `huggingface_hub.HfApi` a tick uses (tests pass a stand-in)."""

    def list_repo_commits(self, repo_id: str, *, revision: str | None = None) -> Sequence[Any]:
        """Commits of `revision`, newest first; each has `commit_id`."""
        ...

    def list_repo_refs(self, repo_id: str) -> Any:
        """`branches` and `tags`, each with `name` and `target_commit`."""
        ...


def scan_hub(client: HubClient, source: HubSource, *, known: set[str]) -> Discovery:
    """The checkpoints a hub repository has now. `commits`: the branch's head the first time, then every
    commit newer than the newest one already known (a rewritten history restarts from the head).
    `branches`: every branch and tag but `source.branch`. Errors become `problem` ("hub unreachable")."""
    try:
        if source.revisions is HubRevisions.branches:
            refs = client.list_repo_refs(source.repo)
            return Discovery(
                found=[
                    Found(
                        name=ref.name,
                        step=trailing_number(ref.name),
                        model=source.repo,
                        revision=ref.target_commit,
                    )
                    for ref in [*refs.branches, *refs.tags]
                    if ref.name != source.branch
                ]
            )
        commits = list(client.list_repo_commits(source.repo, revision=source.branch))
    except Exception as exc:  # the hub client raises its HTTP library's errors, which change by version
        return Discovery(problem=_hub_problem(exc, source=source))
    names = [str(commit.commit_id)[:12] for commit in commits]
    # The first look (or one after a rewritten history) takes the head only: a schedule is for revisions
    # from now on, not for the repository's whole past.
    newer = len(names) if known & set(names) else min(1, len(names))
    found = []
    for index, (name, commit) in enumerate(zip(names[:newer], commits, strict=False)):
        if name in known:
            break
        found.append(
            Found(name=name, step=len(commits) - 1 - index, model=source.repo, revision=commit.commit_id)
        )
    return Discovery(found=found)


def _hub_problem(exc: Exception, *, source: HubSource) -> str:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, RevisionNotFoundError):
        return f"branch {source.branch!r} not found in {source.repo}: check --branch"
    if isinstance(exc, RepositoryNotFoundError):
        return f"hub repository {source.repo} not found, or gated: check the id, or set HF_TOKEN"
    text = str(exc).strip().splitlines()
    return f"hub unreachable ({type(exc).__name__}: {text[0] if text else ''}); will look again next tick"


def default_hub() -> HubClient:
    """The real hub client (`huggingface_hub` is imported only when a schedule watches the hub)."""
    from huggingface_hub import HfApi

    client: HubClient = HfApi()
    return client
