"""Input that would be read as something else is refused in one line that names the fix, with a non-zero exit:
a key given twice, digits other than ASCII, control characters in URLs and paths, a port out of range, a
`.env` that is a symlink loop; and a spec file's relative paths are its folder's, not the working folder's.
Run in-process, as a user would type them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from posbias.cli import app
from posbias.schemas.spec_file import read_spec_file

Posbias = Callable[..., tuple[int, str]]


@pytest.fixture
def posbias(
    tmp_path: Path, mmlu_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Posbias:
    """`posbias(*args)`: the command's exit code and its stderr, run in `tmp_path`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSBIAS_MMLU_DIR", str(mmlu_dir))
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POSBIAS_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")

    def run(*args: str) -> tuple[int, str]:
        code = app.run(list(args))
        return code, capsys.readouterr().err

    return run


def _refusal(said: str) -> str:
    lines = said.strip().splitlines()
    assert len(lines) == 1, said
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], said
    return lines[0]


DRY = ("--dry-run", "--batch-sizes", "1", "--iterations", "2")


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("job.yaml", "model: fake\nengine: {name: fake}\nengine: {name: vllm}\n", '"engine" twice (line 3)'),
        ("job.json", '{"model": "fake", "engine": {"name": "fake", "name": "vllm"}}', '"name" twice'),
        ("nested.yaml", "model: fake\nengine:\n  name: fake\n  name: vllm\n", '"name" twice (line 4)'),
    ],
)
def test_a_key_given_twice_is_refused(
    name: str, text: str, key: str, posbias: Posbias, tmp_path: Path
) -> None:
    (tmp_path / name).write_text(text)
    code, said = posbias(*("submit", name, *DRY))
    line = _refusal(said)
    assert code != 0 and key in line and "keep the one you mean" in line


def test_yaml_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("base: &b {iterations: 3, seed: 1}\njob:\n  <<: *b\n  iterations: 4\n")
    assert read_spec_file(tmp_path / "job.yaml")["job"] == {"iterations": 4, "seed": 1}


@pytest.mark.parametrize("value", ["٣", "1,٢", "1_000", "\uff13"])
def test_digits_other_than_ascii_are_refused(value: str, posbias: Posbias) -> None:
    code, said = posbias(*("submit", "--engine", "fake", "--filler-tokens", value, *DRY))
    line = _refusal(said)
    assert code != 0 and "filler tokens must be comma-separated integers" in line


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("http://127.0.0.1:99999/v1", "a port that is not a number from 1 to 65535"),
        ("http://127.0.0.1:abc/v1", "a port that is not a number from 1 to 65535"),
        ("http://127.0.0.1:8000/v1\r\nX-Injected: 1", "control characters"),
        ("http://127.0.0.1:8000/v1\n", "control characters"),
    ],
)
def test_a_bad_base_url_is_refused_not_an_internal_error(url: str, fix: str, posbias: Posbias) -> None:
    code, said = posbias(*("submit", "--model", "m", "--engine", "openai", "--base-url", url, *DRY))
    line = _refusal(said)
    assert code != 0 and fix in line and "base_url" in line


def test_a_store_url_with_a_newline_creates_no_store(
    posbias: Posbias, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSBIAS_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}\nother")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, said = posbias("status")
    line = _refusal(said)
    assert code != 0 and "control character" in line and "POSBIAS_DATABASE_URL" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_dotenv_symlink_loop_is_refused(posbias: Posbias, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / ".env").symlink_to(tmp_path / "a")
    code, said = posbias("status")
    line = _refusal(said)
    assert code != 0 and str(tmp_path / ".env") in line and "KEY=value" in line


def test_a_path_with_a_control_character_is_refused(posbias: Posbias, tmp_path: Path) -> None:
    (tmp_path / "q.csv").write_text("question,choices,answer\n")
    spec = tmp_path / "job.yaml"
    spec.write_text('model: fake\nengine: {name: fake}\ndataset: {name: mine, path: "q.csv\\n"}\n')
    (tmp_path / "q.csv\n").write_text("question,choices,answer\n")
    code, said = posbias(*("submit", str(spec), *DRY))
    line = _refusal(said)
    assert code != 0 and "holds a control character" in line


def test_a_stored_spec_that_is_not_json_is_refused(posbias: Posbias, tmp_path: Path) -> None:
    assert posbias("db", "upgrade")[0] == 0
    assert posbias("submit", "--engine", "fake", "--batch-sizes", "1", "--iterations", "2")[0] == 0
    with contextlib.closing(sqlite3.connect(tmp_path / "store.db")) as store, store:
        store.execute("UPDATE jobs SET spec = 'not json'")
    for args in (("status",), ("status", "1")):
        code, said = posbias(*args)
        line = _refusal(said)
        assert code != 0 and "not JSON" in line and "restore the database from a backup" in line


def _questions(path: Path, count: int = 6) -> None:
    rows = [
        {"question": f"q{k}?", "choices": ["a", "b", "c", "d"], "answer": k % 4, "subject": "s"}
        for k in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_relative_paths_in_a_spec_file_are_read_from_its_folder(
    posbias: Posbias, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    _questions(specs / "q.jsonl")
    (specs / "f.txt").write_text("Plain neutral words. More plain words follow here.\n" * 20)
    (specs / "job.yaml").write_text(
        "model: fake\nengine: {name: fake}\nbatch_sizes: [2]\niterations: 2\n"
        "dataset: {name: mine, path: q.jsonl}\nfiller: {tokens: [5], source: ./f.txt}\n"
    )
    # A file of the same name in the working folder is not what the spec means.
    _questions(tmp_path / "q.jsonl", count=1)
    assert posbias("db", "upgrade")[0] == 0
    assert posbias("submit", "specs/job.yaml")[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert posbias("submit", "../specs/job.yaml")[0] == 0
    import posbias as api

    first, second = sorted(api.jobs(), key=lambda job: job.id)
    assert first.spec.dataset.path == second.spec.dataset.path == str(specs / "q.jsonl")
    assert first.spec.filler is not None and first.spec.filler.source == str(specs / "f.txt")
    assert first.spec.spec_hash() == second.spec.spec_hash()


def test_a_relative_model_folder_in_a_spec_file_is_its_folders(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "job.yaml").write_text("model: ./ckpt\ntokenizer: ../tok\n")
    data = read_spec_file(tmp_path / "specs" / "job.yaml")
    assert data["model"] == str(tmp_path / "specs" / "ckpt")
    assert data["tokenizer"] == str(tmp_path / "tok")
    (tmp_path / "specs" / "hub.yaml").write_text("model: google/gemma-2-2b-it\n")
    assert read_spec_file(tmp_path / "specs" / "hub.yaml")["model"] == "google/gemma-2-2b-it"
