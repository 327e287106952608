"""Where the questions come from: the dataset a job samples."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from posbias.schemas.bounds import FINITE
from posbias.schemas.record import Record


class NamedDataset(Record):
    """A multiple-choice set posbias knows by name (`--dataset NAME`): where it is on the hub, its layout."""

    name: str = Field(description="posbias's name for it, e.g. `arc-challenge`.")
    title: str = Field(description="What it is, in a few words.")
    hub_id: str = Field(description="Hugging Face dataset id.")
    config: str | None = Field(
        None, description="The hub dataset's configuration (subset), if it has several."
    )
    split: str = Field(
        description="The split used unless a spec names another (one whose answers are public)."
    )
    questions: int = Field(
        description="Questions in that split on the hub (rows, before duplicates are dropped)."
    )
    options: int = Field(description="Options per question (the most any question has; chance is 1/options).")
    question_column: str = Field(description="Column holding the question text.")
    choices_column: str = Field(description="Column holding the options.")
    answer_column: str = Field(description="Column holding the gold option.")
    subject_column: str | None = Field(
        None, description="Column holding the subject; None when there is none."
    )

    def layout(self) -> dict[str, Any]:
        """The `DatasetSpec` fields this dataset fills in (split and columns)."""
        return {
            "split": self.split,
            "question_column": self.question_column,
            "choices_column": self.choices_column,
            "answer_column": self.answer_column,
            "subject_column": self.subject_column,
        }


NAMED_DATASETS: dict[str, NamedDataset] = {
    d.name: d
    for d in (
        NamedDataset(
            name="mmlu",
            title="MMLU, 57 subjects",
            hub_id="cais/mmlu",
            config="all",
            split="test",
            questions=14_042,
            options=4,
            question_column="question",
            choices_column="choices",
            answer_column="answer",
            subject_column="subject",
        ),
        NamedDataset(
            name="mmlu-pro",
            title="MMLU-Pro, 14 categories, up to 10 options",
            hub_id="TIGER-Lab/MMLU-Pro",
            split="test",
            questions=12_032,
            options=10,
            question_column="question",
            choices_column="options",
            answer_column="answer",
            subject_column="category",
        ),
        NamedDataset(
            name="arc-challenge",
            title="AI2 ARC, challenge set (grade-school science)",
            hub_id="allenai/ai2_arc",
            config="ARC-Challenge",
            split="test",
            questions=1_172,
            options=5,
            question_column="question",
            choices_column="choices",
            answer_column="answerKey",
        ),
        NamedDataset(
            name="arc-easy",
            title="AI2 ARC, easy set (grade-school science)",
            hub_id="allenai/ai2_arc",
            config="ARC-Easy",
            split="test",
            questions=2_376,
            options=5,
            question_column="question",
            choices_column="choices",
            answer_column="answerKey",
        ),
        NamedDataset(
            name="commonsense-qa",
            title="CommonsenseQA (its test split has no answers: validation)",
            hub_id="tau/commonsense_qa",
            split="validation",
            questions=1_221,
            options=5,
            question_column="question",
            choices_column="choices",
            answer_column="answerKey",
        ),
        NamedDataset(
            name="openbookqa",
            title="OpenBookQA (elementary science, main set)",
            hub_id="allenai/openbookqa",
            config="main",
            split="test",
            questions=500,
            options=4,
            question_column="question_stem",
            choices_column="choices",
            answer_column="answerKey",
        ),
        NamedDataset(
            name="hellaswag",
            title="HellaSwag, sentence endings (its test split has no answers: validation)",
            hub_id="Rowan/hellaswag",
            split="validation",
            questions=10_042,
            options=4,
            question_column="ctx",
            choices_column="endings",
            answer_column="label",
            subject_column="activity_label",
        ),
    )
}
"""The datasets `--dataset NAME` takes, by name."""


class DatasetSpec(Record):
    """Where the questions come from."""

    model_config = FINITE

    name: str = Field(
        "cais/mmlu",
        min_length=1,
        max_length=500,
        description="A named dataset (`mmlu`, `mmlu-pro`, `arc-challenge`, `arc-easy`, `commonsense-qa`, "
        "`openbookqa`, `hellaswag`: `posbias datasets` lists them; split and columns filled in), or a "
        "Hugging Face dataset id; `cais/mmlu` (the default) also loads from a local MMLU copy.",
    )
    path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Local folder or file to read instead of the hub (MMLU CSV/JSONL layouts, or any "
        "CSV/JSON/JSONL/Parquet file with the columns below). Defaults to POSBIAS_MMLU_DIR for MMLU. "
        "A relative path in a spec file is read from the spec file's folder (and stored absolute).",
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

    @model_validator(mode="before")
    @classmethod
    def _named_layout(cls, data: Any) -> Any:
        """A named dataset's split and columns, where the spec does not give its own."""
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"] in NAMED_DATASETS:
            return {**NAMED_DATASETS[data["name"]].layout(), **data}
        return data

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

    @property
    def named(self) -> NamedDataset | None:
        """The named dataset this spec reads (MMLU under either of its names), or None."""
        return NAMED_DATASETS["mmlu"] if self.is_mmlu else NAMED_DATASETS.get(self.name)


class DatasetInfo(Record):
    """A named dataset as this machine sees it (`posbias datasets`): where it is and how large its copy is."""

    dataset: NamedDataset = Field(description="The dataset and its layout.")
    local_copy: str | None = Field(None, description="The local copy read instead of the hub; None: the hub.")
    local_questions: int | None = Field(None, description="Distinct questions in the local copy.")
    local_options: int | None = Field(None, description="Most options of a question in the local copy.")
    problem: str | None = Field(None, description="Why the local copy cannot be read, when it cannot.")
