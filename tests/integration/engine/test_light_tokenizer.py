"""The views' tokenizer read without transformers (`LightTokenizer`) renders and encodes a prompt exactly as
transformers' own does, for every kind of tokenizer folder the project meets: the tiny Llama, Gemma 2 and
Gemma 3 (their chat templates, BOS inside the template or added by the tokenizer) and the demo GGUF's
conversion. Where they differed, a view would pay transformers' import to rebuild the prompt (its check
against the stored token figures fails), never show a wrong one: `test_trial_view_vllm.py` checks that."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from posbias.workers.engine import Tokenizer
from posbias.workers.light_tokenizer import light_tokenizer
from posbias.workers.tokenizer import HfTokenizer

TEXT = (
    "Read the following multiple choice questions and answer them one by one.\n\n"
    "1. Which of {these} is a «prime»? Ünïcödé, 漢字, emoji 🙂 and   three spaces.\n"
    "1. 4\n2. 6\n3. 7\n4. 9\n\n"
    "2. What is 2+2?\n1. four\n2. five\n\n"
    "Here are the answers to the multiple-choice questions, one index per line:"
)


def _unused() -> Tokenizer:
    raise AssertionError("the light reading needed transformers' own")


@pytest.mark.parametrize("name", ["tiny_llama_dir", "tiny_gemma2_dir", "tiny_gemma3_dir", "demo"])
def test_the_light_reading_renders_and_encodes_as_transformers_does(
    name: str, request: pytest.FixtureRequest
) -> None:
    if name == "demo":
        folder = Path(request.getfixturevalue("demo_conversion").resolved.model)
    else:
        folder = request.getfixturevalue(name)
    full = HfTokenizer(AutoTokenizer.from_pretrained(folder))
    light = light_tokenizer(folder, full=_unused)
    assert light is not None, f"{folder} was not read without transformers"
    assert light.has_chat_template() == full.has_chat_template()
    prompts = [TEXT]
    if full.has_chat_template():
        prompts.append(full.apply_chat_template(TEXT))
        assert light.apply_chat_template(TEXT) == prompts[-1]
    for prompt in prompts:
        for special in (True, False):
            mine, theirs = (
                light.encode(prompt, add_special_tokens=special),
                full.encode(prompt, add_special_tokens=special),
            )
            assert mine.ids == theirs.ids
            assert [tuple(o) for o in mine.offsets] == [tuple(o) for o in theirs.offsets]


def test_a_folder_without_a_tokenizer_json_is_left_to_transformers(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert light_tokenizer(tmp_path, full=_unused) is None
