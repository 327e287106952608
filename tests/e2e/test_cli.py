"""A user's session with the fake engine, on SQLite and on PostgreSQL: submit, worker, status, curve,
export, compare; and every kind of bad input, each a one-line error that changes nothing.

The command runs in this process (`cli`), against the same store and with the same checks on its output and
exit code as a process; `python -m posbias.cli` as a process of its own is checked once here (a store never
upgraded), the `posbias` console script in tests/deploy/test_cli_contract.py, and generated bad input as
processes in test_fuzz.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

Posbias = Any  # `cli` and `posbias`: run(*args, check=True, **env) -> Done (tests/e2e/conftest.py)

FAKE = ("--engine", "fake", "--fake-first", "0.2", "--fake-last", "0.8")


def test_submit_worker_status_curve_export_compare(cli: Posbias, tmp_path: Path) -> None:
    assert cli("db", "upgrade", "--json").json()["up_to_date"] is True
    first = cli("submit", *FAKE, "--batch-sizes", "1,5", "--iterations", "20", "--json").json()
    assert first["created"] is True and first["trials"] == 40

    again = cli(
        "submit", *FAKE, "--batch-sizes", "1,5", "--iterations", "20", "--idempotency-key", "k1", "--json"
    ).json()
    same = cli(
        "submit", *FAKE, "--batch-sizes", "1,5", "--iterations", "20", "--idempotency-key", "k1", "--json"
    ).json()
    assert same == {**again, "created": False}

    dry = cli("submit", *FAKE, "--batch-sizes", "1,5", "--iterations", "20", "--dry-run", "--json").json()
    assert [b["trials"] for b in dry["batch_sizes"]] == [20, 20]
    assert len(cli("status", "--json").json()) == 2, "a dry run must not enqueue"

    worker = cli("worker", "--until-empty", "--json").json()
    assert worker["trials_done"] == 80 and worker["shards_failed"] == 0

    jobs = cli("status", "--json").json()
    assert {j["status"] for j in jobs} == {"done"}
    one = cli("status", str(first["job_id"]), "--json").json()
    assert one["trials_done"] == 40 and all(s["status"] == "done" for s in one["shards"])
    assert one["engine"]["name"] == "fake"
    assert "done" in cli("status").stdout

    curves = cli("curve", "--model", "fake", "--format", "json").json()
    assert cli("curve", "--model", "fake", "--json").json() == curves
    assert [c["batch_size"] for c in curves] == [1, 5]
    five = curves[1]
    assert [p["position"] for p in five["points"]] == [1, 2, 3, 4, 5]
    # Both jobs of the model have the same spec and seed, so the same 20 trials: pooled, they count once.
    assert all(p["n"] == 20 for p in five["points"])
    assert (five["trials"], five["duplicate_trials"], five["job_ids"]) == (
        20,
        20,
        [first["job_id"], again["job_id"]],
    )
    assert five["contrast"]["estimate"] is not None and five["slope"]["low"] is not None
    assert five["shape_p"] is not None
    assert all(p["band_low"] <= p["ci_low"] <= p["ci_high"] <= p["band_high"] for p in five["points"])

    table = cli("curve", "--model", "fake", "--batch-size", "5", "--plot", "curve.png").stdout
    assert "batch size 5" in table and "last minus first" in table and "no position effect" in table
    banded = cli("curve", "--model", "fake", "--batch-size", "5", "--band").stdout
    assert "95% band (simultaneous)" in banded
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    rows = list(
        csv.DictReader(cli("curve", "--job", str(first["job_id"]), "--format", "csv").stdout.splitlines())
    )
    assert len(rows) == 1 + 5 and {r["batch_size"] for r in rows} == {"1", "5"}
    assert all(float(r["ci_low"]) <= float(r["accuracy"]) <= float(r["ci_high"]) for r in rows)

    by_distance = cli(
        "curve", "--model", "fake", "--by", "token-distance", "--bin-width", "50", "--format", "json"
    ).json()
    assert sum(p["n"] for c in by_distance for p in c["points"]) == 2 * 120  # both jobs

    cli("export", str(first["job_id"]), "--out", "results.csv")
    exported = list(csv.DictReader((tmp_path / "results.csv").read_text().splitlines()))
    assert len(exported) == 20 * 1 + 20 * 5
    assert {r["parse_status"] for r in exported} == {"ok"}
    written = cli("export", str(first["job_id"]), "--out", "results.parquet", "--json").json()
    assert (written["rows"], written["format"]) == (120, "parquet")
    assert pq.read_table(tmp_path / written["path"]).num_rows == 120

    worse = cli(
        "submit",
        "--engine",
        "fake",
        "--model",
        "fake-worse",
        "--fake-first",
        "0.2",
        "--fake-last",
        "0.2",
        "--batch-sizes",
        "5",
        "--iterations",
        "20",
        "--json",
    ).json()
    cli("worker", "--until-empty")
    comparison = cli("compare", str(first["job_id"]), str(worse["job_id"]), "--json").json()
    assert comparison["batch_size"] == 5 and len(comparison["points"]) == 5
    assert comparison["points"][-1]["diff"] < 0  # 0.8 at the last position against 0.2
    assert comparison["method"] == "paired" and comparison["matched_trials"] == 20  # same seed, same trials
    assert "minus" in cli("compare", "fake", "fake-worse", "--batch-size", "5").stdout
    itself = cli("compare", str(first["job_id"]), str(first["job_id"]), "--batch-size", "5", "--json").json()
    assert all(
        (p["diff"], p["ci_low"], p["ci_high"], p["different"]) == (0, 0, 0, False) for p in itself["points"]
    )

    models = cli("models", "--json").json()
    assert {m["name"] for m in models} == {"fake", "fake-worse"}
    assert cli("db", "current", "--json").json()["up_to_date"] is True


def test_run_is_the_one_shot_with_a_progress_bar_and_a_curve(cli: Posbias, tmp_path: Path) -> None:
    cli("db", "upgrade")
    done = cli("run", *FAKE, "--batch-sizes", "10", "--iterations", "30", "--plot", "run.png")
    assert "30/30" in done.stderr  # the progress bar's last state
    assert "batch size 10" in done.stdout and "last minus first" in done.stdout
    assert (tmp_path / "run.png").is_file()
    data = cli("run", *FAKE, "--batch-sizes", "3", "--iterations", "5", "--json").json()
    assert data["status"] == "done" and data["curves"][0]["batch_size"] == 3


def test_cancel_and_retry(cli: Posbias, tmp_path: Path) -> None:
    cli("db", "upgrade")
    job = cli("submit", *FAKE, "--batch-sizes", "2", "--iterations", "6", "--json").json()["job_id"]
    assert cli("cancel", str(job), "--json").json()["shards_cancelled"] >= 1
    assert cli("status", str(job), "--json").json()["status"] == "cancelled"
    cli("worker", "--until-empty")
    assert cli("status", str(job), "--json").json()["trials_done"] == 0

    # A model that was there at submit time and is gone when the worker loads it: the job fails with the
    # loader's error; once the model is back, `retry` puts its shards back in the queue.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    broken = cli("submit", "--model", str(model), "--batch-sizes", "2", "--iterations", "2", "--json")
    broken_id = broken.json()["job_id"]
    (model / "config.json").unlink()
    cli("worker", "--until-empty")
    failed = cli("status", str(broken_id), "--json").json()
    assert failed["status"] == "failed" and "config.json" in failed["error"]
    requeued = cli("retry", str(broken_id), "--json").json()["shards_requeued"]
    assert requeued == len(failed["shards"])
    again = cli("status", str(broken_id), "--json").json()
    assert again["error"] is None and {s["status"] for s in again["shards"]} == {"queued"}
    assert all(s["attempts"] == 0 for s in again["shards"])


# --- bad input: one line, non-zero, nothing changed ---------------------------------------------------


def snapshot(cli: Posbias) -> str:
    """Everything a user can see of the store."""
    return json.dumps([cli("status", "--json").json(), cli("models", "--json").json()], sort_keys=True)


@pytest.fixture
def finished_job(cli: Posbias) -> int:
    """A store with one finished job (run through a local Ray)."""
    cli("db", "upgrade")
    job: int = cli("run", *FAKE, "--batch-sizes", "2", "--iterations", "3", "--json").json()["job_id"]
    return job


@pytest.fixture
def queued_job(cli: Posbias) -> int:
    """A store with one queued job (no Ray needed, so each bad-input case stays quick)."""
    cli("db", "upgrade")
    job: int = cli("submit", *FAKE, "--batch-sizes", "2", "--iterations", "3", "--json").json()["job_id"]
    return job


BAD = [
    pytest.param(("submit", "bad.yaml"), 2, "not valid YAML", id="invalid-spec-file"),
    pytest.param(("submit", "unknown.yaml"), 2, "batchsize: unknown field", id="unknown-spec-field"),
    pytest.param(("submit", "missing.yaml"), 2, "cannot read spec file", id="missing-spec-file"),
    pytest.param(("submit", "--model", "x", "--frobnicate"), 2, "No such option", id="unknown-flag"),
    pytest.param(("submit", *FAKE, "--batch-sizes", "0"), 2, "between 1 and 200", id="batch-size-0"),
    pytest.param(("submit", "--model", "./no/such/model"), 1, "does not exist", id="missing-model-path"),
    pytest.param(("submit", *FAKE, "--subjects", "astrology"), 1, "unknown subject", id="unknown-subject"),
    pytest.param(
        ("submit", *FAKE, "--batch-sizes", "6", "--subjects", "anatomy", "--split", "dev"),
        1,
        "pool has only 5",
        id="batch-larger-than-pool",
    ),
    pytest.param(("status", "999"), 1, "no job 999", id="unknown-job"),
    pytest.param(("cancel", "999"), 1, "no job 999", id="cancel-unknown-job"),
    pytest.param(("export", "999", "--out", "x.csv"), 1, "no job 999", id="export-unknown-job"),
    pytest.param(("curve", "--model", "nobody"), 1, "no results", id="curve-unknown-model"),
    pytest.param(("curve", "--model", "fake", "--format", "xml"), 2, "table, csv or json", id="bad-format"),
    pytest.param(
        ("curve", "--model", "fake", "--metric", "attn"), 2, "accuracy or attention", id="bad-metric"
    ),
    pytest.param(
        ("curve", "--model", "fake", "--metric", "attention", "--heatmap", "h.png"),
        2,
        "--heatmap is for --metric accuracy",
        id="attention-heatmap",
    ),
    pytest.param(
        ("curve", "--model", "fake", "--metric", "attention", "--band"),
        2,
        "--band is for",
        id="attention-band",
    ),
    pytest.param(("retry", "1"), 1, "no dead shards", id="retry-a-job-with-nothing-dead"),
]


@pytest.mark.parametrize(("args", "code", "message"), BAD)
def test_bad_input_is_one_line_and_changes_nothing(
    cli: Posbias, queued_job: int, tmp_path: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    (tmp_path / "unknown.yaml").write_text("model: x\nbatchsize: 5\n")
    before = snapshot(cli)

    done = cli(*args, check=False)

    assert done.code == code, done.stderr
    assert len(done.error_lines) == 1, done.stderr
    assert done.error_lines[0].startswith("error: ") and message in done.error_lines[0]
    assert "Traceback" not in done.stderr
    assert snapshot(cli) == before


def test_cancelling_a_finished_job_is_refused(cli: Posbias, finished_job: int) -> None:
    before = snapshot(cli)
    done = cli("cancel", str(finished_job), check=False)
    assert done.code == 1 and len(done.error_lines) == 1 and "already done" in done.stderr
    assert snapshot(cli) == before


def test_an_unreachable_database_is_one_line(cli: Posbias) -> None:
    for url in ("postgresql+psycopg://nobody@127.0.0.1:1/posbias", "sqlite:////no/such/folder/posbias.db"):
        done = cli("status", check=False, POSBIAS_DATABASE_URL=url)
        assert done.code == 1 and len(done.error_lines) == 1, done.stderr
        assert done.error_lines[0].startswith("error: ")


def test_a_store_never_upgraded_names_the_fix(posbias: Posbias) -> None:
    # A process of its own (`python -m posbias.cli`): its exit status and its stderr, as a shell sees them.
    done = posbias("status", check=False)
    assert done.code == 1 and "posbias db upgrade" in done.stderr and len(done.error_lines) == 1


def test_help_explains_every_command_with_an_example(cli: Posbias) -> None:
    commands = [
        "submit",
        "run",
        "worker",
        "status",
        "cancel",
        "retry",
        "curve",
        "compare",
        "export",
        "models",
        "db upgrade",
        "db downgrade",
        "db current",
    ]
    for command in commands:
        text = cli(*command.split(), "--help").stdout
        assert "Example: posbias" in text, command
