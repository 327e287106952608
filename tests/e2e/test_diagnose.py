"""`posbias diagnose` end to end on the fake engine's mechanisms, as docs/diagnose.md shows it: a window
mechanism is implicated by the behaviour and intervention lines and RoPE is not; a RoPE decay the other way
round; a fake with no mechanism implicates nothing."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import Posbias

from posbias.service.diagnose import battery as planner

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


def test_the_same_command_reads_its_stored_battery_after_the_planner_changes(
    cli: Posbias, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: a newer planner refused the budget a diagnosis was submitted with, so its own command could
    no longer read it. The battery is stored at its first submit and read as submitted from then on."""
    cli("db", "upgrade")
    fake = json.dumps({"window": 1000, "mechanism": {"window_step": 0.3}})
    args = ("diagnose", "fake/window", "--engine", "fake", "--fake", fake, "--budget", "160")
    cli(*args)
    monkeypatch.setattr(planner, "MIN_CLUSTERS", 20)  # the least budget is 200 now
    dry = cli(*args, "--dry-run").stdout
    stored = r"^battery: as stored \S+ \S+ UTC by posbias \S+, read as submitted; a fresh plan"
    assert re.search(stored, dry, re.M)
    assert "refused (a budget of 160 trials leaves 16 sampled sets a job; give --budget 200" in dry
    assert "0 submitted now, 2 found under their keys" in cli(*args).stdout
    refused = cli(*args, "--replan", check=False)
    assert refused.code != 0 and len(refused.error_lines) == 1 and "--budget 200" in refused.error_lines[0]

    monkeypatch.setattr(planner, "MIN_CLUSTERS", 16)
    monkeypatch.setattr(planner, "ROPE_FACTOR", 2)  # a newer plan that differs in one job
    assert "a fresh plan would differ (intervention: other variants): add --replan" in cli(*args).stdout
    replanned = cli(*args, "--replan").stdout
    assert "battery: planned afresh (--replan); it replaces the one stored" in replanned
    assert "whose job 2 is not in this plan and stays in the store" in replanned
    assert "1 submitted now, 1 found under their keys" in replanned
