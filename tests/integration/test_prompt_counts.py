"""Prompts counted from their pieces with real models' tokenizers, against the same prompts tokenized whole:
the demo model's (SmolLM2's byte-level BPE, read from its GGUF file, with its chat template) and a tiny
Gemma 2 folder's, through a vLLM job's dry run, whose sliding window (64 tokens) most answers reach past.
The fake engine's tokenizer and tiny in-memory BPE tokenizers: tests/unit/test_prompt_tokens.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.tinymodels import tiny_model

from posbias.schemas import DatasetSpec, JobSpec, QuestionPool
from posbias.service.settings import Settings
from posbias.service.work import planner, submission
from posbias.service.work.datasets import load_questions
from posbias.workers.engine import Tokenizer
from posbias.workers.models import local_tokenizer
from posbias.workers.prompt_tokens import PromptCounter

CASES = [
    {"design": "random", "answer_order": "random", "shuffle_choices": True, "filler": {"where": "end"}},
    {"design": "rotation", "chat_template": "off", "filler": {"where": "before"}},
    {"design": "probe", "shuffle_choices": True, "filler": {"where": "after", "position": 2}},
    {"design": "random", "answer_order": "reverse", "chat_template": "off", "filler": {"where": "end"}},
]
IDS = ["random-random-end", "rotation-before-no-template", "probe-after", "random-reverse-end-no-template"]


def _spec(case: dict[str, Any], *, model: str = "m", engine: str = "fake", **fields: Any) -> JobSpec:
    filler = {"tokens": [0, 1, 9, 120, 1500], **case["filler"]}
    return JobSpec.model_validate(
        {
            "model": model,
            "engine": {"name": engine},
            "batch_sizes": [3, 5],
            "iterations": 2,
            **{key: value for key, value in case.items() if key != "filler"},
            "filler": filler,
            **fields,
        }
    )


@pytest.fixture(scope="module")
def pool(mmlu_dir: Path) -> QuestionPool:
    return load_questions(DatasetSpec(), mmlu_dir=mmlu_dir)


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The demo model's tokenizer, read from its GGUF file (about 15 s on two cores)."""
    tokenizer = local_tokenizer("demo", cache_dir=tmp_path_factory.mktemp("cache"))
    assert tokenizer is not None and tokenizer.has_chat_template()
    return tokenizer


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_demo_models_tokenizer_counts_prompts_from_pieces_as_whole(
    case: dict[str, Any], pool: QuestionPool, demo_tokenizer: Tokenizer
) -> None:
    spec = _spec(case)
    planned = planner.plan(spec, pool=pool)
    counter = PromptCounter.for_spec(spec, questions=planned.questions, tokenizer=demo_tokenizer)
    for trial in planned.trials:
        assert counter.count(trial) == counter.whole(trial), (trial.index, trial.filler_tokens)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_vllm_jobs_dry_run_shows_what_tokenizing_every_prompt_whole_shows(
    case: dict[str, Any], mmlu_dir: Path, tmp_path: Path
) -> None:
    """The job's tokenizer is the tiny Gemma 2's own (a model's: it states no reach, so the dry run checks
    its counts against whole prompts), and its sliding window comes from the folder's config."""
    folder = tiny_model(architecture="gemma2", sliding_window=64)
    settings = Settings(mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")
    spec = _spec(case, model=str(folder), engine="vllm")
    prepared = submission.prepare(spec, settings=settings)
    fast = submission.dry_run(prepared, settings=settings)
    whole = submission._dry_run(
        prepared, settings=settings, sample=submission.SAMPLE_TRIALS, on_progress=None, whole=True
    )
    assert fast.model_dump(exclude={"counting"}) == whole.model_dump(exclude={"counting"})
    assert fast.tokenizer == "the model's tokenizer" and fast.sliding_window == 64
    assert fast.counting.endswith("; 2 prompts tokenized whole agreed"), fast.counting
    assert any((d.past_window or 0) > 0 for d in fast.designs)
