"""The reaper: a small process that ends the Ray processes a dispatcher started once the dispatcher is gone.

`ray.init(address="local")` starts a GCS server, a raylet and their agents as this process's children. When
the dispatcher exits normally, `ray.shutdown` stops them; when it is killed (the OOM killer takes the
driver, not its helpers), some of them outlive it. `watch` starts the reaper with a pipe from the dispatcher;
the pipe closes when the dispatcher's process ends, however it ends, and the reaper then kills what is left
of the processes it was given and of their descendants (which it keeps tracking meanwhile, since a process
orphaned by its parent's death can no longer be found as a descendant).

Run as `python -m posbias.service.dispatch.reaper`; it reads `pid start-time` lines on standard input.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from typing import IO

import psutil

POLL_SECONDS = 1.0
"""How often the reaper looks for new descendants of the processes it guards."""
GRACE_SECONDS = 3.0
"""How long processes get to exit after SIGTERM before SIGKILL."""

_watcher: subprocess.Popen[bytes] | None = None
"""The reaper of this process (kept referenced for the process's life: its pipe must stay open)."""


def watch(pids: list[int]) -> None:
    """Start a reaper that ends `pids` and their descendants once this process has ended."""
    global _watcher
    if not pids:
        return
    lines = []
    for pid in pids:
        try:
            lines.append(f"{pid} {psutil.Process(pid).create_time()!r}\n")
        except psutil.Error:
            continue
    watcher = subprocess.Popen(
        [sys.executable, "-m", "posbias.service.dispatch.reaper"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the dispatcher's process group leaves the reaper running
        close_fds=True,
    )
    assert watcher.stdin is not None
    watcher.stdin.write("".join(lines).encode() + b"\n")
    watcher.stdin.flush()
    _watcher = watcher


def children() -> list[int]:
    """This process's descendants now."""
    try:
        return [child.pid for child in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def _guard(stream: IO[bytes]) -> None:
    """Read the processes to guard, track their descendants until `stream` ends, then end them all."""
    guarded: dict[int, float] = {}
    header = b""
    fd = stream.fileno()
    while not header.endswith(b"\n\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        header += chunk
    for line in header.decode().split("\n"):
        parts = line.split()
        if len(parts) == 2:
            guarded[int(parts[0])] = float(parts[1])
    while True:
        _track(guarded)
        ready, _, _ = select.select([fd], [], [], POLL_SECONDS)
        if ready and not os.read(fd, 4096):
            break  # the dispatcher is gone
    _end(guarded)


def _track(guarded: dict[int, float]) -> None:
    for pid, started in list(guarded.items()):
        process = _same(pid, started)
        if process is None:
            continue
        try:
            for child in process.children(recursive=True):
                guarded.setdefault(child.pid, child.create_time())
        except psutil.Error:
            continue


def _same(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is still the one that started at `started` (pids are reused)."""
    try:
        process = psutil.Process(pid)
        return process if process.create_time() == started else None
    except psutil.Error:
        return None


def _end(guarded: dict[int, float]) -> None:
    _track(guarded)
    alive = [p for pid, started in guarded.items() if (p := _same(pid, started)) is not None]
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, left = psutil.wait_procs(alive, timeout=GRACE_SECONDS)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()


if __name__ == "__main__":
    _guard(sys.stdin.buffer)
