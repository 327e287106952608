"""Every id read from text (a flag, an argument, a spec file, a target the API parses) is the ASCII digits 0-9
and nothing else: Python's `int` reads a full-width 2 as 2, `1_0` as 10 and ` 1` as 1, and typer's int flags
did the same, so `posbias status 1_0` named job 10. A refused id is one line and exit code 2, before any store
is opened."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.in_process import run_cli

import posbias
from posbias.schemas import UsageError
from posbias.schemas.attention import SheetFromJob
from posbias.schemas.ids import ID_MAX, parse_id
from posbias.service.schedules.schedule_rows import parse_baseline

FULL_WIDTH_2 = "\uff12"
ARABIC_INDIC_3 = "\u0663"
SUPERSCRIPT_2 = "\u00b2"
NOT_IDS = [FULL_WIDTH_2, ARABIC_INDIC_3, SUPERSCRIPT_2, "1_0", " 1", "1 ", "+1", "-1", "1.0", "0x1", "", "a"]


def test_ids_are_ascii_digits_from_1_to_the_stores_largest() -> None:
    assert parse_id("12") == 12
    assert parse_id("007") == 7
    assert parse_id(str(ID_MAX)) == ID_MAX
    for text in NOT_IDS:
        with pytest.raises(UsageError, match="is not a job id"):
            parse_id(text)
    for text in ("0", str(ID_MAX + 1), "9" * 400):
        with pytest.raises(UsageError, match="out of range"):
            parse_id(text, what="trial id")


ID_FLAGS = [
    ["status", "{id}"],
    ["cancel", "{id}"],
    ["retry", "{id}"],
    ["export", "{id}"],
    ["trial", "{id}", "1"],
    ["trial", "1", "{id}"],
    ["curve", "--job", "{id}"],
    ["explain", "1", "{id}"],
    ["report", "{id}", "--out", "report.html"],
]
LOOSE = {"full": FULL_WIDTH_2, "sup": SUPERSCRIPT_2, "underscore": "1_0", "space": " 1"}
CASES = [
    (args, text, f"{'-'.join(a for a in args if a != '{id}')}-{name}")
    for args in ID_FLAGS
    for name, text in LOOSE.items()
]
# compare's operand may also be a model name: only digits (of any script) are read as a job id there.
CASES += [(["compare", "{id}", "1"], LOOSE[name], f"compare-{name}") for name in ("full", "sup")]


@pytest.mark.parametrize(("args", "text"), [c[:2] for c in CASES], ids=[c[2] for c in CASES])
def test_the_command_refuses_an_id_that_is_not_ascii_digits_in_one_line_with_exit_2(
    tmp_path: Path, args: list[str], text: str
) -> None:
    env = {"POSBIAS_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}", "COLUMNS": "200"}
    done = run_cli([a.replace("{id}", text) for a in args], env=env, folder=tmp_path, drop_prefix="POSBIAS_")
    lines = done.stderr.strip().splitlines()
    assert done.code == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "is not a " in lines[0], done.stderr


def test_the_api_and_the_files_read_ids_as_the_command_does(tmp_path: Path) -> None:
    settings = posbias.Settings(database_url=f"sqlite:///{tmp_path / 'none.db'}")
    for target in (FULL_WIDTH_2, f"{FULL_WIDTH_2}:baseline", SUPERSCRIPT_2):
        with pytest.raises(UsageError, match="is not a job id"):
            posbias.curves(target, settings=settings)
    with pytest.raises(UsageError, match="is not a baseline job id"):
        parse_baseline(FULL_WIDTH_2)
    assert parse_baseline("3") == (parse_baseline("3")[0], 3)
    for value in (FULL_WIDTH_2, "1_0", " 2", "3.0", 3.0, True):
        with pytest.raises(ValueError, match="job id"):
            SheetFromJob.model_validate({"job": value})
    assert SheetFromJob.model_validate({"job": "4"}).job == 4
