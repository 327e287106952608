"""Where the questions come from: the dataset a job samples."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from posbias.schemas.bounds import FINITE
from posbias.schemas.record import Record


class DatasetSpec(Record):
    """Where the questions come from."""

    model_config = FINITE

    name: str = Field(
        "cais/mmlu",
        min_length=1,
        max_length=500,
        description="Hugging Face dataset id; `cais/mmlu` (the default) also loads from a local MMLU copy.",
    )
    path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Local folder or file to read instead of the hub (MMLU CSV/JSONL layouts, or any "
        "CSV/JSON/JSONL/Parquet file with the columns below). Defaults to POSBIAS_MMLU_DIR for MMLU.",
    )
    split: str = Field(
        "test", min_length=1, max_length=200, description="Dataset split to sample questions from."
    )
    subjects: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] | None = Field(
        None, max_length=10_000, description="Subjects to sample from; all subjects when empty."
    )
    question_column: str = Field(
        "question", min_length=1, max_length=200, description="Column holding the question text."
    )
    choices_column: str = Field(
        "choices",
        min_length=1,
        max_length=1000,
        description="Column holding the options: a list of texts, or a mapping of labels to texts (then "
        "the answer is a label); for a CSV, the option columns, e.g. `A,B,C,D`.",
    )
    answer_column: str = Field(
        "answer",
        min_length=1,
        max_length=200,
        description="Column holding the gold option: a 0-based index or a letter (A, B, ...), or a label.",
    )
    subject_column: str | None = Field(
        "subject",
        min_length=1,
        max_length=200,
        description="Column holding the subject; None when the data has no subjects.",
    )

    @field_validator("subjects", mode="before")
    @classmethod
    def _split_subjects(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple) and not value:
            return None
        return value

    @property
    def is_mmlu(self) -> bool:
        """True for MMLU, which has a known local layout and subject list."""
        return self.name in {"cais/mmlu", "mmlu"}
