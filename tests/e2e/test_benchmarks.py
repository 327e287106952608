"""The benchmark programs run as benchmarks/README.md shows, at a small size, through to their tables and
ratios. Their figures are not checked: on shared machines timings are noise, and no test asserts one. That
every program still runs, and prints what the README says it prints, is checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
NUMBER = r"[\d,]+(?:\.\d+)?"


def run_benchmark(script: str, *args: str, mmlu_dir: Path, tmp_path: Path) -> str:
    """Run `python benchmarks/SCRIPT ARGS...` from the repository root, as the README does; its stdout."""
    environment = {
        **os.environ,
        "POSBIAS_MMLU_DIR": str(mmlu_dir),
        "POSBIAS_CACHE_DIR": os.environ.get("POSBIAS_TEST_CACHE_DIR", str(tmp_path / "cache")),
        "RAY_ADDRESS": "",
    }
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, (
        f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def readme_invocations(script: str) -> list[list[str]]:
    """The flags of every `python benchmarks/SCRIPT ...` line in benchmarks/README.md."""
    readme = (BENCHMARKS / "README.md").read_text()
    found = []
    for line in readme.splitlines():
        line = line.split("#", 1)[0]
        if f"python benchmarks/{script}" in line:
            words = [word.strip("`'\".,;:()") for word in line.split()]
            found.append([word.split("=", 1)[0] for word in words if word.startswith("--")])
    return found


@pytest.mark.parametrize(
    "script",
    [
        "store.py",
        "dispatch.py",
        "throughput.py",
        "probe_cost.py",
        "coverage.py",
        "fuzz.py",
        "served.py",
        "trial_real.py",
    ],
)
def test_every_flag_the_readme_shows_exists(script: str) -> None:
    invocations = readme_invocations(script)
    assert invocations, f"benchmarks/README.md shows no `python benchmarks/{script}` command"
    shown = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    for flags in invocations:
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", shown.stdout), (
                f"{script} has no {flag}"
            )


@pytest.mark.postgres
def test_store_benchmark_prints_ingest_and_curve_ratios(mmlu_dir: Path, tmp_path: Path) -> None:
    out = run_benchmark(
        "store.py", "--rows", "4000", "--curve-rows", "20000", mmlu_dir=mmlu_dir, tmp_path=tmp_path
    )
    for dialect in ("postgresql", "sqlite"):
        for per_write in ("1", "8"):
            assert re.search(rf"^\s+{dialect}\s+{per_write}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out, re.M), (
                out
            )
        assert re.search(rf"{dialect}: 8 shards per transaction / 1: {NUMBER}x", out), out
        assert re.search(rf"^\s+{dialect}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out, re.M), out
    assert re.search(rf"postgresql / sqlite time: aggregates {NUMBER}x, raw scan {NUMBER}x", out), out


@pytest.mark.postgres
def test_dispatch_benchmark_prints_rates_and_breakdown(mmlu_dir: Path, tmp_path: Path) -> None:
    out = run_benchmark(
        "dispatch.py", "--trials", "400", "--actors", "1", mmlu_dir=mmlu_dir, tmp_path=tmp_path
    )
    end_to_end = out.split("trials/s through one dispatcher, end to end", 1)[1]
    for dialect in ("sqlite", "postgresql"):
        assert re.search(rf"^\s+{dialect}\s+{NUMBER}$", end_to_end, re.M), out
        assert re.search(rf"^\s+{dialect} x1(\s+{NUMBER}%?)+$", out, re.M), out


@pytest.mark.vllm
def test_throughput_benchmark_prints_both_ratios(mmlu_dir: Path, tmp_path: Path) -> None:
    out = run_benchmark(
        "throughput.py",
        *("--setting", "tiny", "--trials", "16", "--hf-trials", "2", "--repeats", "2"),
        mmlu_dir=mmlu_dir,
        tmp_path=tmp_path,
    )
    for way in ("(a) raw vLLM, one call", "(b) posbias end to end", "(c) transformers, one by one"):
        assert re.search(rf"{re.escape(way)}(\s+{NUMBER}){{6}}$", out, re.M), out
    assert re.search(rf"b/a \(trials/s\): {NUMBER}", out), out
    # Two repeats, one in each order: b/a by order, and both orders weighed equally.
    by_order = re.search(rf"b/a by order: ({NUMBER}) with \(b\) second, ({NUMBER}) with \(b\) first", out)
    balanced = re.search(rf"b/a, both orders weighed equally: ({NUMBER})", out)
    assert by_order and balanced, out
    second, first = (float(x) for x in by_order.groups())
    assert float(balanced.group(1)) == pytest.approx((second * first) ** 0.5, abs=1e-3)
    assert re.search(rf"b/c \(trials/s\): {NUMBER}; \(tokens/s\): {NUMBER}", out), out


@pytest.mark.vllm
def test_probe_cost_benchmark_prints_its_ratios(mmlu_dir: Path, tmp_path: Path) -> None:
    from support.tinymodels import tiny_model

    model = tiny_model(architecture="llama")
    out = run_benchmark(
        "probe_cost.py",
        *("--model", str(model), "--batch-size", "4", "--sets", "2", "--repeats", "1"),
        mmlu_dir=mmlu_dir,
        tmp_path=tmp_path,
    )
    # The same 2 sets: 2 prompts of 4 answers in the random design, 8 prompts of one answer in the probe.
    for way, prompts in (("(r) random, one prompt a set", 2), ("(p) probe, prefix cache on", 8)):
        assert re.search(rf"{re.escape(way)}\s+{NUMBER}\s+{prompts}\s+{NUMBER}\s+8$", out, re.M), out
    for ratio in ("p/r", "p0/r"):
        assert re.search(rf"{ratio} \(time for the same sets\): {NUMBER}", out), out
    assert re.search(rf"p0/p \(what the prefix cache saves\): {NUMBER}", out), out


def test_coverage_program_prints_a_rate_per_statistic(mmlu_dir: Path, tmp_path: Path) -> None:
    out = run_benchmark(
        "coverage.py",
        "--reps",
        "3",
        "--only",
        "small-n,paired-identical,verdict-identical",
        mmlu_dir=mmlu_dir,
        tmp_path=tmp_path,
    )
    for setting, statistic in (
        ("small-n", "band"),
        ("paired-identical", "paired: identical called different"),
        ("verdict-identical", "verdict: identical flagged"),
    ):
        assert re.search(rf"^{setting}\s+{re.escape(statistic)}\s+{NUMBER}\s+{NUMBER}-{NUMBER}", out, re.M), (
            out
        )


def test_mechanism_coverage_program_prints_coverage_and_calls(mmlu_dir: Path, tmp_path: Path) -> None:
    out = run_benchmark(
        "mechanism_coverage.py",
        "--reps",
        "3",
        "--only",
        "window-none,gap-decay",
        mmlu_dir=mmlu_dir,
        tmp_path=tmp_path,
    )
    for setting, statistic in (
        ("window-none", "sliding AUROC covers the truth (0.5"),
        ("window-none", "window ruled out"),
        ("gap-decay", "gap change covers the truth (-40%)"),
        ("gap-decay", "RoPE implicated"),
    ):
        assert re.search(
            rf"^{setting}\s+{re.escape(statistic)}.*\s+{NUMBER}\s+{NUMBER}-{NUMBER}", out, re.M
        ), out


@pytest.mark.vllm
def test_served_benchmark_prints_its_ratios(mmlu_dir: Path, tmp_path: Path) -> None:
    out = run_benchmark(
        "served.py",
        *("--setting", "tiny", "--trials", "4", "--concurrency", "1,4", "--repeats", "1"),
        mmlu_dir=mmlu_dir,
        tmp_path=tmp_path,
    )
    assert re.search(rf"\(a\) in-process, one call\s+{NUMBER}\s+{NUMBER}$", out, re.M), out
    for level in (1, 4):
        assert re.search(rf"\(b\) served, {level} in flight\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x$", out, re.M), (
            out
        )
    assert "same answers served and in-process: yes" in out, out
