"""The README is the front door and docs/ the manual: every command either shows must exist with the flags it
shows (some run for real), their SQL must run on both stores, their links must lead somewhere, and CI must run
the README's test command. docs/cli-reference.md is generated from `--help` and checked by
tests/e2e/test_cli_reference.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text
from support.in_process import run_cli
from typer.testing import CliRunner

from posbias.cli.app import app
from posbias.service.store import database
from posbias.service.work.submission import SAMPLE_TRIALS

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
GUIDES = sorted(path for path in (REPO / "docs").glob("*.md") if path.name != "cli-reference.md")
PAGES = {path.relative_to(REPO).as_posix(): path.read_text() for path in [REPO / "README.md", *GUIDES]}
"""The README and every guide in docs/ (not the generated reference), by path: what a user reads, copies."""
BLOCKS = [block for text_ in PAGES.values() for block in re.findall(r"```(\w*)\n(.*?)```", text_, flags=re.S)]


def readme_commands() -> list[list[str]]:
    """Every `posbias ...` command in the shell blocks of the README and the guides, without comments."""
    commands = []
    for language, body in BLOCKS:
        if language not in ("", "sh", "bash"):
            continue
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("posbias "):
                commands.append(shlex.split(line)[1:])
    return commands


def subcommand(words: list[str]) -> list[str]:
    """The command path of `words`: `db upgrade`, `curve`, ..."""
    return words[:2] if words[0] in {"db", "schedule"} else words[:1]


def test_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [body.strip() for language, body in re.findall(r"```(\w*)\n(.*?)```", quick, flags=re.S)]
    assert commands == ["scripts/demo.sh", "scripts/test.sh"]
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert "posbias run --model demo" in (REPO / "scripts" / "demo.sh").read_text()


@pytest.mark.parametrize("words", readme_commands(), ids=lambda words: " ".join(words)[:60])
def test_every_readme_command_exists_with_its_flags(words: list[str]) -> None:
    path = subcommand(words)
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    for flag in (w.split("=", 1)[0] for w in words if w.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", shown.output), (
            f"{flag} not in {path} --help"
        )


def test_the_quoted_schema_revision_is_the_newest_migration(tmp_path: Path) -> None:
    """The README quotes what `posbias db upgrade` says of a fresh store: the line must be the command's own,
    its revision the newest migration (a new migration makes this fail until the README says so)."""
    from posbias.service.store import schema_version

    quoted = [
        line
        for page in PAGES.values()
        for line in re.findall(r"`(the store sqlite:///posbias\.db is\s+ready: [^`]*)`", page)
    ]
    assert len(quoted) == 1, quoted
    line = " ".join(quoted[0].split())
    (revision,) = re.findall(r"newest \((\d{4})\)", line)
    assert (
        revision
        == schema_version.head()
        == max(path.name[:4] for path in (REPO / "migrations" / "versions").glob("[0-9]*.py"))
    )
    done = run_cli(["db", "upgrade"], env={"COLUMNS": "200"}, folder=tmp_path, drop_prefix="POSBIAS_")
    assert done.code == 0 and line in " ".join(done.stdout.split()), done.stdout


def readme_sql() -> list[str]:
    return [body for language, body in BLOCKS if language == "sql"]


def test_readme_sql_runs_on_the_store(cli: Any, store_url: str) -> None:
    posbias = cli  # in this process, the run on the session's Ray: the SQL is the point, not a process
    queries = readme_sql()
    assert len(queries) == 2
    posbias("db", "upgrade")
    # The fake engine under the README's model name: its accuracy rises from 0.2 to 0.8 across positions.
    posbias(
        "run",
        "--engine",
        "fake",
        "--model",
        "google/gemma-2-2b-it",
        "--fake-first",
        "0.2",
        "--fake-last",
        "0.8",
        "--batch-sizes",
        "10,50",
        "--iterations",
        "30",
        "--json",
    )
    with database.connect(store_url) as db, db.read() as session:
        curve = session.execute(text(queries[0])).all()
        distance = session.execute(text(queries[1])).all()
    assert [row.position for row in curve] == list(range(1, 51))
    assert all(row.n == 30 and row.ci_low <= row.accuracy <= row.ci_high for row in curve)
    assert curve[-1].accuracy > curve[0].accuracy
    assert {row.batch_size for row in distance} == {10, 50}
    assert sum(row.n for row in distance) == 30 * 10 + 30 * 50


def test_the_from_python_example_runs_as_written(tmp_path: Path, mmlu_dir: Path) -> None:
    (example,) = [body for language, body in BLOCKS if language == "python"]
    script = tmp_path / "example.py"
    script.write_text(example)
    env = {
        **os.environ,
        "POSBIAS_DATABASE_URL": f"sqlite:///{tmp_path / 'posbias.db'}",
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_POLL_SECONDS": "0.05",
        "RAY_ADDRESS": "",
    }
    for command in (
        [sys.executable, "-m", "posbias.cli", "db", "upgrade"],
        [sys.executable, str(script)],
    ):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        # Nothing on a user's terminal but what the example prints: no native Ray line (its core worker's
        # "constructor arguments in the object store", a shard of 10 questions a prompt), no library warning.
        assert done.stderr == "", done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[1] == "done 40 trials"
    # The dry run counts the first SAMPLE_TRIALS prompts with the tokenizer and scales their mean to the job:
    # exactly what the run then stored for those prompts.
    with database.connect(env["POSBIAS_DATABASE_URL"]) as db, db.read() as session:
        stored = list(
            session.execute(
                text('SELECT prompt_tokens FROM trials WHERE job_id = 1 ORDER BY "index"')
            ).scalars()
        )
    assert len(stored) == 40 and SAMPLE_TRIALS < 40
    assert int(lines[0]) == round(statistics.fmean(stored[:SAMPLE_TRIALS]) * 40)
    assert abs(int(lines[0]) - sum(stored)) < 0.05 * sum(stored)
    table = "\n".join(lines[2:])
    assert "position" in table and "ci_low" in table
    # Two jobs of one spec hold the same trials, and the fake engine answers a prompt the same way each time.
    diffs = [line.split()[-1] for line in lines if line.split() and line.split()[0].isdigit()][-10:]
    assert diffs == ["0.0"] * 10, done.stdout


# --- the README's commands run for real, on the fake engine, into SQLite ---------------------------------
#
# Every command runs in this process; the worker runs two jobs on the session's Ray.

GEMMA_LIKE = next(words for words in readme_commands() if "fake/gemma-like" in words)
# Architecture variants need vLLM (the fake has no architecture to change); the fake's own variants change
# its curve, which is what `compare A:V A:W` and a variant dry run show the same way.
VARIANTS = {
    "model": "fake/gemma-like",
    "engine": {"name": "fake"},
    "fake": {"depends_on": "token-distance", "first": 0.65, "last": 0.35, "window": 1000},
    "batch_sizes": [10],
    "iterations": 5,  # 5 sets x 2 variants at each filler length: the dry run's sample is the whole job
    "answer_order": "random",
    "filler": {"tokens": [0, 800]},
    "variants": ["baseline", {"name": "late-drop", "fake": {"last": 0.1}}],
}


FEW_SETS = "too few for the cluster bootstrap"
"""compare's one warning line for the variants job's 5 sampled sets (fewer than the 16 its band needs)."""


def in_process(monkeypatch: pytest.MonkeyPatch, folder: Path, *args: str) -> str:
    """`posbias ARGS` in this process, in `folder`, set up as a process would be (`run_cli`: its consoles'
    width from COLUMNS, whatever ran before in this process); its stdout. It must succeed and say nothing on
    stderr but, for `compare`, its one warning that the job has too few sampled sets."""
    done = run_cli(args, env=dict(os.environ), folder=folder)
    said = done.stderr.splitlines()
    allowed = said == [] or (args[0] == "compare" and len(said) == 1 and said[0].startswith("warning: only"))
    assert done.code == 0 and allowed and all(FEW_SETS in line for line in said), (args, done.stderr)
    return done.stdout


def test_the_readme_commands_run_and_say_what_it_shows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mmlu_dir: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'posbias.db'}"
    env = {
        "POSBIAS_DATABASE_URL": url,
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_CACHE_DIR": str(tmp_path / "cache"),
        "POSBIAS_POLL_SECONDS": "0.05",
        "COLUMNS": "200",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def posbias(*args: str) -> str:
        return in_process(monkeypatch, tmp_path, *args)

    posbias("db", "upgrade")
    assert GEMMA_LIKE[0] == "run"
    gemma = json.loads(posbias("submit", *GEMMA_LIKE[1:], "--json"))["job_id"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(VARIANTS))
    dry_text = posbias("submit", "job.yaml", "--dry-run")
    dry = json.loads(posbias("submit", "job.yaml", "--dry-run", "--json"))
    variants = json.loads(posbias("submit", "job.yaml", "--json"))["job_id"]
    request.getfixturevalue("ray_session")  # the worker dispatches on the session's Ray, in this process
    worker = posbias("worker", "--until-empty", "--json")
    assert json.loads(worker)["trials_done"] == 200 * 2 + 5 * 2 * 2

    # The variant dry run: each variant named with what it changes; per filler length, the prompt lengths,
    # the distances and the share past the window, each what the run then stored.
    assert "2 variants, each answering every trial:" in dry_text
    assert (
        "baseline: the model as published" in dry_text and "late-drop: fake engine with last 0.1" in dry_text
    )
    assert "(the model's sliding window: 1,000 tokens)" in dry_text
    assert "nothing was enqueued (dry run)" in dry_text
    with database.connect(url) as db, db.read() as session:
        for level in dry["designs"]:
            assert level["trials"] <= SAMPLE_TRIALS
            where = {"job": variants, "filler": level["filler_tokens"]}
            prompts = list(
                session.execute(
                    text("SELECT prompt_tokens FROM trials WHERE job_id = :job AND filler_tokens = :filler"),
                    where,
                ).scalars()
            )
            distances = list(
                session.execute(
                    text(
                        "SELECT r.token_distance FROM results r JOIN trials t ON t.id = r.trial_id "
                        "WHERE r.job_id = :job AND t.filler_tokens = :filler"
                    ),
                    where,
                ).scalars()
            )
            assert len(prompts) == level["trials"] == 10
            assert level["mean_prompt_tokens"] == pytest.approx(statistics.fmean(prompts))
            assert level["max_prompt_tokens"] == max(prompts)
            assert (level["min_distance"], level["max_distance"]) == (min(distances), max(distances))
            past = sum(d > 1000 for d in distances) / len(distances)
            assert level["past_window"] == pytest.approx(past, abs=0.005)
            assert f"{level['min_distance']:,} to {level['max_distance']:,}" in dry_text
            assert f"{round(100 * level['past_window'])}% of answers" in dry_text
    assert dry["total_prompt_tokens"] == sum(
        round(d["mean_prompt_tokens"] * d["trials"]) for d in dry["designs"]
    )

    # explain: the fake's cause is token distance, with a step at its window.
    explained = posbias("explain", str(gemma))
    (distance_row,) = [line for line in explained.splitlines() if "token distance, per 1,000 tokens" in line]
    assert distance_row.rstrip(" │┃").endswith("moves the curve")
    assert "sliding window 1,000 tokens, layers 0,2 of 4" in explained
    assert "verdict: Moves the curve: token distance" in explained
    assert (
        "A step down at the sliding window (1,000 tokens)" in explained
        and "which includes the window" in explained
    )

    # curve --by filler-length: a row per length, and the filler's effect.
    by_filler = posbias("curve", "--job", str(gemma), "--by", "filler-length")
    rows = [line.split("│")[1].strip() for line in by_filler.splitlines() if line.startswith("│")]
    assert rows == ["0", "800"]
    assert "longest minus no filler:" in by_filler
    points = json.loads(posbias("curve", "--job", str(gemma), "--by", "filler-length", "--format", "json"))
    (curve,) = points
    accuracy = {p["position"]: p["accuracy"] for p in curve["points"]}  # by filler length
    assert accuracy[800] < accuracy[0]  # 800 more tokens push more answers past the window

    # curve --heatmap: the picture is written, and the curve per filler length is printed beside it.
    heat = posbias("curve", "--job", str(gemma), "--heatmap", "grid.png")
    assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "batch size 10, 800 filler tokens" in heat

    # compare A:V A:W: two variants of one job, paired over every trial.
    compared = posbias("compare", f"{variants}:baseline", f"{variants}:late-drop")
    assert f"job {variants}:late-drop minus job {variants}:baseline - batch size 10" in compared
    assert "paired: all 10 trials matched" in compared
    diff = json.loads(posbias("compare", f"{variants}:baseline", f"{variants}:late-drop", "--json"))
    assert (diff["method"], diff["matched_trials"]) == ("paired", 10)

    def pooled(variant: str) -> list[float]:
        """A variant's accuracy by position over both filler lengths, from its curves."""
        curves = json.loads(
            posbias("curve", "--job", str(variants), "--variant", variant, "--format", "json")
        )
        assert sorted(c["filler_tokens"] for c in curves) == [0, 800]
        by_position = zip(*(c["points"] for c in curves), strict=True)
        return [sum(p["n_correct"] for p in ps) / sum(p["n_parsed"] for p in ps) for ps in by_position]

    base, late = pooled("baseline"), pooled("late-drop")
    assert [p["accuracy_a"] for p in diff["points"]] == pytest.approx(base)
    assert [p["diff"] for p in diff["points"]] == pytest.approx(
        [b - a for a, b in zip(base, late, strict=True)]
    )
    assert min(p["diff"] for p in diff["points"]) < 0  # late-drop's far answers are worse
    posbias("curve", "--job", str(variants), "--variant", "late-drop", "--plot", "late.png")
    assert (tmp_path / "late.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_readme_variant_dry_run_shows_each_variants_layers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mmlu_dir: Path
) -> None:
    """The README's variant submit, as a dry run, on a tiny random Gemma 2 (4 layers, a 64-token window on
    layers 0 and 2) in place of gemma-2-2b-it: read from the model's config, no engine started."""
    from support.tinymodels import build_tiny_model

    (shown,) = [w for w in readme_commands() if "--variant" in w and w[0] == "submit"]
    model = build_tiny_model(tmp_path / "gemma2", architecture="gemma2", max_position_embeddings=65536)
    words = [str(model) if w == "google/gemma-2-2b-it" else w for w in shown]
    monkeypatch.setenv("POSBIAS_DATABASE_URL", f"sqlite:///{tmp_path / 'posbias.db'}")
    monkeypatch.setenv("POSBIAS_MMLU_DIR", str(mmlu_dir))
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    in_process(monkeypatch, tmp_path, "db", "upgrade")
    dry = in_process(monkeypatch, tmp_path, *words, "--dry-run")
    assert "2 variants, each answering every trial:" in dry
    assert "  baseline: the model as published (recorded, not checked)" in dry
    assert "  global-only: 4 global layers; RoPE base 10000" in dry
    assert "nothing was enqueued (dry run)" in dry
    windowed = in_process(monkeypatch, tmp_path, *words[:-2], "--variant", "window:32", "--dry-run")
    assert "  window:32: window 32 on layers 0, 2 of 4; RoPE base 10000" in windowed
    assert "(the model's sliding window: 64 tokens)" in windowed


# --- the front door and the manual --------------------------------------------------------------------------


def test_the_readme_is_a_front_door_with_the_quick_start_s_facts() -> None:
    assert len(README.splitlines()) <= 300
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for fact in (
        "`.env`",
        "`. .venv/bin/activate`",
        "POSBIAS_MMLU_DIR",
        "docs/demo-curve.png",
        "--engine fake",
    ):
        assert fact in quick, fact
    assert "(docs/index.md)" in README


def test_the_index_lists_every_guide() -> None:
    index = PAGES["docs/index.md"]
    for guide in [*GUIDES, REPO / "docs" / "cli-reference.md"]:
        if guide.name != "index.md":
            assert f"]({guide.name})" in index, f"docs/index.md does not link {guide.name}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text_ = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(line.lstrip("#")) for line in text_.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", [*sorted(PAGES), "docs/cli-reference.md"])
def test_every_link_and_picture_leads_somewhere(page: str) -> None:
    """Relative links and image paths, from the README and from docs/, to a file that exists (and, with a
    `#fragment` into Markdown, to a heading it has)."""
    here = (REPO / page).parent
    text_ = re.sub(r"```.*?```", "", (REPO / page).read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text_)
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        path = (here / file).resolve() if file else REPO / page
        assert path.exists(), f"{page}: {target} does not exist"
        if fragment and path.suffix == ".md":
            assert fragment in _anchors(path), f"{page}: no heading #{fragment} in {file or page}"
