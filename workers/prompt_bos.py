"""The BOS a model's prompts begin with: where a model's files ask for one (`stated_bos`), the check at
model load that its tokenizer adds it (`prompt_bos_id`), and what to do when it does not (`bos_fix`).

A prompt without the BOS a model was trained with is out of distribution from its first token (Gemma's
"attention sink" becomes an ordinary word); the engines that tokenize (vllm, hf) refuse to run one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posbias.schemas import PosbiasError
from posbias.workers.gguf_files import gguf_token_settings
from posbias.workers.models import ResolvedModel


def stated_bos(resolved: ResolvedModel, *, config: Any) -> str | None:
    """Where `resolved`'s files state that its prompts begin with a BOS token, for a message: the GGUF file
    it was converted from (`tokenizer.ggml.add_bos_token`), its config (`add_bos_token`), or the
    `tokenizer_config.json` of the model or of the tokenizer it is run with; None when none says so.

    transformers 5 ignores a `tokenizer_config.json`'s `add_bos_token` when the folder has a
    `tokenizer.json`, so a tokenizer can drop a BOS its own files ask for; the engines compare the two at
    load (`prompt_bos_id`)."""
    if resolved.gguf is not None and gguf_token_settings(resolved.gguf).add_bos_token:
        return f"{resolved.gguf.name}'s tokenizer.ggml.add_bos_token"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(config, "add_bos_token", None) is True or getattr(text, "add_bos_token", None) is True:
        return "its config's add_bos_token"
    for name in dict.fromkeys(n for n in (resolved.model, resolved.tokenizer) if n):
        found = _tokenizer_config(name, revision=resolved.revision)
        if found is not None and found.get("add_bos_token") is True:
            return f"{name}'s tokenizer_config.json add_bos_token"
    return None


def bos_fix(resolved: ResolvedModel) -> str:
    """What to do when `resolved`'s tokenizer drops the BOS its files ask for (for `prompt_bos_id`)."""
    own = {resolved.model, str(resolved.local_dir)}
    if resolved.tokenizer is not None and resolved.tokenizer not in own:
        return (
            f"the job's `tokenizer` ({resolved.tokenizer}) adds none; name one that adds it, or leave "
            "`tokenizer` unset to use the model's own"
        )
    if resolved.converted and resolved.local_dir is not None:
        return (
            f"delete {resolved.local_dir} so that the GGUF file is converted again, or give the job a "
            "`tokenizer` that adds it"
        )
    return "give the job a `tokenizer` that adds it, or make the model's tokenizer.json post-processor add it"


def _tokenizer_config(name: str, *, revision: str | None) -> dict[str, Any] | None:
    """The `tokenizer_config.json` of a folder, or of a hub id from the local Hugging Face cache; None when
    there is none here or it is not a JSON object."""
    folder = Path(name).expanduser()
    file: Path | None = folder / "tokenizer_config.json" if folder.is_dir() else None
    if file is None:
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name, "tokenizer_config.json", revision=revision)
        except Exception:  # not a hub id (huggingface_hub validates it)
            cached = None
        file = Path(cached) if isinstance(cached, str) else None
    try:
        found = json.loads(file.read_text()) if file is not None and file.is_file() else None
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def prompt_bos_id(tokenizer: Any, *, stated: str | None, model: str, fix: str) -> int | None:
    """The BOS token id the prompts of `model` must begin with exactly once, checked at model load: the
    tokenizer's BOS when it adds one to an encoded text, None when it adds none and nothing states the
    model expects one.

    `stated` says where the model states it expects BOS (e.g. "its GGUF file's
    tokenizer.ggml.add_bos_token"), None when nothing does. Raises `PosbiasError` naming `fix` when it is
    stated and the tokenizer adds none (every prompt would begin with an ordinary word, out of distribution
    for the model), or when the tokenizer adds BOS twice."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = [int(i) for i in tokenizer("Read", add_special_tokens=True)["input_ids"]]
    adds = bos is not None and ids[:1] == [bos]
    if stated is not None and not adds:
        has = (
            "has no BOS token"
            if bos is None
            else f"does not add its BOS token (id {bos}) to an encoded prompt"
        )
        raise PosbiasError(
            f"{model} expects every prompt to begin with a BOS token ({stated} says so), but its tokenizer "
            f"{has}; refusing to run it: {fix}"
        )
    if adds and ids[1:2] == [bos]:
        raise PosbiasError(
            f"{model}'s tokenizer adds its BOS token (id {bos}) twice to an encoded prompt; refusing to run "
            f"it: {fix}"
        )
    return bos if adds else None
