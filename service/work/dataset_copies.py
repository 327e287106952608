"""Where a named dataset's local copy is: a folder of copies (`POSBIAS_DATASETS_DIR`) with one subfolder per
dataset, named as `--dataset` names it.

In a dataset's subfolder, its split is read from `<split>.jsonl` (or `.json`, `.parquet`, `.csv`), or from
the hub's own file names, as a download of the hub repository has them: `<split>-00000-of-00001.parquet`,
directly or one folder down (`data/`, or the configuration's folder, e.g. `ARC-Challenge/`, which is then
the only one looked in). Every file is in the hub's layout: the columns of `NamedDataset`. MMLU keeps its own
layouts: `mmlu/` is read as `POSBIAS_MMLU_DIR` is, when that is not set.
"""

from __future__ import annotations

from pathlib import Path

from posbias.schemas import NamedDataset

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
"""The file types of a local copy, in the order they are looked for."""


def copy_folder(named: NamedDataset, *, datasets_dir: Path | None) -> Path | None:
    """The folder of `named`'s local copy, when the folder of copies has one."""
    if datasets_dir is None:
        return None
    folder = Path(datasets_dir).expanduser() / named.name
    return folder if folder.is_dir() else None


def split_files(named: NamedDataset, *, split: str, datasets_dir: Path | None) -> list[Path] | None:
    """The files of `split` in `named`'s local copy (several for a hub download in shards), or None when
    there is no copy of that split."""
    folder = copy_folder(named, datasets_dir=datasets_dir)
    if folder is None:
        return None
    places = [folder]
    if named.config is not None and (folder / named.config).is_dir():
        places = [folder / named.config]  # a download of the whole repository holds every configuration
    else:
        places += sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    for place in places:
        for suffix in SUFFIXES:
            exact = place / f"{split}{suffix}"
            if exact.exists():
                return [exact]
        shards = sorted(p for p in place.glob(f"{split}-*") if p.suffix in SUFFIXES)
        if shards:
            return shards
    return None


def looked_for(named: NamedDataset, *, split: str, datasets_dir: Path | None) -> str:
    """Where a copy of `split` would be, in words, for an error naming the fix."""
    if datasets_dir is None:
        return f"set POSBIAS_DATASETS_DIR to a folder holding {named.name}/{split}.jsonl (the hub's columns)"
    root = Path(datasets_dir).expanduser() / named.name
    return f"put {root}/{split}.jsonl (or .parquet, .json, .csv; the hub's columns) there"
