"""BOS in the prompts vLLM answers: a model whose GGUF file asks for `<bos>` runs with prompts that begin with
it once, and is refused, in one line, with a tokenizer that drops it; and google/gemma-3-270m (the
`gemma3-270m` model, when its packages are installed) tokenizes a prompt starting with `<bos>`, which
posbias's first GGUF conversion dropped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support.tinygguf import BOS_ID, write_tiny_gguf

from posbias.schemas import ChatTemplateUse, PosbiasError, PromptTemplate, Question, Trial, WorkerConfig
from posbias.workers.engine import GenerationRequest
from posbias.workers.models import local_tokenizer
from posbias.workers.named_models import GEMMA3_270M, GEMMA3_270M_INSTALL, GEMMA3_270M_PACKAGE
from posbias.workers.prompts import render
from posbias.workers.vllm_engine import VllmEngine

GEMMA_BOS = 2
"""`<bos>` in Gemma 3's vocabulary."""


def _trial(text: str) -> tuple[Trial, dict[str, Question]]:
    questions = {
        f"q{i}": Question(id=f"q{i}", subject="s", question=text, choices=("one", "each"), answer=0)
        for i in range(2)
    }
    return Trial(index=0, batch_size=2, iteration=0, question_ids=tuple(questions)), questions


@pytest.fixture(scope="module")
def bos_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 GGUF whose header says add_bos_token = True."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "bos.gguf", add_bos_token=True)


@pytest.mark.vllm
def test_vllm_answers_a_prompt_that_begins_with_the_bos_its_gguf_asks_for(
    bos_gguf: Path, worker_config: WorkerConfig
) -> None:
    engine = VllmEngine(str(bos_gguf), config=worker_config)
    try:
        assert engine.tokenizer.prompt_bos_id == BOS_ID
        trial, questions = _trial("Read the questions")
        prompt = render(
            trial,
            questions=questions,
            template=PromptTemplate(),
            chat_template=ChatTemplateUse.off,
            tokenizer=engine.tokenizer,
        )
        ids = list(prompt.token_ids or ())
        assert ids[0] == BOS_ID and ids[1] != BOS_ID
        [generation] = engine.generate(
            [GenerationRequest(ids, max_tokens=2, regex=None, option_labels=None)],
            temperature=0.0,
            top_p=1.0,
            seed=None,
        )
        assert len(generation.token_ids) >= 1
    finally:
        engine.close()


@pytest.mark.vllm
def test_vllm_refuses_a_tokenizer_that_drops_the_bos_its_gguf_asks_for(
    bos_gguf: Path, worker_config: WorkerConfig, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    # The tokenizer as transformers alone converts the file: no BOS.
    AutoTokenizer.from_pretrained(bos_gguf.parent, gguf_file=bos_gguf.name).save_pretrained(tmp_path / "tok")

    with pytest.raises(PosbiasError) as caught:
        VllmEngine(str(bos_gguf), tokenizer=str(tmp_path / "tok"), config=worker_config)

    message = str(caught.value)
    assert "to begin with a BOS token (bos.gguf's tokenizer.ggml.add_bos_token says so)" in message
    assert f"the job's `tokenizer` ({tmp_path / 'tok'}) adds none" in message
    assert "\n" not in message


@pytest.mark.skipif(
    importlib.util.find_spec(GEMMA3_270M_PACKAGE) is None,
    reason=f"{GEMMA3_270M} is not installed (about 253 MB): {GEMMA3_270M_INSTALL}",
)
def test_the_real_gemma3_270m_prompt_begins_with_bos(tmp_path: Path) -> None:
    """The tokenizer read from the file (what the conversion saves, and what a dry run counts with)."""
    tokenizer = local_tokenizer(GEMMA3_270M, cache_dir=tmp_path)
    assert tokenizer is not None
    trial, questions = _trial("What is 2 + 2?")

    prompt = render(
        trial,
        questions=questions,
        template=PromptTemplate(),
        chat_template=ChatTemplateUse.auto,  # the base model's GGUF has no chat template
        tokenizer=tokenizer,
    )

    ids = list(prompt.token_ids or ())
    assert not prompt.chat_template_used
    assert ids[0] == GEMMA_BOS and ids[1] != GEMMA_BOS
    assert tokenizer.decode(ids[:2]) == "<bos>Read"
