"""GGUF files: what their header states, and their conversion into a Hugging Face folder.

The CPU build of vLLM reads no GGUF, so `convert_gguf` converts a file once (with transformers) into a
float32 Hugging Face folder cached under the worker's cache folder, carrying over what transformers leaves
out: the file's `tokenizer.ggml.add_bos_token` and `add_eos_token`. The header is read here without the
gguf package, whose reader parses every tensor's entry first.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.schemas import PosbiasError, one_line

CONVERSION_VERSION = 2
"""The version of `convert_gguf`'s output, part of a converted folder's name, so that a folder made by an
older conversion is never reused (it is converted again beside it). 2: the tokenizer adds BOS and EOS as
the GGUF file's `tokenizer.ggml.add_bos_token` and `add_eos_token` say; 1 dropped them, so Gemma's prompts
began without `<bos>`."""
CONVERSION_STAMP = "posbias-conversion.json"
"""The file in a converted folder that says which conversion made it, from which GGUF file, with what
special-token settings."""


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


def gguf_tokenizer_folder(file: Path, *, cache_dir: str | Path) -> Path | None:
    """The folder whose tokenizer files are the GGUF `file`'s tokenizer, where one is on this machine: its
    conversion (`convert_gguf`), else the tokenizer kept by `gguf_tokenizer`; None before either exists."""
    converted = converted_folder(file, cache_dir=cache_dir)
    if converted is not None:
        return converted
    kept = _kept_tokenizer(file, cache_dir=cache_dir)
    return kept if (kept / "tokenizer_config.json").is_file() else None


def _kept_tokenizer(file: Path, *, cache_dir: str | Path) -> Path:
    folder = _converted_path(file.resolve(), cache_dir=cache_dir)
    return folder.parent.parent / "tokenizers" / folder.name


def gguf_tokenizer(file: Path, *, cache_dir: str | Path) -> Any:
    """A GGUF file's tokenizer (its special-token settings carried over as in `convert_gguf`), kept under
    `cache_dir/tokenizers` after the first read: transformers builds it from the file's vocabulary in
    Python, about 15 s for the demo model on two cores."""
    from transformers import AutoTokenizer

    kept = _kept_tokenizer(file, cache_dir=cache_dir)
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


def _safe_stem(file: Path) -> str:
    return re.sub(r"[^\w.-]+", "_", file.stem)[:80] or "model"
