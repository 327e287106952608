"""`posbias diagnose` end to end on the fake engine's mechanisms, as docs/diagnose.md shows it: a window
mechanism is implicated by the behaviour and intervention lines and RoPE is not; a RoPE decay the other way
round; a fake with no mechanism implicates nothing."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from conftest import Posbias

REPO = Path(__file__).resolve().parents[2]
GUIDE = (REPO / "docs" / "diagnose.md").read_text()


def _example_commands() -> list[list[str]]:
    section = GUIDE.split("## A worked example", 1)[1]
    (block,) = re.findall(r"```\n(.*?)```", section, flags=re.S)[:1]
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("posbias ")]


def _calls(diagnosis: dict[str, Any]) -> dict[str, str]:
    return {s["suspect"]: s["call"] for s in diagnosis["suspects"]}


def _diagnose(cli: Posbias, fake: dict[str, Any]) -> dict[str, Any]:
    args = ("diagnose", "fake/m", "--engine", "fake", "--fake", json.dumps(fake), "--budget", "400")
    cli(*args)
    cli("worker", "--until-empty")
    outcome = cli(*args, "--json").json()
    assert outcome["diagnosis"] is not None, outcome["jobs"]
    return outcome["diagnosis"]


def test_the_guide_s_worked_example_implicates_the_window(cli: Posbias, tmp_path: Path) -> None:
    cli("db", "upgrade")
    commands = _example_commands()
    assert [c[0] for c in commands] == ["diagnose", "diagnose", "worker", "diagnose"]
    dry = cli(*commands[0])
    assert "prompt tokens" in dry.stdout and "no estimate" in dry.stdout
    assert "submitted now" in cli(*commands[1]).stdout
    again = cli(*commands[1])  # the same plan finds the same jobs
    assert "0 submitted now, 2 found under their keys" in again.stdout
    cli(*commands[2])
    last = cli(*commands[3])
    assert "sliding window: implicated (2 lines agree" in last.stdout
    assert "implicated: sliding window" in last.stdout
    assert "RoPE distance decay: implicated" not in last.stdout
    # A line that cannot tell says what would: this command at a larger budget, and what that adds.
    settle = re.search(
        r"to settle: `(posbias diagnose fake/window .*?--budget (\d+))` \(about ([\d,]+) more", last.stdout
    )
    assert settle is not None, last.stdout
    assert shlex.split(settle.group(1))[1:-2] == commands[1][:-2] and int(settle.group(2)) > 400
    page = (tmp_path / "diagnosis.html").read_text()
    assert "Diagnosis of fake/window" in page and "/job/" in page
    status = cli("status", "--json").json()
    keys = {job["idempotency_key"] for job in status}
    assert len([k for k in keys if k and k.startswith("diagnose/")]) == 2


def test_a_rope_decay_is_implicated_and_the_window_is_not(cli: Posbias) -> None:
    cli("db", "upgrade")
    calls = _calls(_diagnose(cli, {"window": 1000, "mechanism": {"rope_decay": 0.4}}))
    assert calls["RoPE distance decay"] == "implicated"
    assert calls["sliding window"] in ("ruled out", "cannot tell")


def test_a_fake_without_a_mechanism_implicates_nothing(cli: Posbias) -> None:
    cli("db", "upgrade")
    diagnosis = _diagnose(cli, {"window": 1000, "mechanism": {}})
    calls = _calls(diagnosis)
    assert "implicated" not in calls.values(), calls
    undecided = [f for s in diagnosis["suspects"] for f in s["findings"] if f["call"] == "cannot tell"]
    assert undecided and all(f["settle"] for f in undecided), undecided
