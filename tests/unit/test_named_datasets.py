"""Named datasets (`--dataset NAME`): each loads from a local copy written in its hub layout (the hub's file
names and columns), with the right number of options and the right gold answer; a spec names the layout it
used, so a stored job reads the same questions again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from posbias.schemas import NAMED_DATASETS, DatasetSpec, JobSpec, PosbiasError
from posbias.service.work.dataset_catalog import describe
from posbias.service.work.datasets import load_questions


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _labelled(texts: list[str], labels: str = "ABCDE") -> dict[str, list[str]]:
    return {"text": texts, "label": list(labels[: len(texts)])}


# Each dataset: rows in its hub layout, and per question text the gold option's text and the option count.
LAYOUTS: dict[str, tuple[str, list[dict[str, Any]], dict[str, tuple[str, int]]]] = {
    "mmlu": (
        "mmlu/mmlu_test.jsonl",
        [
            {"question": "2 + 2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1},
            {
                "question": "Capital of France?",
                "subject": "geo",
                "choices": ["Rome", "Oslo", "Paris", "Bern"],
                "answer": 2,
            },
        ],
        {"2 + 2?": ("4", 4), "Capital of France?": ("Paris", 4)},
    ),
    "mmlu-pro": (
        "mmlu-pro/data/test-00000-of-00001.parquet",
        [
            {
                "question_id": 70,
                "question": "Which is the largest?",
                "options": [str(n) for n in range(10)],
                "answer": "J",
                "answer_index": 9,
                "cot_content": "",
                "category": "math",
                "src": "ori_mmlu-high_school_mathematics",
            },
            {
                "question_id": 71,
                "question": "Which law?",
                "options": ["tort", "contract", "property"],  # MMLU-Pro drops some options: fewer than 10
                "answer": "B",
                "answer_index": 1,
                "cot_content": "",
                "category": "law",
                "src": "stemez-Law",
            },
        ],
        {"Which is the largest?": ("9", 10), "Which law?": ("contract", 3)},
    ),
    "arc-challenge": (
        "arc-challenge/ARC-Challenge/test-00000-of-00001.parquet",
        [
            {
                "id": "Mercury_7175875",
                "question": "Which gas do plants take in?",
                "choices": _labelled(["oxygen", "carbon dioxide", "helium", "neon"]),
                "answerKey": "B",
            },
            {
                "id": "NYSEDREGENTS_2015_8_28",
                "question": "Which is a mammal?",
                "choices": {"text": ["shark", "whale", "trout"], "label": ["1", "2", "3"]},  # numeric labels
                "answerKey": "2",
            },
        ],
        {"Which gas do plants take in?": ("carbon dioxide", 4), "Which is a mammal?": ("whale", 3)},
    ),
    "arc-easy": (
        "arc-easy/test.jsonl",
        [
            {
                "id": "Mercury_417466",
                "question": "What melts ice?",
                "choices": _labelled(["heat", "cold", "dark", "wind", "salt"]),
                "answerKey": "A",
            },
        ],
        {"What melts ice?": ("heat", 5)},
    ),
    "commonsense-qa": (
        "commonsense-qa/data/validation-00000-of-00001.parquet",
        [
            {
                "id": "1afa02df02c908a558b4036e80242fac",
                "question": "A revolving door is convenient for two direction travel, but also serves as a "
                "security measure at a what?",
                "question_concept": "revolving door",
                "choices": _labelled(["bank", "library", "department store", "mall", "new york"]),
                "answerKey": "A",
            },
        ],
        {
            "A revolving door is convenient for two direction travel, but also serves as a security measure "
            "at a what?": ("bank", 5)
        },
    ),
    "openbookqa": (
        "openbookqa/main/test-00000-of-00001.parquet",
        [
            {
                "id": "8-343",
                "question_stem": "A person wants to save money to afford a nice vacation",
                "choices": _labelled(["make more phone calls", "quit eating lunch out", "buy less", "go on"]),
                "answerKey": "B",
            },
        ],
        {
            "A person wants to save money to afford a nice vacation": (
                "quit eating lunch out",
                4,
            )
        },
    ),
    "hellaswag": (
        "hellaswag/validation.jsonl",
        [
            {
                "ind": 24,
                "activity_label": "Roof shingle removal",
                "ctx_a": "A man is sitting on a roof.",
                "ctx_b": "he",
                "ctx": "A man is sitting on a roof. he",
                "endings": [
                    "is using wrap",
                    "is ripping level tiles off",
                    "is holding a rubik's cube",
                    "starts",
                ],
                "source_id": "activitynet~v_-JhWjGDPHMY",
                "split": "val",
                "split_type": "indomain",
                "label": "3",
            },
        ],
        {"A man is sitting on a roof. he": ("starts", 4)},
    ),
}


@pytest.fixture
def copies(tmp_path: Path) -> Path:
    """A folder of local copies, every named dataset in its hub layout (ARC's download holds both sets)."""
    for where, rows, _ in LAYOUTS.values():
        (_parquet if where.endswith(".parquet") else _jsonl)(tmp_path / where, rows)
    other = [{"id": "x", "question": "Not this set?", "choices": _labelled(["a", "b"]), "answerKey": "A"}]
    _parquet(tmp_path / "arc-challenge" / "ARC-Easy" / "test-00000-of-00001.parquet", other)
    return tmp_path


def test_every_named_dataset_has_a_layout_here() -> None:
    assert sorted(LAYOUTS) == sorted(NAMED_DATASETS)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_named_dataset_loads_from_its_hub_layout(name: str, copies: Path) -> None:
    pool = load_questions(DatasetSpec(name=name), mmlu_dir=None, datasets_dir=copies)

    expected = LAYOUTS[name][2]
    assert sorted(q.question for q in pool.questions) == sorted(expected)
    for question in pool.questions:
        gold, options = expected[question.question]
        assert len(question.choices) == options
        assert question.choices[question.answer] == gold
    assert name in pool.source or "mmlu_test.jsonl" in pool.source


def test_subjects_come_from_the_dataset_s_own_column(copies: Path) -> None:
    pro = load_questions(DatasetSpec(name="mmlu-pro", subjects=["law"]), mmlu_dir=None, datasets_dir=copies)
    swag = load_questions(DatasetSpec(name="hellaswag"), mmlu_dir=None, datasets_dir=copies)

    assert [q.question for q in pro.questions] == ["Which law?"]
    assert swag.subjects == ("Roof shingle removal",)


def test_a_spec_stores_the_layout_it_read() -> None:
    spec = JobSpec.model_validate({"model": "fake", "dataset": {"name": "openbookqa"}})
    stored = json.loads(spec.model_dump_json())

    assert stored["dataset"]["question_column"] == "question_stem"
    assert stored["dataset"]["split"] == "test" and stored["dataset"]["subject_column"] is None
    assert JobSpec.model_validate(stored) == spec
    own = DatasetSpec(name="commonsense-qa", split="train")
    assert own.split == "train" and own.answer_column == "answerKey"
    # MMLU by either name is the default spec: an old job's hash does not move.
    assert DatasetSpec(name="mmlu").model_dump(exclude={"name"}) == DatasetSpec().model_dump(exclude={"name"})


def test_a_missing_split_of_a_copy_names_where_to_put_it(copies: Path) -> None:
    spec = DatasetSpec(name="arc-easy", split="validation")
    with pytest.raises(PosbiasError, match=r"arc-easy/validation\.jsonl"):
        load_questions(spec, mmlu_dir=None, datasets_dir=copies / "nothing-here")


def test_the_catalog_counts_what_each_copy_holds(copies: Path, tmp_path: Path) -> None:
    found = {info.dataset.name: info for info in describe(mmlu_dir=None, datasets_dir=copies)}

    assert found["mmlu-pro"].local_questions == 2 and found["mmlu-pro"].local_options == 10
    assert found["arc-challenge"].local_questions == 2  # ARC-Easy's file in the same download is not read
    assert found["commonsense-qa"].local_options == 5
    assert all(info.local_copy is not None and info.problem is None for info in found.values())
    empty = describe(mmlu_dir=None, datasets_dir=tmp_path / "none")
    assert all(info.local_copy is None and info.local_questions is None for info in empty)
