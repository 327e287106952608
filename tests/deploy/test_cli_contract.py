"""Every `posbias` command that a manifest, the compose file, a Dockerfile, a script or the runbook runs
exists in the CLI with the options it passes: each is looked up with `posbias ... --help`, as a person
would. The help pages are read in this process (the command's real entry point, `posbias.cli.app.run`:
tests/support/in_process.py); the console script itself runs once, as a process (`posbias --version`)."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from deploy_support import Invocation, invocations
from support.in_process import run_cli

INVOCATIONS = invocations()
POSBIAS = Path(sys.executable).with_name("posbias")


@cache
def _help(path: tuple[str, ...]) -> tuple[int, str]:
    env = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    done = run_cli([*path, "--help"], env=env, folder=Path.cwd())
    assert done.code is not None
    return done.code, done.stdout + done.stderr


def _command_path(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The subcommands at the start of `argv` (`db upgrade`, `schedule tick`), told apart from positional
    arguments (`submit SPEC.yaml`) by whether `--help` shows another page."""
    path: tuple[str, ...] = ()
    for word in argv:
        if word.startswith("-"):
            break
        code, text = _help((*path, word))
        if code != 0 or text == _help(path)[1]:
            break
        path = (*path, word)
    return path


def test_the_deployment_files_run_the_commands_of_the_contract() -> None:
    """The extraction finds the commands it should (so the parametrized test below is not vacuous)."""
    commands = {" ".join(i.argv[:2]) for i in INVOCATIONS}
    for expected in ("db upgrade", "db current", "schedule tick", "status", "curve --model"):
        assert any(c.startswith(expected) for c in commands), expected
    assert any(i.argv[:1] == ("worker",) and "--until-empty" in i.argv for i in INVOCATIONS)
    assert any(i.argv[:1] == ("submit",) and "--tensor-parallel-size" in i.argv for i in INVOCATIONS)


def test_posbias_version() -> None:
    done = subprocess.run(
        [str(POSBIAS), "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


@pytest.mark.parametrize("invocation", INVOCATIONS, ids=lambda i: i.id)
def test_command_exists_with_its_options(invocation: Invocation) -> None:
    assert POSBIAS.exists(), f"{POSBIAS} not found: pip install -e ."
    if invocation.argv in (("--version",), ("--help",)):
        return  # top-level options, checked above
    path = _command_path(invocation.argv)
    assert path, f"`posbias {invocation.argv[0]}` is not a posbias command"
    code, text = _help(path)
    assert code == 0, text
    for word in invocation.argv[len(path) :]:
        if word.startswith("-") and word != "-":
            option = word.split("=", 1)[0]
            assert option in text, f"`posbias {' '.join(path)}` has no option {option}"
