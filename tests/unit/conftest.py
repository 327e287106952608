"""Fixtures for unit tests: MMLU as a pool (the copy itself: tests/conftest.py), synthetic pools, and the
coverage program (benchmarks/coverage.py) as a module."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from posbias.schemas import DatasetSpec, Question, QuestionPool
from posbias.service.work.datasets import load_questions, question_id


@pytest.fixture(scope="session")
def mmlu_pool(mmlu_dir: Path) -> QuestionPool:
    """MMLU's test split, read from the JSONL layout."""
    return load_questions(DatasetSpec(), mmlu_dir=mmlu_dir)


PoolFactory = Callable[..., QuestionPool]


@pytest.fixture(scope="session")
def make_pool() -> PoolFactory:
    """A factory of synthetic pools: `make_pool(size, n_choices=4, subjects=("alpha", "beta"))`."""
    return synthetic_pool


def synthetic_pool(
    size: int, *, n_choices: int = 4, subjects: tuple[str, ...] = ("alpha", "beta")
) -> QuestionPool:
    """`size` synthetic questions with `n_choices` options each, answers spread over the options."""
    questions = []
    for i in range(size):
        subject = subjects[i % len(subjects)]
        text = f"What is question number {i}?"
        choices = tuple(f"option {k} of question {i}" for k in range(n_choices))
        questions.append(
            Question(
                id=question_id(subject, text, choices),
                subject=subject,
                question=text,
                choices=choices,
                answer=(i * 7) % n_choices,
            )
        )
    questions.sort(key=lambda q: q.id)
    return QuestionPool(questions=tuple(questions), subjects=tuple(sorted(set(subjects))), source="synthetic")


@pytest.fixture(scope="module")
def coverage() -> ModuleType:
    """benchmarks/coverage.py imported as module `coverage_program`: its simulations, replications and
    settings, which unit tests run at a small size."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "coverage.py"
    spec = importlib.util.spec_from_file_location("coverage_program", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["coverage_program"] = module
    spec.loader.exec_module(module)
    return module
