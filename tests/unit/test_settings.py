"""Settings that cannot be used are refused in one line naming the setting, its variable and the fix, alike
from `Settings(...)`, from `POSBIAS_*` and from the command; values that mean something are kept."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from support.in_process import run_cli

from posbias.schemas import PosbiasError, UsageError
from posbias.service.settings import Settings, SettingsError, load_settings

REFUSED = [
    ("lease_seconds", math.inf),
    ("lease_seconds", math.nan),
    ("lease_seconds", -1.0),
    ("lease_seconds", 0),
    ("lease_seconds", 86_401),
    ("heartbeat_seconds", math.inf),
    ("poll_seconds", 0),
    ("drain_seconds", math.nan),
    ("store_outage_seconds", -math.inf),
    ("ray_connect_seconds", 0),
    ("placement_timeout_seconds", math.inf),
    ("gpu_memory_wait_seconds", -0.5),
    ("max_trials", 0),
    ("cpu_threads", -2),
    ("device", "tpu"),
]


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No POSBIAS_* variable and no `.env` of this machine's reach the settings under test."""
    for name in [n for n in os.environ if n.startswith("POSBIAS_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_value_a_setting_cannot_use_is_one_line_naming_it_and_the_fix(field: str, value: object) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(**{field: value})
    line = str(caught.value)
    assert "\n" not in line
    assert f"POSBIAS_{field.upper()} ({field})" in line
    assert "set it so" in line or "fix it" in line
    assert "unset it" in line
    assert isinstance(caught.value, UsageError)  # the command's exit code 2; a PosbiasError for the API


def test_a_number_setting_says_its_bounds_and_default() -> None:
    with pytest.raises(PosbiasError, match="lease_seconds") as caught:
        Settings(lease_seconds=math.inf)
    assert str(caught.value) == (
        "setting POSBIAS_LEASE_SECONDS (lease_seconds) is inf: it must be a finite number above 0 and at "
        "most 86,400; set it so, or unset it for the default, 30.0"
    )


def test_the_environment_and_the_command_give_the_same_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("POSBIAS_LEASE_SECONDS", "inf")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "POSBIAS_LEASE_SECONDS (lease_seconds) is 'inf'" in str(caught.value)

    ran = run_cli(["db", "current"], env={"POSBIAS_LEASE_SECONDS": "nan"}, folder=tmp_path)
    assert ran.code == 2
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: setting POSBIAS_LEASE_SECONDS (lease_seconds)")
    assert "Traceback" not in ran.stderr


def test_a_heartbeat_as_long_as_the_lease_is_refused_and_a_shorter_one_kept() -> None:
    with pytest.raises(SettingsError, match=r"POSBIAS_HEARTBEAT_SECONDS.*lease") as caught:
        Settings(lease_seconds=5, heartbeat_seconds=5)
    assert "\n" not in str(caught.value)
    kept = Settings(lease_seconds=5, heartbeat_seconds=1)
    assert (kept.lease_seconds, kept.heartbeat_seconds) == (5, 1)


def test_values_that_mean_something_are_kept() -> None:
    kept = Settings(drain_seconds=0, gpu_memory_wait_seconds=0, max_node_gpus=0, lease_seconds=86_400)
    assert (kept.drain_seconds, kept.gpu_memory_wait_seconds, kept.max_node_gpus) == (0, 0, 0)
    assert kept.lease_seconds == 86_400


def test_a_store_url_is_never_quoted_in_the_error() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(database_url="postgresql+psycopg://me:hunter2@db/posbias\x00")
    assert "POSBIAS_DATABASE_URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)
