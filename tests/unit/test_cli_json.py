"""`--json` wherever a script reads the command's answer: every such command takes it, and prints one JSON
document holding what a script needs. The commands that need results (curve, compare, explain, worker, run)
are read as JSON in tests/e2e/test_cli.py; here, the store's and a queued job's, with no Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer

from posbias.cli import app, help
from tests.support.in_process import run_cli

NO_JSON = {
    "report": "writes one HTML file, named by --out",
    "view": "serves web pages until stopped",
}
"""The commands without `--json`, and why no script reads them."""


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command that runs something: leaves, and groups whose callback takes options (`models`)."""
    found = []
    if hasattr(command, "list_commands"):
        for name in command.list_commands(None):
            found += _commands(command.get_command(None, name), (*path, name))
        if not any(p.name != "help" and getattr(p, "expose_value", True) for p in command.params):
            return found
    return [*found, (path, command)] if path else found


def test_every_command_a_script_reads_takes_json() -> None:
    top = help.tidy(typer.main.get_command(app.app))
    lacking = [
        " ".join(path)
        for path, command in _commands(top)
        if " ".join(path) not in NO_JSON and "--json" not in [o for p in command.params for o in p.opts]
    ]
    assert lacking == []


@pytest.fixture
def posbias(tmp_path: Path, mmlu_dir: Path) -> Any:
    """`posbias ARGS... --json` in this process against a SQLite store in `tmp_path`: the parsed output."""
    env = {
        "POSBIAS_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_CACHE_DIR": str(tmp_path / "cache"),
        "RAY_ADDRESS": "",
        "COLUMNS": "80",  # narrow: a long value must not be wrapped into invalid JSON
    }

    def run(*args: str) -> Any:
        done = run_cli([*args, "--json"], env=env, folder=tmp_path)
        assert done.code == 0, done.stderr
        return json.loads(done.stdout)  # one document: anything else on stdout fails here

    return run


def test_the_store_commands_say_where_the_schema_stands(posbias: Any, tmp_path: Path) -> None:
    upgraded = posbias("db", "upgrade")
    assert upgraded["up_to_date"] is True and upgraded["current"] == upgraded["head"]
    assert upgraded["store"] == f"sqlite:///{tmp_path / 'store.db'}"
    assert posbias("db", "current") == upgraded
    removed = posbias("db", "downgrade", "base")
    assert (removed["current"], removed["up_to_date"], removed["head"]) == (None, False, upgraded["head"])


def test_a_queued_job_reads_as_json(posbias: Any, tmp_path: Path) -> None:
    posbias("db", "upgrade")
    job = posbias("submit", "--engine", "fake", "--batch-sizes", "2", "--iterations", "3")
    assert job["created"] is True and job["trials"] == 3
    listed = posbias("status")
    assert [(j["id"], j["status"]) for j in listed] == [(job["job_id"], "queued")]
    one = posbias("status", str(job["job_id"]))
    assert one["trials_done"] == 0 and {s["status"] for s in one["shards"]} == {"queued"}
    exported = posbias("export", str(job["job_id"]), "--out", "results.csv")
    assert (exported["job_id"], exported["format"], exported["rows"]) == (job["job_id"], "csv", 0)
    assert (tmp_path / exported["path"]).is_file()
    assert posbias("models") == []  # a model is stored when a worker first loads it
    assert posbias("schedule", "list") == []
    named = {d["name"]: d for d in posbias("datasets")}
    assert named["mmlu"]["options"] == 4 and named["mmlu"]["local_questions"] > 0
