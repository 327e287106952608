"""`scripts/gpu-check.sh` as far as a CPU can check it: it passes shellcheck, its `--dry-run` builds the
tiny models it would load (Gemma 2 with head size 256) and names the jobs it would run through posbias's own
checks, and its hf part runs whole with the device set to the CPU (shorter jobs, a smaller window) and
passes. The GPU run itself has not happened on the machines posbias is built on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import REPO

SCRIPT = REPO / "scripts" / "gpu-check.sh"


def test_the_gpu_check_passes_shellcheck_and_is_executable() -> None:
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
        "shellcheck"
    )
    assert shellcheck, "shellcheck not found: pip install -e '.[dev]'"
    done = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert SCRIPT.stat().st_mode & 0o111 and "set -euo pipefail" in SCRIPT.read_text()


@pytest.mark.timeout(600)
def test_its_dry_run_builds_the_tiny_models_and_names_the_jobs_it_would_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSBIAS_")}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=540, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    gemma2 = [line for line in lines if line.startswith("would run gemma2 (head size 256)")]
    assert len(gemma2) == 1 and "variants baseline, global-only, window:32" in gemma2[0], lines
    assert any(line.startswith("would run gemma3: ") for line in lines), lines
    assert any(line.startswith("would run a load that must fail: ") for line in lines), lines
    assert "built gemma2: head_dim 256, layer_types ['sliding_attention', 'full_attention'," in done.stdout
    assert "built gemma3: head_dim 32" in done.stdout
    assert not list(tmp_path.glob("posbias-gpu-check.*")), "its scratch folder is removed"


@pytest.mark.timeout(900)
def test_its_hf_part_runs_on_the_cpu_and_prints_its_comparisons(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSBIAS_")}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "TMPDIR": str(tmp_path),
    }
    command = [str(SCRIPT), "hf", "--device", "cpu", "--tokens", "1024,2048", "--batch-size", "4"]
    done = subprocess.run(
        [*command, "--window", "256"], capture_output=True, text=True, env=env, timeout=840, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout.split("\ncheck ", 1)[1].splitlines()[1:]
    # Columns: the check, its result, its detail, two spaces or more apart.
    results = {
        name: rest for name, *rest in (re.split(r"\s{2,}", line, maxsplit=2) for line in table if line)
    }
    for model in ("gemma2 (head size 256)", "gemma3"):
        for dtype, allowed in (("float32", "0.0001"), ("bfloat16", "0.02")):
            result, detail = results[f"{model} {dtype} on cpu against cpu float32"]
            assert result == "ok" and "masses within" in detail and f"(allowed {allowed};" in detail
            assert results[f"{model} {dtype}: memory after close"] == ["ok", "model object gone"]
    compared = [name for name in results if name.startswith("answer rows against eager at ")]
    assert len(compared) == 2 and all(results[name][0] == "ok" for name in compared), results
    assert "answer rows against eager on cpu, float32" in done.stdout
    assert "| tokens | rows: s | rows: peak | eager: s | eager: peak |" in done.stdout
    assert not list(tmp_path.glob("posbias-gpu-check.*")), "its scratch folder is removed"
