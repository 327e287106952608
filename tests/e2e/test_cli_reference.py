"""docs/cli-reference.md is every command's `--help`, generated: it must say what the commands say now."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "scripts" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_what_every_command_s_help_says_now() -> None:
    generator = _generator()
    fresh = generator.render()
    stored = (REPO / "docs" / "cli-reference.md").read_text()
    assert stored == fresh, f"docs/cli-reference.md is stale: run `{generator.COMMAND}` and commit it"


def test_the_cli_reference_covers_every_command_and_sub_command() -> None:
    generator = _generator()
    headings = [
        line[3:]
        for line in (REPO / "docs" / "cli-reference.md").read_text().splitlines()
        if line.startswith("## ")
    ]
    assert headings == [" ".join(["posbias", *path]) for path in generator.command_paths()]
    for expected in (
        "posbias submit",
        "posbias db upgrade",
        "posbias schedule tick",
        "posbias models build-tiny",
    ):
        assert expected in headings
