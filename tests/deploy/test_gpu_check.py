"""`scripts/gpu-check.sh` as far as a CPU can check it: it passes shellcheck, and its `--dry-run` builds the
tiny models it would load (Gemma 2 with head size 256) and names the jobs it would run through posbias's own
checks. The GPU run itself has not happened on the machines posbias is built on."""

from __future__ import annotations

import os
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
