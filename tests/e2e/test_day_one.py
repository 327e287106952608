"""What a user coming from lm-evaluation-harness tries in the first hour, through the command (in this
process: `cli`): a dataset by name, a quick look at a big job, a misspelled model, `--help`, a tiny model to
try variants on, a schedule run in one CI step. Served models through `posbias serve` are checked by every
served test (tests/support/vllmserve.py starts its server that way)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.in_process import run_cli

Posbias = Any  # the `cli` fixture (tests/e2e/conftest.py)

FAKE = ("--engine", "fake", "--fake-first", "0.25", "--fake-last", "0.25")


@pytest.fixture
def storeless(store_url: str) -> None:
    """A check in which the store plays no part: run on SQLite alone."""
    if not store_url.startswith("sqlite"):
        pytest.skip("the store plays no part here; checked on SQLite")


def _copies(folder: Path) -> Path:
    """A local copy of CommonsenseQA's validation split in its hub layout: five options a question."""
    rows = [
        {
            "id": f"q{i}",
            "question": f"Where would you keep thing number {i}?",
            "question_concept": "thing",
            "choices": {"label": list("ABCDE"), "text": [f"place {k} for {i}" for k in range(5)]},
            "answerKey": "ABCDE"[i % 5],
        }
        for i in range(40)
    ]
    path = folder / "copies" / "commonsense-qa" / "validation.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "copies"


def test_a_dataset_by_name_sets_the_options_and_the_chance_line(cli: Posbias, tmp_path: Path) -> None:
    copies = str(_copies(tmp_path))
    listed = {d["name"]: d for d in cli("datasets", "--json", POSBIAS_DATASETS_DIR=copies).json()}
    assert listed["commonsense-qa"]["local_questions"] == 40 and listed["commonsense-qa"]["options"] == 5
    assert listed["mmlu-pro"]["options"] == 10 and listed["mmlu-pro"]["local_copy"] is None

    cli("db", "upgrade")
    ran = cli(
        "run",
        *FAKE,
        "--dataset",
        "commonsense-qa",
        "--batch-sizes",
        "1,4",
        "--iterations",
        "10",
        "--json",
        POSBIAS_DATASETS_DIR=copies,
    ).json()
    assert ran["status"] == "done"
    assert [curve["chance"] for curve in ran["curves"]] == pytest.approx([0.2, 0.2])  # five options
    status = cli("status", str(ran["job_id"]), "--json").json()
    assert status["quick_look"] is None


REPO = Path(__file__).resolve().parents[2]


def test_the_demo_leaves_its_mmlu_copy_to_the_next_command(tmp_path: Path, mmlu_dir: Path) -> None:
    """After `scripts/demo.sh`, the README's next command in the same shell must find the MMLU copy the demo
    used offline: the demo saves it in `.env` (keeping what the file held), and says so in one line."""
    assert "scripts/demo_settings.sh" in (REPO / "scripts" / "demo.sh").read_text()
    checkout = tmp_path / "posbias"
    (checkout / "scripts").mkdir(parents=True)
    script = checkout / "scripts" / "demo_settings.sh"
    script.write_bytes((REPO / "scripts" / "demo_settings.sh").read_bytes())
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "mmlu").symlink_to(mmlu_dir)
    (checkout / ".env").write_text("# mine\nPOSBIAS_LEASE_SECONDS=60")  # no newline at its end
    bare = {k: v for k, v in os.environ.items() if not k.startswith("POSBIAS_")}

    def demo_settings(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script)], cwd=checkout, env=bare | env, capture_output=True, text=True, check=True
        )

    said = demo_settings()
    copy = tmp_path / "shared" / "data" / "mmlu"
    assert said.stderr == "" and len(said.stdout.splitlines()) == 1 and ".env" in said.stdout
    assert (checkout / ".env").read_text() == f"# mine\nPOSBIAS_LEASE_SECONDS=60\nPOSBIAS_MMLU_DIR='{copy}'\n"
    again = demo_settings()  # a second demo finds it there and leaves the file as it is
    assert again.stdout == "" and (checkout / ".env").read_text().count("POSBIAS_MMLU_DIR") == 1

    done = run_cli(["datasets", "--json"], env={"COLUMNS": "200"}, folder=checkout, drop_prefix="POSBIAS_")
    assert done.code == 0 and done.stderr == "", done.stderr
    (mmlu,) = [d for d in json.loads(done.stdout) if d["name"] == "mmlu"]
    assert Path(mmlu["local_copy"]).resolve() == copy.resolve() and mmlu["problem"] is None

    (checkout / ".env").unlink()
    assert demo_settings(POSBIAS_MMLU_DIR=str(mmlu_dir)).stdout == ""  # the user's own choice stands
    assert not (checkout / ".env").exists()


@pytest.mark.usefixtures("storeless")
def test_datasets_on_an_80_column_terminal_shows_every_name_whole(cli: Posbias, mmlu_dir: Path) -> None:
    """The names are what a user types after `--dataset`: never cut (`arc-challen…`), whatever the width;
    MMLU read from the copy POSBIAS_MMLU_DIR names shows that copy, not the hub."""
    names = [d["name"] for d in cli("datasets", "--json").json()]
    shown = cli("datasets", COLUMNS="80").stdout
    rows = [line.split("│")[1].strip() for line in shown.splitlines() if line.startswith("│")]
    assert [name for name in rows if name] == names
    assert max(len(line) for line in shown.splitlines()) <= 80
    mmlu_row = next(line for line in shown.splitlines() if line.startswith("│ mmlu "))
    assert "the hub" not in mmlu_row and "14,042" not in mmlu_row  # the copy's size, not the hub's
    assert str(mmlu_dir)[:8] in mmlu_row


def test_a_quick_look_is_a_job_of_its_own_left_out_of_the_model_s_curves(cli: Posbias) -> None:
    cli("db", "upgrade")
    full = cli("run", *FAKE, "--batch-sizes", "1,5", "--iterations", "12", "--json").json()
    look = cli("run", *FAKE, "--batch-sizes", "1,5", "--iterations", "12", "--limit", "3", "--json").json()

    assert look["job_id"] != full["job_id"]
    shown = cli("status", str(look["job_id"]))
    assert "quick look: the first 3 trials of each batch size" in shown.stdout
    record = cli("status", str(look["job_id"]), "--json").json()
    assert record["quick_look"] == 3 and record["trials_total"] == 6
    listed = cli("status").stdout
    assert "fake (quick look)" in listed
    pooled = cli("curve", "--model", "fake", "--batch-size", "1", "--format", "json").json()
    alone = cli("curve", "--job", str(look["job_id"]), "--batch-size", "1", "--format", "json").json()
    assert [p["n"] for p in _points(pooled)] == [12]  # the full job's 12 trials, not 15
    assert [p["n"] for p in _points(alone)] == [3]


def _points(curves: Any) -> list[dict[str, Any]]:
    curve = curves[0] if isinstance(curves, list) else curves
    return list(curve["points"])


@pytest.mark.usefixtures("storeless")
def test_run_prints_no_ray_line_on_stderr(posbias: Posbias) -> None:
    """A process of its own, as the README's "No model at hand?" run, with its own local Ray: its stderr holds
    the progress and nothing of Ray's (a first shard at N = 50 made Ray's core worker print an `E` line about
    the actor's constructor arguments). `--verbose` would show Ray's notices."""
    posbias("db", "upgrade")
    done = posbias("run", "--engine", "fake", "--batch-sizes", "50", "--iterations", "20", "--json")
    assert done.json()["status"] == "done"
    assert [line for line in done.stderr.splitlines() if not line.startswith("running ")] == [], done.stderr


@pytest.mark.usefixtures("storeless")
def test_a_misspelled_model_path_is_refused_with_the_near_miss(cli: Posbias, tmp_path: Path) -> None:
    (tmp_path / "models" / "tiny-llama").mkdir(parents=True)
    cli("db", "upgrade")

    refused = cli("submit", "--model", "./models/tiny-lama", "--batch-sizes", "1", check=False)
    assert refused.code == 1
    assert refused.error_lines == [
        "error: model path models/tiny-lama does not exist (did you mean models/tiny-llama?); check the path"
    ]
    assert cli("status", "--json").json() == []


@pytest.mark.usefixtures("storeless")
def test_a_hub_id_nothing_here_can_check_warns_and_goes_on(posbias: Posbias) -> None:
    """A process of its own: the hub client reads HF_HUB_OFFLINE once, at import."""
    posbias("db", "upgrade")
    done = posbias(
        "submit",
        "--model",
        "no-such-owner/no-such-model",
        "--batch-sizes",
        "1",
        "--iterations",
        "2",
        "--json",
        HF_HUB_OFFLINE="1",
    )
    assert done.json()["created"] is True
    warned = [line for line in done.error_lines if line.startswith("warning: cannot check model")]
    assert len(warned) == 1, done.stderr


@pytest.mark.usefixtures("storeless")
def test_help_is_grouped_with_defaults_and_bounds_in_words(cli: Posbias) -> None:
    top = cli("--help").stdout
    for group in ("Jobs:", "Results:", "Models and data:", "Store and schedules:"):
        assert group in top
    submit = cli("submit", "--help", COLUMNS="200").stdout
    groups = ["What to run:", "Design:", "Engine:", "Endpoint (engine openai):", "Fake engine (engine fake):"]
    assert [submit.index(g) for g in groups] == sorted(submit.index(g) for g in groups)
    assert "[default: (100)]" in submit and "[default: (0.25)]" in submit
    status = cli("status", "--help", COLUMNS="200").stdout
    assert "9223372036854775807" not in status and "[at least 1]" in status
    assert "1 to 1,000,000" in status

    dry = cli("run", "--engine", "fake", "--dry-run", check=False)
    assert dry.code == 2 and "posbias submit --dry-run" in dry.stderr


@pytest.mark.usefixtures("storeless")
def test_db_upgrade_says_what_the_version_means(cli: Posbias) -> None:
    said = cli("db", "upgrade").stdout
    assert "is ready: its schema is this posbias's newest" in said


@pytest.mark.usefixtures("storeless")
def test_a_tiny_model_to_try_variants_on(cli: Posbias, tmp_path: Path) -> None:
    built = cli("models", "build-tiny", "gemma2", "tiny", "--json").json()
    folder = Path(built["folder"])
    config = json.loads((folder / "config.json").read_text())
    assert config["sliding_window"] == 64 and config["layer_types"][:2] == [
        "sliding_attention",
        "full_attention",
    ]
    assert (folder / "tokenizer.json").is_file() and (folder / "model.safetensors").is_file()
    again = cli("models", "build-tiny", "gemma2", "tiny", check=False)
    assert again.code == 1 and "is not an empty folder" in again.stderr

    cli("db", "upgrade")
    dry = cli(
        "submit",
        "--model",
        "tiny",
        "--batch-sizes",
        "1",
        "--iterations",
        "2",
        "--variant",
        "baseline",
        "--variant",
        "global-only",
        "--dry-run",
    )
    assert "global-only" in dry.stdout and "warning" not in dry.stderr


@pytest.mark.usefixtures("storeless")
def test_serve_starts_the_installed_vllm_the_way_this_environment_can(cli: Posbias, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    shown = cli("serve", "m", "--port", "8011", "--print-command", "--json", POSBIAS_DEVICE="cpu").json()
    assert shown["argv"][1:3] == ["-m", "posbias.workers.vllm_serve"]  # vLLM's server, run to stop clean
    assert shown["base_url"] == "http://127.0.0.1:8011/v1"
    assert shown["argv"][-3:] == ["--dtype", "float32", "--enforce-eager"]  # the CPU build's settings
    missing = cli("serve", "./mm", check=False)
    assert missing.code == 1 and "did you mean m?" in missing.stderr


@pytest.mark.vllm
@pytest.mark.usefixtures("storeless")
def test_serve_stops_clean_on_ctrl_c(tmp_path: Path) -> None:
    """`posbias serve` on a tiny model, stopped as Ctrl-C stops it (SIGINT to its whole process group): what
    it prints from then on is uvicorn's three shutdown lines, with no "leaked shared_memory objects" from
    Python's resource tracker and no "nanobind: leaked" from triton; and no library warning before."""
    import signal
    import sys
    import time

    import httpx
    from support.ports import free_port
    from support.tinymodels import tiny_model

    port = free_port()
    log = tmp_path / "serve.log"
    args = [sys.executable, "-m", "posbias.cli", "serve", str(tiny_model(architecture="llama"))]
    args += ["--port", str(port), "--max-model-len", "1024"]
    env = {**os.environ, "POSBIAS_DEVICE": "cpu", "POSBIAS_CPU_KVCACHE_GIB": "1"}
    with log.open("wb") as sink:
        server = subprocess.Popen(
            args, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    group = server.pid
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert server.poll() is None, log.read_text()[-3000:]
        started = len(log.read_text().splitlines())
        os.killpg(group, signal.SIGINT)
        server.wait(timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the resource tracker outlives the server for a moment
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    everything = log.read_text().splitlines()
    said = everything[started:]
    assert server.returncode == 0, said
    assert [line for line in said if "leaked" in line or "Warning" in line] == [], "\n".join(said)
    warned = [line for line in everything if re.match(r"\S+:\d+: \w*Warning: ", line)]
    assert warned == [], warned  # no Python library warning on start either


@pytest.mark.usefixtures("ray_session")
def test_schedule_tick_run_is_one_ci_step(cli: Posbias, tmp_path: Path) -> None:
    cli("db", "upgrade")
    for name in ("checkpoint-1", "checkpoint-2"):
        folder = tmp_path / "ckpts" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (folder / "model.safetensors").write_bytes(b"weights")
    template = {"engine": {"name": "fake"}, "batch_sizes": [3], "iterations": 20}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(template))
    cli("schedule", "add", "ci", "--folder", "ckpts", "--spec", "spec.yaml", "--max-drop", "30")

    step = cli("schedule", "tick", "ci", "--run", "--fail-on-regression", "--json").json()
    assert len(step["ran_jobs"]) == 2
    verdicts = {s["checkpoint"]: s["verdict"] for s in step["schedules"][0]["settled"]}
    assert verdicts == {"checkpoint-1": "baseline", "checkpoint-2": "pass"}
