"""What the command says when the store cannot be reached, run in-process (`posbias.cli.app.run`): one line
that names the fix, a fix that works when followed, and a traceback only with `--debug`."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.ports import free_port

from posbias.cli import app


@dataclass
class Said:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def posbias(monkeypatch: pytest.MonkeyPatch, url: str, *args: str) -> Said:
    """`posbias ARGS` in this process against the store at `url`."""
    monkeypatch.setenv("POSBIAS_DATABASE_URL", url)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = app.run(list(args))
    return Said(code=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_each_store_error_names_a_fix_that_works_when_followed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "no" / "such"
    url = f"sqlite:///{folder / 'posbias.db'}"
    said = posbias(monkeypatch, url, "status")
    assert said.code == 1 and len(said.lines) == 1, said.stderr
    assert said.lines[0] == (
        f"error: there is no posbias database at {folder / 'posbias.db'}: run `posbias db upgrade` to create "
        "it, or check POSBIAS_DATABASE_URL"
    )
    assert "Traceback" not in said.stderr

    upgrade = posbias(monkeypatch, url, "db", "upgrade")  # what it says to do; the folder is missing too
    assert upgrade.code == 1 and len(upgrade.lines) == 1, upgrade.stderr
    (line,) = upgrade.lines
    assert line.startswith("error: cannot open the database at ")
    assert line.endswith(f"{folder} does not exist; create it, or check POSBIAS_DATABASE_URL")

    folder.mkdir(parents=True)
    assert posbias(monkeypatch, url, "db", "upgrade").code == 0
    listed = posbias(monkeypatch, url, "status", "--json")
    assert (listed.code, listed.stdout.strip(), listed.lines) == (0, "[]", [])


def test_a_postgres_server_that_is_not_running_names_where_and_to_start_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    said = posbias(monkeypatch, f"postgresql+psycopg://me:s3cret@127.0.0.1:{port}/posbias", "status")
    assert said.code == 1 and len(said.lines) == 1, said.stderr
    (line,) = said.lines
    assert line.startswith("error: cannot open the database at ") and f"127.0.0.1:{port}" in line
    assert line.endswith(": start the server, or check POSBIAS_DATABASE_URL")
    assert "s3cret" not in said.stderr


def test_debug_adds_the_traceback_to_the_same_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'posbias.db'}"
    plain = posbias(monkeypatch, url, "status")
    debug = posbias(monkeypatch, url, "--debug", "status")
    assert "Traceback" not in plain.stderr and len(plain.lines) == 1
    assert debug.code == plain.code == 1
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert 'File "' in debug.stderr  # where it was raised
    assert debug.lines[-1] == plain.lines[0]
