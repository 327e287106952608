"""Fixtures for unit tests: MMLU as a pool (the copy itself: tests/conftest.py) and synthetic pools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from posbias.schemas import DatasetSpec, Question, QuestionPool
from posbias.service.datasets import load_questions, question_id


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
