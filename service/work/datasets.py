"""Loading the question pool a job samples from.

MMLU reads a local copy in either of its two layouts (the release CSVs, or the `cais/mmlu` JSONL files), or
the hub when no local copy is configured. Any other multiple-choice set loads from the hub by id or from a
local CSV/JSON/JSONL/Parquet file, with the columns named in the `DatasetSpec`.

Question ids are `<subject>/<first 12 hex digits of sha256(question, choices)>`, so the same question has the
same id in every job, whichever layout or source it came from. Rows that hash to the same id (MMLU's test
split repeats 27 questions verbatim) are kept once.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.schemas import DatasetSpec, JobSpec, PosbiasError, Question, QuestionPool, one_line
from posbias.schemas.files import MAX_DATA_FILE_BYTES, check_path, open_binary, open_text, read_text
from posbias.service.work import dataset_copies as copies
from posbias.workers import hub

MMLU_HUB_ID = "cais/mmlu"
DEFAULT_SUBJECT = "default"
MMLU_FIX = "set POSBIAS_MMLU_DIR to a local MMLU copy or pass dataset.path"
FILE_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
"""A Hugging Face dataset id: `name` or `owner/name`."""
MAX_SUBJECT = 200
"""Characters of a subject at most (the stores' subject columns)."""
LAYOUTS = (
    "a list of texts (the answer a 0-based index or a letter), a mapping of labels to texts, or parallel "
    "`label` and `text` lists (the answer then a label)"
)
"""The layouts of a choices column posbias reads."""
_TEXT_KEYS = ("text", "texts")
_LABEL_KEYS = ("label", "labels")

# The hub names MMLU's validation split `validation`; the release files call it `val`.
_SPLIT_ALIASES = {"val": "validation", "validation": "val"}


def question_id(subject: str, question: str, choices: Sequence[str]) -> str:
    """The stable id of a question: its subject plus a digest of its text and options."""
    canonical = json.dumps([question, list(choices)], ensure_ascii=False, separators=(",", ":"))
    return f"{subject}/{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def looks_local(name: str) -> bool:
    """True when `name` is meant as a local path: it exists, starts like a path (`/`, `./`, `~`), ends in a
    data file's suffix, or is not a hub id (`name` or `owner/name`)."""
    if name.startswith(("/", "./", "../", "~", ".\\")) or name in {".", ".."}:
        return True
    if Path(name).suffix.lower() in FILE_SUFFIXES:
        return True
    with contextlib.suppress(OSError, ValueError):
        if Path(name).expanduser().exists():
            return True
    return not HUB_ID.match(name)


def load_questions(
    dataset: DatasetSpec, *, mmlu_dir: Path | None, datasets_dir: Path | None = None
) -> QuestionPool:
    """Load the questions `dataset` names, filtered to its subjects.

    MMLU reads `dataset.path` (or else `mmlu_dir`, or else `datasets_dir/mmlu`) when one is given and the hub
    otherwise; a named dataset (`schemas.NAMED_DATASETS`) reads its local copy in `datasets_dir` when there is
    one (`service/work/dataset_copies.py`) and the hub otherwise; other datasets read `dataset.path` when
    given and the hub otherwise. Raises `PosbiasError` with the fix when the data cannot be found or read, or
    when a subject is unknown.
    """
    local = Path(dataset.path).expanduser() if dataset.path else None
    named = dataset.named
    if local is None and named is None and looks_local(dataset.name):
        local = Path(dataset.name).expanduser()  # `name: ./questions.csv` is a file, not a hub id
    if dataset.is_mmlu and local is None:
        if mmlu_dir is None and named is not None:
            mmlu_dir = copies.copy_folder(named, datasets_dir=datasets_dir)
        if mmlu_dir is not None:
            local = Path(mmlu_dir).expanduser()
    if local is None and named is not None and not dataset.is_mmlu:
        files = copies.split_files(named, split=dataset.split, datasets_dir=datasets_dir)
        if files is not None:
            questions = [q for file in files for q in _read_file(file, dataset=dataset)[0]]
            where = f"{files[0]}" + (f" and {len(files) - 1} more" if len(files) > 1 else "")
            source = f"{named.name} {dataset.split} split in {where}"
            return _pool(questions, subjects=dataset.subjects, source=source)
    if local is not None and not dataset.is_mmlu and not local.exists():
        raise PosbiasError(f"dataset file {local} does not exist; check the path (or name a hub dataset id)")
    if local is not None:
        if dataset.is_mmlu and (local.is_dir() or not local.suffix):
            questions, source = _read_mmlu_dir(local, split=dataset.split)
        elif local.is_dir():
            raise PosbiasError(
                f"dataset.path {local} is a folder; give a {'/'.join(FILE_SUFFIXES)} file of questions"
            )
        else:
            questions, source = _read_file(local, dataset=dataset)
    else:
        questions, source = _read_hub(dataset, datasets_dir=datasets_dir)
    return _pool(questions, subjects=dataset.subjects, source=source)


def check_pool(spec: JobSpec, *, pool: QuestionPool) -> None:
    """Raise `PosbiasError` when `spec` asks for more distinct questions per prompt than `pool` holds."""
    largest = max(spec.batch_sizes)
    if largest > len(pool):
        raise PosbiasError(
            f"batch size {largest} needs {largest} distinct questions but the pool has only {len(pool)} "
            f"({pool.source}); lower the batch sizes or widen dataset.subjects"
        )


def _pool(questions: Iterable[Question], *, subjects: Sequence[str] | None, source: str) -> QuestionPool:
    unique: dict[str, Question] = {}
    for question in questions:
        unique.setdefault(question.id, question)
    present = sorted({question.subject for question in unique.values()})
    if subjects:
        unknown = [subject for subject in subjects if subject not in present]
        if unknown:
            raise PosbiasError(
                f"unknown subject(s) {', '.join(unknown)} in {source}; valid subjects: {', '.join(present)}"
            )
        wanted = set(subjects)
        unique = {qid: q for qid, q in unique.items() if q.subject in wanted}
        present = sorted(wanted)
    if not unique:
        raise PosbiasError(f"no questions in {source}; check dataset.split and dataset.path")
    ordered = tuple(unique[qid] for qid in sorted(unique))
    return QuestionPool(questions=ordered, subjects=tuple(present), source=source)


# --- MMLU, local --------------------------------------------------------------------------------------------


def _read_mmlu_dir(folder: Path, *, split: str) -> tuple[list[Question], str]:
    if not folder.is_dir():
        raise PosbiasError(f"MMLU folder {folder} does not exist; {MMLU_FIX}")
    splits = [split, _SPLIT_ALIASES[split]] if split in _SPLIT_ALIASES else [split]
    for name in splits:
        jsonl = folder / f"mmlu_{name}.jsonl"
        if jsonl.exists():  # a FIFO or folder of that name is refused, not passed over
            columns = DatasetSpec()  # the JSONL layout uses the default column names
            rows = _jsonl_rows(jsonl)
            return _questions(rows, columns=columns, where=str(jsonl)), f"MMLU {split} split in {jsonl}"
    for name in splits:
        for csv_dir in (folder / "csv" / name, folder / name):
            files = sorted(csv_dir.glob(f"*_{name}.csv")) if csv_dir.is_dir() else []
            if files:
                questions = [q for file in files for q in _mmlu_csv(file, suffix=f"_{name}.csv")]
                return questions, f"MMLU {split} split in {csv_dir} ({len(files)} CSV files)"
    raise PosbiasError(
        f"no MMLU {split} split in {folder} (looked for mmlu_{split}.jsonl, "
        f"csv/{split}/<subject>_{split}.csv and {split}/<subject>_{split}.csv); {MMLU_FIX}"
    )


def _mmlu_csv(file: Path, *, suffix: str) -> Iterator[Question]:
    """The release layout: no header; question, the options, and the answer letter last."""
    subject = file.name.removesuffix(suffix)
    try:
        with open_text(file, what="MMLU file", fix=MMLU_FIX, limit=MAX_DATA_FILE_BYTES, newline="") as handle:
            for line, row in enumerate(csv.reader(handle), start=1):
                if not row:
                    continue
                if len(row) < 4:
                    raise PosbiasError(
                        f"{file}:{line}: expected question, options and answer letter, got {len(row)} columns"
                    )
                where = f"{file}:{line}"
                if any("\x00" in cell for cell in row):
                    raise PosbiasError(f"{where}: holds a NUL character, which the stores cannot keep")
                choices = _trim_choices(row[1:-1])
                yield _question(subject, row[0], choices, _answer_index(row[-1], len(choices), where), where)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PosbiasError(f"cannot read MMLU file {file}: {exc}; {MMLU_FIX}") from None


# --- the hub ------------------------------------------------------------------------------------------------


def _read_hub(dataset: DatasetSpec, *, datasets_dir: Path | None) -> tuple[list[Question], str]:
    named = dataset.named
    name = named.hub_id if named is not None else dataset.name
    config = named.config if named is not None else None
    split = dataset.split
    if dataset.is_mmlu and split == "val":
        split = "validation"
    tried = f"the Hugging Face hub ({name}{', ' + config if config else ''}, split {split})"
    fix = MMLU_FIX if dataset.is_mmlu else "pass dataset.path to a local file of the dataset"
    if named is not None and not dataset.is_mmlu:
        fix = copies.looked_for(named, split=dataset.split, datasets_dir=datasets_dir)
    offline, endpoint = hub.hub_settings()
    # Without network the hub client retries for about half a minute; the probe fails in milliseconds.
    # HF_HUB_OFFLINE skips the probe so that a dataset already in the local hub cache still loads.
    if not offline and not hub.reachable(endpoint):
        raise PosbiasError(f"cannot reach {endpoint} for {tried}; {fix}")
    try:
        import datasets

        table = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # the hub client raises many unrelated types; all mean "not available"
        raise PosbiasError(f"cannot load {tried}: {one_line(exc)}; {fix}") from None
    columns = DatasetSpec() if dataset.is_mmlu else dataset  # the hub's MMLU has the default columns
    rows = (dict(row) for row in table)
    return _questions(rows, columns=columns, where=f"{name} ({split})"), tried.removeprefix("the ")


# --- any local file -----------------------------------------------------------------------------------------


def _read_file(file: Path, *, dataset: DatasetSpec) -> tuple[list[Question], str]:
    check_path(file, what="dataset file")
    suffix = file.suffix.lower()
    if not file.exists():
        raise PosbiasError(f"dataset file {file} does not exist; give an existing file or folder")
    if suffix not in FILE_SUFFIXES:
        raise PosbiasError(
            f"dataset.path {file}: unsupported file type; use one of {', '.join(FILE_SUFFIXES)}"
        )
    try:
        if suffix == ".csv":
            rows: Iterable[Mapping[str, Any]] = _csv_rows(file, dataset=dataset)
        elif suffix == ".jsonl":
            rows = _jsonl_rows(file)
        elif suffix == ".json":
            rows = _json_rows(file)
        else:
            import pyarrow.parquet as pq

            with open_binary(file, what="dataset file", fix=_DATA_FIX, limit=MAX_DATA_FILE_BYTES) as handle:
                rows = pq.read_table(handle).to_pylist()
        return _questions(rows, columns=dataset, where=str(file)), f"{file}"
    except UnicodeDecodeError as exc:
        raise PosbiasError(
            f"dataset file {file} is not UTF-8 text (byte at offset {exc.start}); save it as UTF-8"
        ) from None
    except (OSError, csv.Error, ValueError) as exc:
        raise PosbiasError(f"cannot read dataset.path {file}: {one_line(exc)}") from None
    except RecursionError:
        raise PosbiasError(f"cannot read dataset.path {file}: its JSON nests too deeply") from None
    except Exception as exc:
        if type(exc).__module__.startswith("pyarrow"):
            raise PosbiasError(f"cannot read dataset.path {file}: {one_line(exc)}") from None
        raise


_DATA_FIX = f"give a {'/'.join(FILE_SUFFIXES)} file of questions"


def _csv_rows(file: Path, *, dataset: DatasetSpec) -> Iterator[dict[str, Any]]:
    """CSV rows, with option columns given as `A,B,C,D` gathered into one list under the choices column."""
    option_columns = [c.strip() for c in dataset.choices_column.split(",")]
    with open_text(file, what="dataset file", fix=_DATA_FIX, limit=MAX_DATA_FILE_BYTES, newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        if len(option_columns) > 1:
            missing = [c for c in option_columns if c not in header]
            if missing:
                raise PosbiasError(
                    f"{file}: no column(s) {', '.join(missing)} for the options; columns are "
                    f"{', '.join(header)} (set dataset.choices_column)"
                )
        for row in reader:
            if len(option_columns) > 1:
                row[dataset.choices_column] = [row[c] for c in option_columns]
            yield row


def _jsonl_rows(file: Path) -> Iterator[dict[str, Any]]:
    with open_text(file, what="dataset file", fix=_DATA_FIX, limit=MAX_DATA_FILE_BYTES) as handle:
        for line, text in enumerate(handle, start=1):
            if text.strip():
                row = json.loads(text)
                if not isinstance(row, dict):
                    raise PosbiasError(f"{file}:{line}: expected one JSON object per line")
                yield row


def _json_rows(file: Path) -> list[dict[str, Any]]:
    data = json.loads(read_text(file, what="dataset file", fix=_DATA_FIX, limit=MAX_DATA_FILE_BYTES))
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # e.g. {"data": [...]}
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise PosbiasError(f"{file}: expected a JSON list of objects, one per question")
    return data


# --- rows to questions --------------------------------------------------------------------------------------


def _questions(rows: Iterable[Mapping[str, Any]], *, columns: DatasetSpec, where: str) -> list[Question]:
    choices_key = columns.choices_column
    subject_key = columns.subject_column
    out: list[Question] = []
    for number, row in enumerate(rows, start=1):
        if number == 1:
            _check_columns(row, columns=columns, where=where)
        at = f"{where} row {number}"
        text = row.get(columns.question_column)
        if not isinstance(text, str):
            raise PosbiasError(f"{at}: the question ({columns.question_column}) is not text")
        options = read_choices(row.get(choices_key), at=at, column=choices_key)
        subject = row.get(subject_key) if subject_key else None
        subject = str(subject) if subject not in (None, "") else DEFAULT_SUBJECT
        if len(subject) > MAX_SUBJECT:
            raise PosbiasError(f"{at}: the subject is longer than {MAX_SUBJECT} characters")
        answer = options.answer_index(row.get(columns.answer_column), at=at)
        for value, what in (
            (text, "question"),
            (subject, "subject"),
            *((c, "an option") for c in options.texts),
        ):
            if "\x00" in value:
                raise PosbiasError(f"{at}: {what} holds a NUL character, which the stores cannot keep")
        out.append(_question(subject, text, options.texts, answer, at))
    return out


def _check_columns(row: Mapping[str, Any], *, columns: DatasetSpec, where: str) -> None:
    needed = {
        "dataset.question_column": columns.question_column,
        "dataset.choices_column": columns.choices_column,
        "dataset.answer_column": columns.answer_column,
    }
    # A subject column left at its default means "subjects if the data has them"; a named one must exist.
    if columns.subject_column and columns.subject_column != "subject":
        needed["dataset.subject_column"] = columns.subject_column
    for field, column in needed.items():
        if column not in row:
            raise PosbiasError(
                f"{where} has no column {column!r}; its columns are {', '.join(map(str, row))} (set {field})"
            )


@dataclass(frozen=True)
class Choices:
    """One question's options as read from its choices column, and their labels when the layout has them."""

    texts: list[str]
    labels: list[str] | None = None
    """The option labels (`A`, `B`, ... or whatever the data uses) of a labelled layout; None for a plain
    list, whose answer is an index or a letter."""

    def answer_index(self, value: Any, *, at: str) -> int:
        """The 0-based index of the gold option `value`: a label of a labelled layout, else an index or a
        letter."""
        if self.labels is None:
            return _answer_index(value, len(self.texts), at)
        key = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else None
        if key is None or key not in self.labels:
            shown = ", ".join(self.labels[:10])
            raise PosbiasError(f"{at}: answer {value!r} is not one of the option labels ({shown})")
        index = self.labels.index(key)
        if index >= len(self.texts):
            raise PosbiasError(f"{at}: answer {value!r} names an empty option")
        return index


def read_choices(value: Any, *, at: str, column: str) -> Choices:
    """A question's options in any of `LAYOUTS`, detected from the value itself; anything else is a
    `PosbiasError` naming the column and the layouts posbias reads."""
    if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
        with contextlib.suppress(ValueError, RecursionError):  # not JSON after all: reported just below
            value = json.loads(value)
    if isinstance(value, Mapping):
        return _labelled(value, at=at, column=column)
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise PosbiasError(
            f"{at}: the options ({column}) are {_kind(value)}, not one of the layouts posbias reads: "
            f"{LAYOUTS}; for a CSV, name the option columns, e.g. dataset.choices_column: A,B,C,D"
        )
    return Choices(texts=_trim_choices(_texts(list(value), at=at, column=column)))


def _labelled(value: Mapping[Any, Any], *, at: str, column: str) -> Choices:
    keys = {str(key).lower(): key for key in value}
    text_key = next((keys[k] for k in _TEXT_KEYS if k in keys), None)
    label_key = next((keys[k] for k in _LABEL_KEYS if k in keys), None)
    if text_key is not None and len(value) <= 2 and (label_key is not None or len(value) == 1):
        # Parallel lists, as many hub datasets store them: {"label": ["A", ...], "text": ["...", ...]}.
        texts = value[text_key]
        labels = value[label_key] if label_key is not None else None
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise PosbiasError(f"{at}: {column}.{text_key} is {_kind(texts)}, not a list of option texts")
        texts = _texts(list(texts), at=at, column=f"{column}.{text_key}")
        if labels is None:
            return Choices(texts=_trim_choices(texts))
        if isinstance(labels, str) or not isinstance(labels, Iterable):
            raise PosbiasError(f"{at}: {column}.{label_key} is {_kind(labels)}, not a list of option labels")
        names = [str(label).strip() for label in labels]
        if len(names) != len(texts):
            raise PosbiasError(
                f"{at}: {column} has {len(names)} labels for {len(texts)} option texts; they must pair up"
            )
        if len(set(names)) != len(names):
            raise PosbiasError(f"{at}: {column} repeats an option label ({', '.join(names[:10])})")
        return Choices(texts=_trim_choices(texts), labels=names)
    if value and all(isinstance(text, str) or text is None for text in value.values()):
        # Labels to texts: {"A": "...", "B": "...", ...}, in the mapping's order.
        names = [str(label).strip() for label in value]
        texts = _texts(list(value.values()), at=at, column=column)
        return Choices(texts=_trim_choices(texts), labels=names)
    raise PosbiasError(
        f"{at}: the options ({column}) are a mapping with keys {', '.join(map(str, list(value)[:6]))}, not "
        f"one of the layouts posbias reads: {LAYOUTS}"
    )


def _texts(values: list[Any], *, at: str, column: str) -> list[str]:
    texts = []
    for value in values:
        if isinstance(value, Mapping | list | tuple):
            raise PosbiasError(
                f"{at}: an option in {column} is {_kind(value)}, not text; posbias reads {LAYOUTS}"
            )
        texts.append("" if value is None else str(value))
    return texts


def _kind(value: Any) -> str:
    if value is None:
        return "missing"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def _trim_choices(choices: Sequence[str]) -> list[str]:
    """Drop empty trailing options: files that pad questions with fewer options to a fixed column count."""
    trimmed = list(choices)
    while trimmed and not trimmed[-1].strip():
        trimmed.pop()
    return trimmed


def _answer_index(value: Any, n_choices: int, at: str) -> int:
    """A 0-based index (an int or a string of digits, as CSVs hold it) or a letter A, B, ..."""
    index: int | None = None
    if isinstance(value, bool):
        index = None
    elif isinstance(value, int):
        index = value
    elif isinstance(value, float) and value.is_integer():
        index = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdecimal():  # `³` passes isdigit() but is not a number
            index = int(text)
        elif len(text) == 1 and text.isalpha() and text.isascii():
            index = ord(text.upper()) - ord("A")
    if index is None:
        raise PosbiasError(f"{at}: answer {value!r} is neither a 0-based option index nor a letter")
    if not 0 <= index < n_choices:
        raise PosbiasError(f"{at}: answer {value!r} is outside the {n_choices} options")
    return index


def _question(subject: str, text: str, choices: Sequence[str], answer: int, at: str) -> Question:
    if len(choices) < 2:
        raise PosbiasError(f"{at}: a question needs at least two options, found {len(choices)}")
    return Question(
        id=question_id(subject, text, choices),
        subject=subject,
        question=text,
        choices=tuple(choices),
        answer=answer,
    )
