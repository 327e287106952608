"""The named datasets as this machine sees them (`posbias datasets`): each with its local copy, if any, and
that copy's size. The hub is never asked: a dataset without a copy shows the hub's figures."""

from __future__ import annotations

from pathlib import Path

from posbias.schemas import NAMED_DATASETS, DatasetInfo, DatasetSpec, NamedDataset, PosbiasError
from posbias.service.work import dataset_copies as copies
from posbias.service.work.datasets import load_questions


def describe(*, mmlu_dir: Path | None, datasets_dir: Path | None) -> list[DatasetInfo]:
    """Every named dataset, in the catalog's order, with what its local copy holds."""
    return [_info(named, mmlu_dir=mmlu_dir, datasets_dir=datasets_dir) for named in NAMED_DATASETS.values()]


def _info(named: NamedDataset, *, mmlu_dir: Path | None, datasets_dir: Path | None) -> DatasetInfo:
    if named.name == "mmlu":
        folder = mmlu_dir or copies.copy_folder(named, datasets_dir=datasets_dir)
        where = None if folder is None else str(folder)
    else:
        files = copies.split_files(named, split=named.split, datasets_dir=datasets_dir)
        where = None if files is None else str(files[0])
    if where is None:
        return DatasetInfo(dataset=named)
    try:
        pool = load_questions(DatasetSpec(name=named.name), mmlu_dir=mmlu_dir, datasets_dir=datasets_dir)
    except PosbiasError as exc:
        return DatasetInfo(dataset=named, local_copy=where, problem=str(exc))
    most = max(len(question.choices) for question in pool.questions)
    return DatasetInfo(dataset=named, local_copy=where, local_questions=len(pool), local_options=most)
