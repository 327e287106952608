"""A GGUF file's special-token settings survive its conversion, and a model whose files ask for BOS is run
only with prompts that begin with it once: a tiny Gemma 3 GGUF written here (support.tinygguf) whose
header says `tokenizer.ggml.add_bos_token`, as google/gemma-3-270m's does (transformers drops it, so that
model's prompts began with "Read" instead of `<bos>`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from support.tinygguf import BOS_ID, EOS_ID, write_tiny_gguf

from posbias.schemas import (
    ChatTemplateUse,
    EngineOptions,
    PosbiasError,
    PromptTemplate,
    Question,
    Trial,
    WorkerConfig,
)
from posbias.workers.gguf_files import CONVERSION_STAMP, convert_gguf, gguf_token_settings
from posbias.workers.hf_build import build_model
from posbias.workers.models import local_tokenizer, resolve_model
from posbias.workers.prompt_bos import prompt_bos_id, stated_bos
from posbias.workers.prompts import render
from posbias.workers.tokenizer import HfTokenizer

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>user\n{{ message['content'] }}<end_of_turn>\n"
    "{% endfor %}<start_of_turn>model\n"
)
"""Gemma's chat template in short: it writes BOS itself."""
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


def test_the_load_check_returns_the_bos_a_tokenizer_adds(converted: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)

    assert prompt_bos_id(tokenizer, stated="the file", model="m", fix="fix it") == BOS_ID
    assert prompt_bos_id(tokenizer, stated=None, model="m", fix="fix it") == BOS_ID


def test_the_load_check_refuses_a_tokenizer_that_drops_a_stated_bos(dropping_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dropping_tokenizer)

    with pytest.raises(
        PosbiasError, match=r"expects every prompt to begin with a BOS token \(the file says so\)"
    ):
        prompt_bos_id(tokenizer, stated="the file", model="m", fix="fix it")
    assert prompt_bos_id(tokenizer, stated=None, model="m", fix="fix it") is None  # nothing asks for one


def test_the_gguf_and_a_tokenizer_config_state_bos(bos_gguf: Path, converted: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(converted)
    resolved = resolve_model(str(bos_gguf), cache_dir=converted.parent.parent)
    assert stated_bos(resolved, config=config) == "bos.gguf's tokenizer.ggml.add_bos_token"

    folder = resolve_model(str(converted), cache_dir=tmp_path)  # the converted folder given as a folder
    assert stated_bos(folder, config=config) == f"{converted}'s tokenizer_config.json add_bos_token"


def test_the_hf_engine_refuses_a_tokenizer_that_drops_the_bos_its_model_asks_for(
    bos_gguf: Path, converted: Path, dropping_tokenizer: Path
) -> None:
    config = WorkerConfig(cache_dir=str(converted.parent.parent))
    options = EngineOptions(name="hf")

    with pytest.raises(
        PosbiasError,
        match=r"bos\.gguf's tokenizer\.ggml\.add_bos_token says so.*job's `tokenizer`.*adds none",
    ):
        build_model(
            str(bos_gguf),
            revision=None,
            tokenizer=str(dropping_tokenizer),
            options=options,
            overrides={},
            config=config,
        )
    built = build_model(
        str(bos_gguf), revision=None, tokenizer=None, options=options, overrides={}, config=config
    )
    assert built.tokenizer.prompt_bos_id == BOS_ID


def _trial() -> tuple[Trial, dict[str, Question]]:
    questions = {
        f"q{i}": Question(
            id=f"q{i}", subject="s", question="Read the questions", choices=("one", "each"), answer=0
        )
        for i in range(2)
    }
    return Trial(index=0, batch_size=2, iteration=0, question_ids=tuple(questions)), questions


@pytest.mark.parametrize(
    "chat_template", [ChatTemplateUse.off, ChatTemplateUse.on], ids=["plain", "template"]
)
def test_a_rendered_prompt_begins_with_bos_exactly_once(
    converted: Path, chat_template: ChatTemplateUse
) -> None:
    """Plain: the tokenizer adds BOS. Template: the template writes it and the tokenizer adds none."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(converted)
    loaded.chat_template = GEMMA_TEMPLATE
    trial, questions = _trial()

    prompt = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=chat_template,
        tokenizer=HfTokenizer(loaded, prompt_bos_id=BOS_ID),
    )

    assert prompt.token_ids is not None
    assert prompt.token_ids[0] == BOS_ID and prompt.token_ids[1] != BOS_ID
    assert prompt.chat_template_used is (chat_template is ChatTemplateUse.on)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (GEMMA_TEMPLATE.replace("{{ bos_token }}", ""), "does not begin with the model's BOS token"),
        ("{{ bos_token }}" + GEMMA_TEMPLATE, "begins with the model's BOS token \\(id 2\\) twice"),
    ],
    ids=["template-without-bos", "template-writing-bos-twice"],
)
def test_a_prompt_without_bos_or_with_two_is_refused(converted: Path, template: str, message: str) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(converted)
    loaded.chat_template = template
    trial, questions = _trial()

    with pytest.raises(PosbiasError, match=message):
        render(
            trial,
            questions=questions,
            template=PromptTemplate(),
            chat_template=ChatTemplateUse.on,
            tokenizer=HfTokenizer(loaded, prompt_bos_id=BOS_ID),
        )
