"""A GGUF file's special-token settings survive its conversion: a tiny Gemma 3 GGUF written here
(support.tinygguf) whose header says `tokenizer.ggml.add_bos_token`, as google/gemma-3-270m's does
(transformers drops it, so that model's prompts began with "Read" instead of `<bos>`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from support.tinygguf import BOS_ID, EOS_ID, write_tiny_gguf

from posbias.schemas import PosbiasError
from posbias.workers.models import (
    CONVERSION_STAMP,
    convert_gguf,
    gguf_token_settings,
    local_tokenizer,
)

TEXT = "Read the questions and answer each one"


def _ids(folder: Path, text: str = TEXT) -> list[int]:
    from transformers import AutoTokenizer

    return [int(i) for i in AutoTokenizer.from_pretrained(folder)(text)["input_ids"]]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def bos_gguf(gguf_dir: Path) -> Path:
    """A tiny Gemma 3 GGUF whose header says add_bos_token = True and add_eos_token = False."""
    return write_tiny_gguf(gguf_dir / "bos.gguf", add_bos_token=True, add_eos_token=False)


@pytest.fixture(scope="module")
def converted(bos_gguf: Path, gguf_dir: Path) -> Path:
    return convert_gguf(bos_gguf, cache_dir=gguf_dir / "cache")


@pytest.fixture(scope="module")
def dropping_tokenizer(bos_gguf: Path, gguf_dir: Path) -> Path:
    """The tokenizer as transformers alone converts the file (and as posbias's first conversion kept it):
    it adds no BOS."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bos_gguf.parent, gguf_file=bos_gguf.name)
    assert tokenizer(TEXT)["input_ids"][0] != BOS_ID  # what this file's conversion has to put right
    folder = gguf_dir / "dropping-tokenizer"
    tokenizer.save_pretrained(folder)
    return folder


def test_the_header_states_the_files_special_token_settings(bos_gguf: Path) -> None:
    settings = gguf_token_settings(bos_gguf)

    assert (settings.add_bos_token, settings.add_eos_token, settings.add_sep_token) == (True, False, None)
    assert settings.special_ids == {"bos_token": 2, "eos_token": 1, "unk_token": 3, "pad_token": 0}


def test_a_gguf_that_adds_bos_converts_into_a_tokenizer_that_adds_it(converted: Path) -> None:
    ids = _ids(converted)

    assert ids[0] == BOS_ID and ids[1] != BOS_ID
    assert ids[-1] != EOS_ID
    assert json.loads((converted / "tokenizer_config.json").read_text())["add_bos_token"] is True
    stamp = json.loads((converted / CONVERSION_STAMP).read_text())
    assert stamp["conversion"] == 2 and stamp["tokenizer"] == {"add_bos_token": True, "add_eos_token": False}


@pytest.mark.parametrize(
    ("flags", "first_is_bos", "last_is_eos"),
    [
        ({"add_bos_token": False}, False, False),
        ({"add_bos_token": True, "add_eos_token": True}, True, True),
        ({"add_bos_token": None}, False, False),  # the file says nothing: transformers' default stays
    ],
    ids=["no-bos", "bos-and-eos", "unstated"],
)
def test_the_conversion_adds_bos_and_eos_exactly_as_the_file_says(
    flags: dict[str, Any], first_is_bos: bool, last_is_eos: bool, tmp_path: Path
) -> None:
    file = write_tiny_gguf(tmp_path / "model.gguf", **flags)
    ids = _ids(convert_gguf(file, cache_dir=tmp_path / "cache"))

    assert (ids[0] == BOS_ID, ids[-1] == EOS_ID) == (first_is_bos, last_is_eos)


def test_the_tokenizer_read_from_an_unconverted_gguf_adds_bos_too(bos_gguf: Path, tmp_path: Path) -> None:
    """The dry run's token counts read the file's tokenizer without converting the weights."""
    tokenizer = local_tokenizer(str(bos_gguf), cache_dir=tmp_path)

    assert tokenizer is not None
    assert tokenizer.encode(TEXT, add_special_tokens=True).ids[0] == BOS_ID
    again = local_tokenizer(str(bos_gguf), cache_dir=tmp_path)  # from the kept copy this time
    assert again is not None and again.encode(TEXT, add_special_tokens=True).ids[0] == BOS_ID


def test_a_folder_from_the_first_conversion_is_not_reused(bos_gguf: Path, dropping_tokenizer: Path) -> None:
    """A user's cache holds folders converted before BOS was carried over, under the first conversion's
    name: the next job converts the file afresh beside it rather than run the tokenizer that drops BOS."""
    cache = bos_gguf.parent / "stale-cache"
    stat = bos_gguf.resolve().stat()
    first = f"{bos_gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    stale = cache / "models" / f"bos-{hashlib.sha256(first.encode()).hexdigest()[:16]}"
    stale.mkdir(parents=True)
    for file in dropping_tokenizer.iterdir():
        (stale / file.name).write_bytes(file.read_bytes())
    (stale / "config.json").write_text("{}")

    folder = convert_gguf(bos_gguf, cache_dir=cache)

    assert folder != stale
    assert _ids(folder)[0] == BOS_ID


def test_a_gguf_that_adds_a_separator_is_refused_at_conversion(tmp_path: Path) -> None:
    file = write_tiny_gguf(tmp_path / "sep.gguf", add_bos_token=True, add_sep_token=True)

    with pytest.raises(PosbiasError, match=r"add_sep_token.*Hugging Face id or folder"):
        convert_gguf(file, cache_dir=tmp_path / "cache")
