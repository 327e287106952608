"""The README is the front door: its commands must exist with the flags it shows, its SQL must run on both
stores, and CI must run its test command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from posbias.cli.app import app
from posbias.service import database

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)


def readme_commands() -> list[list[str]]:
    """Every `posbias ...` command in the README's shell blocks, without comments."""
    commands = []
    for language, body in BLOCKS:
        if language not in ("", "sh", "bash"):
            continue
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("posbias "):
                commands.append(shlex.split(line)[1:])
    return commands


def subcommand(words: list[str]) -> list[str]:
    """The command path of `words`: `db upgrade`, `curve`, ..."""
    return words[:2] if words[0] in {"db", "schedule"} else words[:1]


def test_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [body.strip() for language, body in re.findall(r"```(\w*)\n(.*?)```", quick, flags=re.S)]
    assert commands == ["scripts/demo.sh", "scripts/test.sh"]
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert "posbias run --model demo" in (REPO / "scripts" / "demo.sh").read_text()


@pytest.mark.parametrize("words", readme_commands(), ids=lambda words: " ".join(words)[:60])
def test_every_readme_command_exists_with_its_flags(words: list[str]) -> None:
    path = subcommand(words)
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    for flag in (w.split("=", 1)[0] for w in words if w.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", shown.output), (
            f"{flag} not in {path} --help"
        )


def readme_sql() -> list[str]:
    return [body for language, body in BLOCKS if language == "sql"]


def test_readme_sql_runs_on_the_store(posbias: Any, store_url: str) -> None:
    queries = readme_sql()
    assert len(queries) == 2
    posbias("db", "upgrade")
    # The fake engine under the README's model name: its accuracy rises from 0.2 to 0.8 across positions.
    posbias(
        "run",
        "--engine",
        "fake",
        "--model",
        "google/gemma-2-2b-it",
        "--fake-first",
        "0.2",
        "--fake-last",
        "0.8",
        "--batch-sizes",
        "10,50",
        "--iterations",
        "30",
        "--json",
    )
    with database.connect(store_url) as db, db.read() as session:
        curve = session.execute(text(queries[0])).all()
        distance = session.execute(text(queries[1])).all()
    assert [row.position for row in curve] == list(range(1, 51))
    assert all(row.n == 30 and row.ci_low <= row.accuracy <= row.ci_high for row in curve)
    assert curve[-1].accuracy > curve[0].accuracy
    assert {row.batch_size for row in distance} == {10, 50}
    assert sum(row.n for row in distance) == 30 * 10 + 30 * 50


def test_the_from_python_example_runs_as_written(tmp_path: Path, mmlu_dir: Path) -> None:
    (example,) = [body for language, body in BLOCKS if language == "python"]
    script = tmp_path / "example.py"
    script.write_text(example)
    env = {
        **os.environ,
        "POSBIAS_DATABASE_URL": f"sqlite:///{tmp_path / 'posbias.db'}",
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_POLL_SECONDS": "0.05",
        "RAY_ADDRESS": "",
    }
    for command in (
        [sys.executable, "-m", "posbias.cli", "db", "upgrade"],
        [sys.executable, str(script)],
    ):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert int(lines[0]) > 0  # the dry run's prompt tokens
    assert lines[1] == "done 40 trials"
    table = "\n".join(lines[2:])
    assert "position" in table and "ci_low" in table
    # Two jobs of one spec hold the same trials, and the fake engine answers a prompt the same way each time.
    diffs = [line.split()[-1] for line in lines if line.split() and line.split()[0].isdigit()][-10:]
    assert diffs == ["0.0"] * 10, done.stdout
