"""Loading question pools: MMLU in both local layouts, other datasets from files, and the errors users see."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import constants

from posbias.schemas import DatasetSpec, JobSpec, PosbiasError, QuestionPool
from posbias.service.work.datasets import check_pool, load_questions, question_id


def test_both_mmlu_layouts_load_the_same_questions(mmlu_dir: Path, mmlu_pool: QuestionPool) -> None:
    from_csv = load_questions(DatasetSpec(), mmlu_dir=mmlu_dir / "csv")

    assert "mmlu_test.jsonl" in mmlu_pool.source
    assert "CSV" in from_csv.source
    assert [q.id for q in from_csv.questions] == [q.id for q in mmlu_pool.questions]
    assert from_csv.questions == mmlu_pool.questions
    assert len(mmlu_pool.subjects) == 57


def test_mmlu_pool_matches_the_release_files(mmlu_dir: Path, mmlu_pool: QuestionPool) -> None:
    counts = json.loads((mmlu_dir / "csv" / "counts.json").read_text())["test"]
    assert sum(counts.values()) == 14042
    # The test split repeats 27 questions verbatim (same subject, text and options); each is kept once.
    assert len(mmlu_pool) == 14042 - 27
    ids = [q.id for q in mmlu_pool.questions]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[a-z_]+/[0-9a-f]{12}", qid) for qid in ids)

    with (mmlu_dir / "csv" / "test" / "anatomy_test.csv").open(newline="") as handle:
        first = next(csv.reader(handle))
    by_id = mmlu_pool.by_id()
    question = by_id[question_id("anatomy", first[0], first[1:5])]
    assert question.choices == tuple(first[1:5])
    assert question.choices[question.answer] == first[1 + "ABCD".index(first[5])]


def test_val_split_loads_under_either_name(mmlu_dir: Path) -> None:
    val = load_questions(DatasetSpec(split="val"), mmlu_dir=mmlu_dir)
    validation = load_questions(DatasetSpec(split="validation"), mmlu_dir=mmlu_dir / "csv")
    assert val.questions == validation.questions
    assert len(val) > 1000


def test_dataset_path_takes_precedence_over_mmlu_dir(mmlu_dir: Path, tmp_path: Path) -> None:
    pool = load_questions(DatasetSpec(path=str(mmlu_dir), split="dev"), mmlu_dir=tmp_path / "nothing")
    assert len(pool) == 57 * 5 - 1  # dev holds 5 per subject, one of them twice


def _write_release_csvs(folder: Path, split: str, rows: dict[str, list[list[str]]]) -> None:
    folder.mkdir(parents=True)
    for subject, subject_rows in rows.items():
        with (folder / f"{subject}_{split}.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows(subject_rows)


SMALL_MMLU = {
    "astronomy": [["Which planet is largest?", "Mars", "Jupiter", "Venus", "Earth", "B"]],
    "virology": [
        ['A question, with "quotes" and a comma?', "yes", "no", "maybe", "never", "D"],
        ["Second?", "a", "b", "c", "d", "A"],
    ],
}


def test_small_mmlu_copy_in_both_layouts(tmp_path: Path) -> None:
    _write_release_csvs(tmp_path / "release" / "test", "test", SMALL_MMLU)
    with (tmp_path / "mmlu_test.jsonl").open("w") as handle:
        for subject, rows in SMALL_MMLU.items():
            for row in rows:
                record = {
                    "question": row[0],
                    "subject": subject,
                    "choices": row[1:5],
                    "answer": "ABCD".index(row[5]),
                }
                handle.write(json.dumps(record) + "\n")

    from_csv = load_questions(DatasetSpec(path=str(tmp_path / "release")), mmlu_dir=None)
    from_jsonl = load_questions(DatasetSpec(), mmlu_dir=tmp_path)

    assert from_csv.questions == from_jsonl.questions
    assert from_csv.subjects == ("astronomy", "virology")
    largest = next(q for q in from_csv.questions if q.subject == "astronomy")
    assert largest.choices[largest.answer] == "Jupiter"


def test_question_ids_depend_on_content_only() -> None:
    qid = question_id("anatomy", "What?", ["a", "b"])
    assert qid == question_id("anatomy", "What?", ("a", "b"))
    assert qid.startswith("anatomy/")
    assert qid != question_id("anatomy", "What?", ["b", "a"])
    assert qid != question_id("anatomy", "What? ", ["a", "b"])
    assert qid != question_id("virology", "What?", ["a", "b"])


def test_subjects_filter(mmlu_dir: Path) -> None:
    pool = load_questions(DatasetSpec(subjects="anatomy,virology"), mmlu_dir=mmlu_dir)
    assert pool.subjects == ("anatomy", "virology")
    assert {q.subject for q in pool.questions} == {"anatomy", "virology"}
    assert len(pool) == 135 + 166


def test_unknown_subject_lists_the_valid_ones(mmlu_dir: Path) -> None:
    with pytest.raises(PosbiasError) as error:
        load_questions(DatasetSpec(subjects=("anatomy", "astrology")), mmlu_dir=mmlu_dir)
    message = str(error.value)
    assert "astrology" in message
    assert "anatomy, astronomy, business_ethics" in message
    assert "\n" not in message


def test_missing_mmlu_folder_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PosbiasError, match="POSBIAS_MMLU_DIR") as error:
        load_questions(DatasetSpec(), mmlu_dir=tmp_path / "absent")
    assert str(tmp_path / "absent") in str(error.value)


def test_folder_without_the_split_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(PosbiasError, match=r"mmlu_test\.jsonl.*csv/test/<subject>_test\.csv"):
        load_questions(DatasetSpec(), mmlu_dir=tmp_path)


def test_unreachable_hub_fails_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 on localhost refuses connections: a hub that cannot be reached, on any machine.
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(PosbiasError) as error:
        load_questions(DatasetSpec(), mmlu_dir=None)
    message = str(error.value)
    assert "cais/mmlu" in message
    assert "set POSBIAS_MMLU_DIR to a local MMLU copy or pass dataset.path" in message


def test_offline_hub_fails_with_the_fix(tmp_path: Path) -> None:
    # HF_HUB_OFFLINE is read when the hub client is imported, so this runs in a fresh interpreter.
    script = (
        "from schemas import DatasetSpec, PosbiasError\n"
        "from service.work.datasets import load_questions\n"
        "try:\n"
        "    load_questions(DatasetSpec(), mmlu_dir=None)\n"
        "except PosbiasError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "HF_DATASETS_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "cannot load the Hugging Face hub (cais/mmlu, all, split test)" in done.stdout
    assert "POSBIAS_MMLU_DIR" in done.stdout


def test_csv_file_with_option_columns_and_letter_answers(tmp_path: Path) -> None:
    file = tmp_path / "quiz.csv"
    with file.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "A", "B", "C", "D", "E", "key", "topic"])
        writer.writerow(["Three options?", "x", "y", "z", "", "", "C", "letters"])
        writer.writerow(["Five options?", "1", "2", "3", "4", "5", "E", "numbers"])
    spec = DatasetSpec(
        name="local/quiz",
        path=str(file),
        question_column="prompt",
        choices_column="A,B,C,D,E",
        answer_column="key",
        subject_column="topic",
    )
    pool = load_questions(spec, mmlu_dir=None)
    by_text = {q.question: q for q in pool.questions}
    assert by_text["Three options?"].choices == ("x", "y", "z")
    assert by_text["Three options?"].answer == 2
    assert by_text["Five options?"].choices == ("1", "2", "3", "4", "5")
    assert by_text["Five options?"].answer == 4
    assert pool.subjects == ("letters", "numbers")


def test_jsonl_json_and_parquet_files_load_alike(tmp_path: Path) -> None:
    records = [
        {"q": "Two options?", "opts": ["yes", "no"], "gold": 1},
        {"q": "Three options?", "opts": ["a", "b", "c"], "gold": 0},
    ]
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "set.json").write_text(json.dumps({"data": records}))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "set.parquet")
    columns = {"question_column": "q", "choices_column": "opts", "answer_column": "gold"}

    pools = [
        load_questions(DatasetSpec(name="mine", path=str(tmp_path / name), **columns), mmlu_dir=None)
        for name in ("set.jsonl", "set.json", "set.parquet")
    ]
    assert pools[0].questions == pools[1].questions == pools[2].questions
    assert pools[0].subjects == ("default",)
    two = next(q for q in pools[0].questions if q.question == "Two options?")
    assert two.choices == ("yes", "no")
    assert two.answer == 1
    assert two.id == question_id("default", "Two options?", ["yes", "no"])


def test_missing_column_lists_the_columns(tmp_path: Path) -> None:
    (tmp_path / "set.jsonl").write_text(json.dumps({"q": "?", "opts": ["a", "b"], "gold": 0}) + "\n")
    with pytest.raises(PosbiasError, match=r"no column 'question'.*q, opts, gold.*dataset.question_column"):
        load_questions(DatasetSpec(name="mine", path=str(tmp_path / "set.jsonl")), mmlu_dir=None)


@pytest.mark.parametrize(
    ("answer", "message"),
    [(4, "outside the 2 options"), ("Z", "outside the 2 options"), ("first", "neither a 0-based")],
)
def test_bad_answer_names_the_row(tmp_path: Path, answer: object, message: str) -> None:
    rows = [
        {"question": "ok?", "choices": ["a", "b"], "answer": 0},
        {"question": "bad?", "choices": ["a", "b"], "answer": answer},
    ]
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PosbiasError, match=rf"set\.jsonl row 2: .*{message}"):
        load_questions(DatasetSpec(name="mine", path=str(tmp_path / "set.jsonl")), mmlu_dir=None)


def test_missing_file_and_unsupported_type(tmp_path: Path) -> None:
    with pytest.raises(PosbiasError, match="does not exist"):
        load_questions(DatasetSpec(name="mine", path=str(tmp_path / "absent.csv")), mmlu_dir=None)
    (tmp_path / "set.xlsx").write_text("")
    with pytest.raises(PosbiasError, match="unsupported file type"):
        load_questions(DatasetSpec(name="mine", path=str(tmp_path / "set.xlsx")), mmlu_dir=None)


def test_batch_size_larger_than_the_pool(make_pool: Callable[..., QuestionPool]) -> None:
    pool = make_pool(30)
    check_pool(JobSpec(model="m", batch_sizes=[30]), pool=pool)
    with pytest.raises(PosbiasError, match=r"batch size 50 .* only 30"):
        check_pool(JobSpec(model="m", batch_sizes=[5, 50]), pool=pool)


# --- choices as labels mapped to texts (the layout of ARC, CommonsenseQA, OpenBookQA on the hub) -----------


def _write(tmp_path: Path, rows: list[dict[str, object]]) -> DatasetSpec:
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DatasetSpec(name="mine", path=str(tmp_path / "set.jsonl"), answer_column="answerKey")


def test_parallel_label_and_text_lists_with_a_label_answer_are_read_exactly(tmp_path: Path) -> None:
    # Every answer among the first two labels: read as the mapping's two keys, this once loaded silently
    # wrong (two options, "label" and "text"); it must give four options and the labelled one as gold.
    rows = [
        {
            "question": "Q1?",
            "choices": {"text": ["w", "x", "y", "z"], "label": ["A", "B", "C", "D"]},
            "answerKey": "B",
        },
        {
            "question": "Q2?",
            "choices": {"text": ["w", "x", "y", "z"], "label": ["A", "B", "C", "D"]},
            "answerKey": "A",
        },
        {"question": "Q3?", "choices": {"text": ["p", "q", "r"], "label": ["1", "2", "3"]}, "answerKey": "3"},
    ]
    by_text = {q.question: q for q in load_questions(_write(tmp_path, rows), mmlu_dir=None).questions}
    assert by_text["Q1?"].choices == ("w", "x", "y", "z") and by_text["Q1?"].answer == 1
    assert by_text["Q2?"].answer == 0
    assert by_text["Q3?"].choices == ("p", "q", "r") and by_text["Q3?"].answer == 2


def test_a_mapping_of_labels_to_texts_keeps_its_order_and_takes_a_label_answer(tmp_path: Path) -> None:
    rows = [
        {"question": "Q?", "choices": {"A": "one", "B": "two", "C": "three", "D": "four"}, "answerKey": "C"}
    ]
    (question,) = load_questions(_write(tmp_path, rows), mmlu_dir=None).questions
    assert question.choices == ("one", "two", "three", "four")
    assert question.answer == 2


@pytest.mark.parametrize(
    ("choices", "answer", "message"),
    [
        (
            {"text": ["w", "x", "y"], "label": ["A", "B", "C"]},
            "E",
            r"answer 'E' is not one of the option labels \(A, B, C\)",
        ),
        ({"text": ["w", "x"], "label": ["A", "B", "C"]}, "A", "3 labels for 2 option texts"),
        ({"A": "x", "B": "y"}, 0, "answer 0 is not one of the option labels"),
        (
            {"one": 1, "two": [2]},
            "one",
            r"the options \(choices\) are a mapping with keys one, two, not one of the layouts",
        ),
        (5, 0, r"the options \(choices\) are a int, not one of the layouts"),
        ([["a"], ["b"]], 0, "an option in choices is a list, not text"),
    ],
)
def test_other_layouts_are_refused_naming_the_column_and_the_layouts_read(
    tmp_path: Path, choices: object, answer: object, message: str
) -> None:
    rows = [{"question": "Q?", "choices": choices, "answerKey": answer}]
    with pytest.raises(PosbiasError, match=message) as raised:
        load_questions(_write(tmp_path, rows), mmlu_dir=None)
    assert "set.jsonl row 1" in str(raised.value)
    if "layouts" in message:
        assert "a mapping of labels to texts" in str(raised.value)


def test_a_local_looking_path_that_is_missing_is_a_missing_file_not_the_hub(tmp_path: Path) -> None:
    from posbias.service.work.datasets import looks_local

    for name in ("./questions.csv", "data/questions.jsonl", "/no/such/folder", "~/nothing-here", "a/b/c"):
        assert looks_local(name), name
    for name in ("cais/mmlu", "allenai/ai2_arc", "mmlu"):
        assert not looks_local(name), name
    with pytest.raises(PosbiasError, match=r"dataset file .*questions\.csv does not exist"):
        load_questions(DatasetSpec(name="./questions.csv"), mmlu_dir=None)


def test_unicode_digits_are_not_answer_indices(tmp_path: Path) -> None:
    rows = [{"question": "Q?", "choices": ["a", "b", "c", "d"], "answerKey": "\u00b3"}]
    with pytest.raises(PosbiasError, match="neither a 0-based option index nor a letter"):
        load_questions(_write(tmp_path, rows), mmlu_dir=None)
