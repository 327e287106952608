"""A usage error or `--help` is said before the heavy imports: the command parses its flags first and loads
only the module of the command asked for (`posbias/cli/app.py`), whose records, API and store come with the
work (benchmarks/cli_startup.py measures the time; here, what was imported)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from posbias.cli import app
from posbias.cli.spec_panels import DEFAULTS, spec_defaults

HEAVY = (
    "numpy",
    "pandas",
    "yaml",
    "sqlalchemy",
    "alembic",
    "ray",
    "torch",
    "vllm",
    "transformers",
    "posbias.api",
    "posbias.service",
    "posbias.workers",
    "posbias.schemas.record",  # every pydantic record stands on it
)
"""What a usage error must not cost. pydantic is not here: typer (0.20 and later) checks flag values with
it, so it comes with the flags, whereas the records are posbias's own cost."""

PROBE = """
import json, sys
from posbias.cli.app import run
code = run(sys.argv[2:])
with open(sys.argv[1], "w") as found:
    json.dump({"code": code, "modules": sorted(sys.modules)}, found)
"""

CASES = [
    pytest.param(("status", "--bogus"), 2, "No such option: --bogus", id="unknown-flag"),
    pytest.param(("status", "--limit", "x"), 2, "Invalid value for '--limit'", id="not-an-integer"),
    pytest.param(("status", "--limit", "0"), 2, "Invalid value for '--limit'", id="out-of-bounds"),
    pytest.param(("curve", "--by", "nope"), 2, "Invalid value for '--by'", id="unknown-choice"),
    pytest.param(("db", "current", "--bogus"), 2, "No such option: --bogus", id="group-unknown-flag"),
    pytest.param(("statu",), 2, "Did you mean 'status'?", id="misspelt-command"),
    pytest.param(("db",), 2, "error: name a command", id="group-alone"),
    pytest.param(("curve", "--help"), 0, "", id="curve-help"),
    pytest.param(("compare", "--help"), 0, "", id="compare-help"),
    pytest.param(("explain", "--help"), 0, "", id="explain-help"),
    pytest.param(("models", "--help"), 0, "", id="models-help"),
    pytest.param(("--help",), 0, "", id="top-help"),
    pytest.param(("submit", "--help"), 0, "", id="submit-help"),
    pytest.param(("submit", "--bogus"), 2, "No such option: --bogus", id="submit-unknown-flag"),
    pytest.param(("submit", "--iterations", "x"), 2, "Invalid value for '--iterations'", id="submit-not-int"),
    pytest.param(("submit", "--design", "nope"), 2, "Invalid value for '--design'", id="submit-choice"),
    pytest.param(("schedule", "--help"), 0, "", id="schedule-help"),
    pytest.param(("schedule", "list", "--bogus"), 2, "No such option: --bogus", id="schedule-unknown-flag"),
]


@pytest.mark.parametrize(("args", "code", "said"), CASES)
def test_a_usage_error_or_help_comes_before_the_heavy_imports(
    tmp_path: Path, args: tuple[str, ...], code: int, said: str
) -> None:
    # A process of its own: what this test session has imported says nothing about a command's start.
    report = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "POSBIAS_DATABASE_URL": "sqlite:///never.db"},
    )
    found = json.loads(report.read_text())
    assert found["code"] == code, done.stderr
    assert said in done.stderr
    if code == 0 or args == ("db",):
        assert "Usage: posbias" in done.stdout
    if code != 0:
        assert len(done.stderr.splitlines()) == 1, done.stderr
    imported = [m for m in found["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert imported == [], f"posbias {' '.join(args)} imported {imported[:8]}"
    assert not (tmp_path / "never.db").exists()


def test_every_command_is_found_where_the_app_looks_for_it() -> None:
    # `app.COMMANDS` names each command's module so that only that one is imported; a command a module
    # declares but the table lacks would be missing from `posbias`.
    for home in sorted(set(app.COMMANDS.values())):
        module = importlib.import_module(f"posbias.cli.{home}")
        declared = app._declared(home)
        assert declared, home
        for name in declared:
            assert app.COMMANDS.get(name) == home, f"{name} (posbias/cli/{home}.py) is not in app.COMMANDS"
        assert hasattr(module, "register") or hasattr(module, "app")


def test_help_shows_the_defaults_the_records_have() -> None:
    # `--help` shows them without importing the records; the records are where they are decided.
    assert spec_defaults() == DEFAULTS


def test_every_name_of_the_schemas_resolves_to_its_definition() -> None:
    # `posbias.schemas` imports each name from its module on first use: a name whose module is misnamed
    # in `_HOMES` would fail only when first used.
    import posbias.schemas as schemas

    for name in schemas.__all__:
        value = getattr(schemas, name)
        home = importlib.import_module(schemas._HOMES[name])
        assert getattr(home, name) is value, name
        if isinstance(value, type):
            assert value.__module__ == home.__name__, f"{name} is defined in {value.__module__}"


STORE_ONLY = (
    "posbias.api",  # every analysis the API holds, behind `posbias.load_settings` until 68d00d0
    "posbias.service.reports.curves",
    "posbias.service.stats",  # came with the worker's answer sheets, through `load_spec`, until this round
    "posbias.service.work.answer_sheets",
    "psycopg",  # the store errors' type, on a SQLite store
    "scipy",
    "pandas",
    "pyarrow",
    "alembic",
)
"""What a command that only opens the store (`db current`, `trial`) must not cost: each was a tenth of a
second or more of its start."""


@pytest.mark.parametrize(
    ("args", "code", "said", "also"),
    [
        # numpy: a tenth of what opening the store costs; the fake engine's records held it until this round
        pytest.param(("db", "current"), 0, "", ("numpy",), id="db-current"),
        pytest.param(("trial", "1", "1"), 1, "there is no job 1", (), id="trial"),
    ],
)
def test_a_command_that_only_opens_the_store_imports_no_analysis(
    tmp_path: Path, args: tuple[str, ...], code: int, said: str, also: tuple[str, ...]
) -> None:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "100", "POSBIAS_DATABASE_URL": "sqlite:///store.db"}
    made = subprocess.run(
        [sys.executable, "-m", "posbias.cli", "db", "upgrade"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    report = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    found = json.loads(report.read_text())
    assert found["code"] == code, done.stderr
    assert said in done.stderr
    heavy = STORE_ONLY + also
    imported = [m for m in found["modules"] if any(m == h or m.startswith(h + ".") for h in heavy)]
    assert imported == [], f"posbias {' '.join(args)} imported {imported[:8]}"
    assert "posbias.service.store.database" in found["modules"]  # it did open the store


COLLECTOR = """
import gc, json, sys
default, report = gc.get_threshold(), sys.argv[1]
if sys.argv[2] == "command":
    from posbias.cli.app import main
    sys.argv = ["posbias", *sys.argv[3:]]
    try:
        main()
    except SystemExit as exit:
        code = exit.code
else:  # Python code that imports posbias
    import posbias
    posbias.store_version()
    code = 0
with open(report, "w") as found:
    after = {"after": gc.get_threshold(), "frozen": gc.get_freeze_count()}
    json.dump({"code": code, "default": default, **after}, found)
"""


@pytest.mark.parametrize("how", ["command", "python"])
def test_the_collectors_pace_is_the_default_once_the_store_is_open(tmp_path: Path, how: str) -> None:
    # A command collects less often while it imports (`posbias/startup.py`); once its store is open, what
    # lives is frozen and a long command (a worker, the viewer) collects at Python's own pace. Python code
    # that imports posbias is not touched.
    env = {"PATH": "/usr/bin:/bin", "POSBIAS_DATABASE_URL": "sqlite:///store.db"}
    made = subprocess.run(
        [sys.executable, "-m", "posbias.cli", "db", "upgrade"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    report = tmp_path / "collector.json"
    args = ["status"] if how == "command" else []
    done = subprocess.run(
        [sys.executable, "-c", COLLECTOR, str(report), how, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert report.exists(), done.stderr
    found = json.loads(report.read_text())
    assert found["code"] == 0, done.stderr
    assert found["after"] == found["default"]
    assert (found["frozen"] > 0) == (how == "command")
