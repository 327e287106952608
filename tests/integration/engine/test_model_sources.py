"""Where models come from: hub ids, folders, GGUF files (converted once, cached), and the demo model."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import Conversion, answer_sheet_regex, answer_slots, chat_prompt

from posbias.schemas import PosbiasError, WorkerConfig
from posbias.workers.engine import GenerationRequest
from posbias.workers.models import demo_model_path, resolve_model
from posbias.workers.vllm_engine import VllmEngine

OPTIONS = ("1", "2", "3", "4")


def test_a_hub_id_passes_through(tmp_path: Path) -> None:
    resolved = resolve_model("google/gemma-2-2b-it", revision="main", cache_dir=tmp_path)
    assert resolved.model == "google/gemma-2-2b-it"
    assert resolved.revision == "main"
    assert not resolved.converted
    assert resolved.local_dir is None


def test_a_model_folder_is_used_as_it_is(tiny_llama_dir: Path, tmp_path: Path) -> None:
    resolved = resolve_model(str(tiny_llama_dir), cache_dir=tmp_path)
    assert Path(resolved.model) == tiny_llama_dir.resolve()
    assert not resolved.converted
    assert resolved.tokenizer is None  # the folder's own


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda root: root / "no" / "such" / "model", "does not exist"),
        (lambda root: root / "missing.gguf", "does not exist"),
        (lambda root: root, "has no config.json"),
    ],
    ids=["missing-folder", "missing-gguf", "folder-without-config"],
)
def test_a_bad_model_path_is_one_line_naming_the_fix(
    tmp_path: Path, make: Callable[[Path], Path], says: str
) -> None:
    with pytest.raises(PosbiasError) as caught:
        resolve_model(str(make(tmp_path)), cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert says in message
    assert "\n" not in message


@pytest.mark.vllm
def test_a_bad_model_path_fails_the_engine_before_vllm_starts(
    tmp_path: Path, worker_config: WorkerConfig
) -> None:
    with pytest.raises(PosbiasError, match="does not exist; check the path"):
        VllmEngine(str(tmp_path / "nowhere" / "model"), config=worker_config)


def test_the_demo_model_is_the_installed_smollm2_gguf() -> None:
    path = demo_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000


@pytest.mark.vllm
def test_a_gguf_file_is_converted_once_and_answers(
    worker_config: WorkerConfig, demo_conversion: Conversion, demo_engine: VllmEngine
) -> None:
    gguf = demo_model_path()
    cache = Path(worker_config.cache_dir)

    first = demo_conversion.resolved  # the first resolve in the session's fresh cache, before any engine
    assert first.converted
    folder = Path(first.model)
    assert folder.parent == cache / "models"
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    weights = demo_conversion.weights

    engine = demo_engine  # the session's, loaded from the GGUF file after that resolve
    # The engine's own resolve found the cached folder: same place, same files, nothing rebuilt.
    assert engine.resolved.model == first.model
    again = next(folder.glob("*.safetensors")).stat()
    assert (again.st_ino, again.st_mtime_ns) == (weights.st_ino, weights.st_mtime_ns)
    # One folder for this GGUF file (other tests of the session convert GGUF files of their own here).
    stem = folder.name.rsplit("-", 1)[0]
    assert [p.name for p in (cache / "models").iterdir() if p.is_dir() and p.name.startswith(stem)] == [
        folder.name
    ]

    info = engine.model_info
    assert info.name == str(gguf)
    assert info.architecture == "LlamaForCausalLM"
    assert info.num_layers == 30
    assert info.rope_theta == 100_000.0
    assert info.context_length == 8192
    assert info.num_parameters is not None and 130e6 < info.num_parameters < 140e6  # "135M"
    assert engine.max_model_len == 8192

    questions = (
        "Answer each question with the number of the correct option, one `k. i` line per question.\n\n"
        "1. Question: What is 2 + 2?\n   Choices:\n   1. 3\n   2. 4\n   3. 5\n   4. 22\n\n"
        "2. Question: What is the capital of France?\n   Choices:\n   1. Rome\n   2. Oslo\n   3. Paris\n"
        "   4. Bern"
    )
    prompt = chat_prompt(engine.tokenizer, questions)
    regex = answer_sheet_regex([4, 4])
    [generation] = engine.generate(
        [GenerationRequest(prompt.ids, max_tokens=24, regex=regex, option_labels=OPTIONS)],
        temperature=0.0,
        top_p=1.0,
        seed=None,
    )
    assert re.fullmatch(regex, generation.text), generation.text
    assert generation.top_logprobs is not None
    for slot in answer_slots(generation.text, 2):
        candidates = generation.top_logprobs[generation.token_offsets.index(slot)]
        assert set(candidates) <= set(OPTIONS)
        assert math.fsum(math.exp(lp) for lp in candidates.values()) == pytest.approx(1.0, abs=1e-3)
